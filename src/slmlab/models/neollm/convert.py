"""How NeoLLM leaves slmlab (:data:`EXPORT`): transformers and llama.cpp implement none of NeoLLM's
switchable mechanisms, so ``--to hf`` writes remote code (the model's own source beside the weights)
and there is no ``--to gguf``."""

from __future__ import annotations

from ..export_info import ExportInfo

EXPORT = ExportInfo(
    display_name="NeoLLM",
    hf_reason="transformers has none of NeoLLM's switchable mechanisms (SiameseNorm, IHA, REPO-GRAPE, ...)",
)
