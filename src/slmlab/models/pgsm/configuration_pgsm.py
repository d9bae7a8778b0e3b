"""PGSM configuration (seed 001): every field of the seed's ``PGSMConfig``, as a transformers config."""

from __future__ import annotations

import inspect
from typing import Any

from transformers import PretrainedConfig

from ..registry import InitOnly, KeepsSavedKeys, accept_keywords, check_positive_ints, config_signature

ROPE_LAYOUTS = ("rotate_half", "seed")
# The seed's `tie_weights` keyword is the property of that name (over `tie_word_embeddings`, the one stored
# switch): taken in __post_init__, never a field.
INIT_ONLY_KEYWORDS = {"tie_weights": InitOnly(None, "bool | None", after="retrieve_at_last_token_if_unspecified")}

# The seed's named sizes, as a table (model code never reads a preset's name): each row is what the
# seed's ``PGSMConfig.<size>()`` classmethod writes before the caller's overrides, ``block_size``
# being the classmethod's default. ``medium`` and ``large`` have no vocabulary default in the seed;
# here they fall back to the config default (256) when built from the table alone.
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


@config_signature(INIT_ONLY_KEYWORDS)
class PGSMConfig(KeepsSavedKeys, PretrainedConfig):
    """Parallel Geometric State Model with an optional query-only sparse RoPE retriever.

    Every field of the seed's ``PGSMConfig`` is accepted under its own name and default; the
    transformers names (``hidden_size``, ``num_hidden_layers``, ``intermediate_size``,
    ``max_position_embeddings``, ``initializer_range``) are aliases of the same values. Typed, as every
    family config: the fields are annotated class attributes, checked in ``__post_init__``.

    Args:
        vocab_size: 256.
        block_size: longest sequence (cached + new tokens) the model accepts (1024).
        dim: model width ``D`` (192).
        layers: number of backbone blocks (3).
        hidden: inner width of the SiLU-gated MLP (384).
        kernel_size: causal depthwise conv width ``K`` (17).
        dropout: dropout on the two residual branches of a block (0.0).
        use_sparse_retrieval: build the retriever (and the post-retrieval block) (True).
        retrieval_dim: width of the retriever's Q/K/V (512); divisible by ``retrieval_heads``, and the
            head dimension must be even for RoPE.
        retrieval_heads: 4.
        retrieval_dropout: dropout on the retrieval attention weights (0.0).
        query_token_id: token id that marks a query (None).
        auto_retrieve_on_query_token: without explicit positions, retrieve at the last query token of
            each row (or its last token when the row has none) (False).
        retrieve_at_last_token_if_unspecified: without explicit positions (and without auto
            detection), retrieve at the last token of every forward call (False).
        tie_weights: share the embedding table with the LM head (True); ``tie_word_embeddings`` is
            accepted as its transformers name.
        use_post_retrieval_block: one more backbone block after the retriever (True).
        ignore_index: label ignored by the loss (-100).
        init_std: std of the normal init of Linear/Embedding weights (0.02).
        rope_layout: how the retriever pairs RoPE channels. ``"rotate_half"`` (default) is a true
            rotation of channel pairs ``(j, j + d/2)`` by ``p·θ_j``. ``"seed"`` reproduces the seed
            exactly (for its checkpoints): it pairs ``(2j, 2j+1)`` but turns the two members by
            different frequencies, which is not a rotation (norms change by 0.86-1.09 on a random
            input) and makes scores depend on absolute, not only relative, positions.
        use_cache: return a decoding cache from ``forward`` by default (True).
    """

    model_type = "slm_pgsm"
    attribute_map = {
        "hidden_size": "dim",
        "num_hidden_layers": "layers",
        "intermediate_size": "hidden",
        "max_position_embeddings": "block_size",
        "initializer_range": "init_std",
    }

    vocab_size: int = 256
    block_size: int = 1024
    dim: int = 192
    layers: int = 3
    hidden: int = 384
    kernel_size: int = 17
    dropout: float = 0.0
    use_sparse_retrieval: bool = True
    retrieval_dim: int = 512
    retrieval_heads: int = 4
    retrieval_dropout: float = 0.0
    query_token_id: int | None = None
    auto_retrieve_on_query_token: bool = False
    retrieve_at_last_token_if_unspecified: bool = False
    use_post_retrieval_block: bool = True
    ignore_index: int = -100
    init_std: float = 0.02
    rope_layout: str = "rotate_half"
    use_cache: bool = True

    def __post_init__(self, **kwargs):
        """Called by the generated ``__init__`` once the fields are assigned, with the keywords that are not
        fields: resolves the tying switch from ``tie_weights`` / ``tie_word_embeddings``, checks the fields,
        then runs transformers' post-init and validators. An unknown keyword (a typo) raises ``ValueError``
        with "did you mean" (:func:`reject_unknown_keys`)."""
        accept_keywords(self, kwargs)
        tie_weights = kwargs.pop("tie_weights", INIT_ONLY_KEYWORDS["tie_weights"].default)
        hf_tie = kwargs.pop("tie_word_embeddings", None)  # the transformers name of the same switch
        if tie_weights is not None and hf_tie is not None and bool(hf_tie) != bool(tie_weights):
            raise ValueError(f"tie_weights={tie_weights!r} contradicts tie_word_embeddings={hf_tie!r}; pass one of them")
        self.tie_weights = bool(tie_weights if tie_weights is not None else (hf_tie if hf_tie is not None else True))
        self._validate()
        # bos/eos/pad ids: None until `slmlab train` records its tokenizer's (so generate() stops at eos)
        super().__post_init__(**{"bos_token_id": None, "eos_token_id": None, "pad_token_id": None, **kwargs})
        self.validate()  # transformers' class validators, as its own __init__ runs them

    @property
    def tie_weights(self) -> bool:
        """The seed's name of ``tie_word_embeddings``: one stored switch (``config.json`` keeps only
        ``tie_word_embeddings``), so setting either name unties or ties, and the config saves and
        loads back whatever it was built with."""
        return bool(self.tie_word_embeddings)

    @tie_weights.setter
    def tie_weights(self, value: bool) -> None:
        self.tie_word_embeddings = bool(value)

    def _validate(self) -> None:
        check_positive_ints(self, ("vocab_size", "block_size", "dim", "layers", "hidden", "kernel_size"))
        for name in ("dropout", "retrieval_dropout"):
            if not 0.0 <= float(getattr(self, name)) < 1.0:
                raise ValueError(f"{name} must be in [0, 1), got {getattr(self, name)!r}")
        if self.rope_layout not in ROPE_LAYOUTS:
            raise ValueError(f"rope_layout must be one of {ROPE_LAYOUTS}, got {self.rope_layout!r}")
        if self.query_token_id is not None and not 0 <= int(self.query_token_id) < self.vocab_size:
            raise ValueError(f"query_token_id={self.query_token_id!r} is outside the vocabulary [0, {self.vocab_size})")
        if self.use_sparse_retrieval:
            # The seed raises these when it builds its retriever (only when retrieval is on).
            if self.retrieval_heads <= 0 or self.retrieval_dim <= 0:
                raise ValueError(
                    f"retrieval_dim and retrieval_heads must be positive, got {self.retrieval_dim!r}, {self.retrieval_heads!r}"
                )
            if self.retrieval_dim % self.retrieval_heads != 0:
                raise ValueError(
                    "retrieval_dim must be divisible by retrieval_heads "
                    f"(retrieval_dim={self.retrieval_dim}, retrieval_heads={self.retrieval_heads})"
                )
            if (self.retrieval_dim // self.retrieval_heads) % 2 != 0:
                raise ValueError(
                    "retrieval_dim / retrieval_heads must be even for RoPE "
                    f"(retrieval_dim={self.retrieval_dim}, retrieval_heads={self.retrieval_heads})"
                )

    @property
    def head_dim(self) -> int:
        """Per-head width of the retriever."""
        return self.retrieval_dim // self.retrieval_heads

    @classmethod
    def from_size(cls, size: str, vocab_size: int = 256, block_size: int | None = None, **overrides: Any) -> PGSMConfig:
        """A named size (``tiny``/``small``/``medium``/``large``) with the seed's override semantics:
        the preset's values first, then ``vocab_size``/``block_size``, then ``overrides`` (which must
        name config fields)."""
        key = size.lower().strip()
        if key not in SIZE_PRESETS:
            raise ValueError(f"Unknown model size: {size!r}. Use tiny, small, medium, or large.")
        unknown = sorted(set(overrides) - set(_FIELDS))
        if unknown:
            raise TypeError(f"unknown PGSMConfig field(s) {unknown}; known fields: {sorted(_FIELDS)}")
        values = dict(SIZE_PRESETS[key], vocab_size=vocab_size)
        if block_size is not None:
            values["block_size"] = block_size
        return cls(**{**values, **overrides})

    @classmethod
    def tiny(cls, vocab_size: int = 256, block_size: int = 512, **overrides: Any) -> PGSMConfig:
        return cls.from_size("tiny", vocab_size, block_size, **overrides)

    @classmethod
    def small(cls, vocab_size: int = 256, block_size: int = 1024, **overrides: Any) -> PGSMConfig:
        return cls.from_size("small", vocab_size, block_size, **overrides)

    @classmethod
    def medium(cls, vocab_size: int, block_size: int = 2048, **overrides: Any) -> PGSMConfig:
        return cls.from_size("medium", vocab_size, block_size, **overrides)

    @classmethod
    def large(cls, vocab_size: int, block_size: int = 4096, **overrides: Any) -> PGSMConfig:
        return cls.from_size("large", vocab_size, block_size, **overrides)


# The seed's keywords (every field, and `tie_weights`), in its order: what `from_size` overrides may name.
_FIELDS = tuple(name for name in inspect.signature(PGSMConfig.__init__).parameters if name not in ("self", "kwargs"))
