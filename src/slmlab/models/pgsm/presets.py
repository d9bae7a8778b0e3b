"""The seed's named PGSM sizes, as a table (model code never reads a preset's name).

Each row is the set of config values the seed's ``PGSMConfig.<size>()`` classmethod writes before
applying the caller's overrides; ``block_size`` is the classmethod's default. ``medium`` and
``large`` have no vocabulary default in the seed (the caller must give one); here they fall back
to the config default (256) when built from the table alone.
"""

from __future__ import annotations

SIZE_PRESETS: dict[str, dict] = {
    "tiny": dict(block_size=512, dim=128, layers=3, hidden=256, kernel_size=17, retrieval_dim=256, retrieval_heads=4),
    "small": dict(block_size=1024, dim=192, layers=3, hidden=384, kernel_size=17, retrieval_dim=512, retrieval_heads=4),
    "medium": dict(
        block_size=2048, dim=384, layers=6, hidden=1024, kernel_size=21, retrieval_dim=768, retrieval_heads=8,
        dropout=0.0, retrieval_dropout=0.0,
    ),
    "large": dict(
        block_size=4096, dim=768, layers=12, hidden=2048, kernel_size=25, retrieval_dim=1024, retrieval_heads=8,
        dropout=0.0, retrieval_dropout=0.0,
    ),
}
