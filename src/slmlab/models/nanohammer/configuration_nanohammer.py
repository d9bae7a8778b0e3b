"""NanoHammer configuration (seed 003)."""

from __future__ import annotations

from transformers import PretrainedConfig

from ...layers.attention import check_head_layout
from ..registry import InitOnly, KeepsSavedKeys, accept_keywords, check_positive_ints, config_signature, is_positive_int

ROTATION_STYLES = ("rotation", "seed")
# The seed's `rope_scaling` keyword (only None is supported): taken, never stored; a class attribute of that
# name would hide transformers' `rope_scaling` property.
INIT_ONLY_KEYWORDS = {"rope_scaling": InitOnly(None, "dict | None", after="rope_theta")}


@config_signature(INIT_ONLY_KEYWORDS)
class NanoHammerConfig(KeepsSavedKeys, PretrainedConfig):
    """A Llama-style decoder whose hidden tokens also attend to per-position "state tokens" made from a
    rotated cumulative sum of the token embeddings (see :mod:`.modeling_nanohammer`).

    Every keyword of the seed's ``NanoHammerConfig`` is accepted under its own name and default. The
    seed's defects are fixed: ``state_hidden_size`` defaults to the integer ``hidden_size // 4`` (the
    seed stored the float ``hidden_size / 4``); an ``auto_map`` (written by the seed, or by slmlab's
    remote-code export, for ``trust_remote_code``) is kept as transformers keeps it, so a loaded export
    saves again with its entry points. Typed, as every family config: the fields are annotated class
    attributes, checked (and the derived defaults resolved) in ``__post_init__``.

    Args:
        vocab_size: 128256.
        hidden_size: model width ``d`` (2048).
        intermediate_size: SwiGLU inner width (8192).
        num_hidden_layers: decoder blocks (24).
        num_attention_heads: query heads ``H`` (32).
        num_key_value_heads: key/value heads ``H_kv`` (8, GQA).
        num_state_heads: heads of the state update cell, each with its own Euler step (32).
        state_hidden_size: state width ``S`` (default ``hidden_size // 4``); an integer (an integral
            float from a seed config.json is accepted), even, divisible by ``num_state_heads``.
        max_position_embeddings: longest sequence (cached + new tokens) accepted (131072).
        rms_norm_eps: 1e-5.
        initializer_range: std of the normal init (0.02).
        use_cache: return a decoding cache from ``forward`` by default (True).
        tie_word_embeddings: share the embedding table with the LM head (False).
        rope_theta: RoPE base of the attention (10000.0).
        rope_scaling: only ``None`` (plain RoPE) is supported.
        attention_bias: bias on the q/k/v/o projections, as in transformers' Llama (False).
        attention_dropout: attention-probability dropout in training (0.0).
        mlp_bias: bias on the SwiGLU projections (False).
        hidden_act: only ``"silu"`` (the seed's default; SwiGLU).
        bos_token_id / eos_token_id / pad_token_id: 128000 / 128009 / None (the two defaults become None
            when ``vocab_size`` is too small to hold them).
        head_dim: attention head size (default ``hidden_size // num_attention_heads``).
        state_rope_base: base of the holographic rotation frequencies (10000, fixed in the seed).
        rotation_style: ``"rotation"`` (a true per-pair rotation, the intended maths) or ``"seed"``
            (the seed's non-orthogonal map and its non-inverse, for checkpoints trained with it).
        hidden_attends_self: hidden token ``i`` attends to hidden tokens ``<= i`` (True, standard
            causal attention) or ``< i`` only (False, the seed's prefill mask).
    """

    model_type = "nanohammer"

    vocab_size: int = 128256
    hidden_size: int = 2048
    intermediate_size: int = 8192
    num_hidden_layers: int = 24
    num_attention_heads: int = 32
    num_key_value_heads: int = 8
    num_state_heads: int = 32
    state_hidden_size: int | None = None  # None -> hidden_size // 4
    max_position_embeddings: int = 131072
    rms_norm_eps: float = 1e-5
    initializer_range: float = 0.02
    use_cache: bool = True
    tie_word_embeddings: bool = False
    rope_theta: float = 10000.0
    attention_bias: bool = False
    attention_dropout: float = 0.0
    mlp_bias: bool = False
    hidden_act: str = "silu"
    bos_token_id: int | None = 128000  # None in a vocabulary too small to hold it
    eos_token_id: int | None = 128009  # the same
    pad_token_id: int | None = None
    head_dim: int | None = None  # None -> hidden_size // num_attention_heads
    state_rope_base: float = 10000.0
    rotation_style: str = "rotation"
    hidden_attends_self: bool = True

    def __post_init__(self, **kwargs):
        """Called by the generated ``__init__`` once the fields are assigned, with the keywords that are not
        fields: checks the fields and resolves the derived defaults (``head_dim``, ``state_hidden_size``, the
        token ids), then runs transformers' post-init and validators. An unknown keyword (a typo) raises
        ``ValueError`` with "did you mean" (:func:`reject_unknown_keys`)."""
        accept_keywords(self, kwargs)
        rope_scaling = kwargs.pop("rope_scaling", INIT_ONLY_KEYWORDS["rope_scaling"].default)
        check_positive_ints(self, ("vocab_size", "hidden_size", "intermediate_size", "num_hidden_layers",
                                   "num_state_heads", "max_position_embeddings"))
        self.head_dim = check_head_layout(self.hidden_size, self.num_attention_heads, self.num_key_value_heads,
                                          self.head_dim)
        if self.head_dim % 2:
            raise ValueError(f"attention head_dim ({self.head_dim}) must be even for RoPE")
        self.state_hidden_size = self._resolve_state_hidden_size()
        self._check_options(rope_scaling)
        self.hidden_attends_self = bool(self.hidden_attends_self)
        # The seed's ids are Llama 3's (128000 / 128009): kept where the vocabulary holds them, None in a
        # smaller one (a tiny preset, a compare budget, a synthetic task), where they would name no token.
        if self.bos_token_id == 128000 and self.vocab_size <= self.bos_token_id:
            self.bos_token_id = None
        if self.eos_token_id == 128009 and self.vocab_size <= self.eos_token_id:
            self.eos_token_id = None
        super().__post_init__(**kwargs)
        self.validate()  # transformers' class validators, as its own __init__ runs them

    def _resolve_state_hidden_size(self) -> int:
        """``hidden_size // 4`` when not given; an integral float (a seed config.json) as an int; then checked."""
        size = self.hidden_size // 4 if self.state_hidden_size is None else self.state_hidden_size
        if isinstance(size, float) and size.is_integer():
            size = int(size)
        if not is_positive_int(size):
            raise ValueError(f"state_hidden_size must be a positive integer, got {size!r}")
        if size % self.num_state_heads:
            raise ValueError(f"state_hidden_size ({size}) must be divisible by num_state_heads ({self.num_state_heads})")
        if size % 2:
            raise ValueError(f"state_hidden_size ({size}) must be even (channels rotate in pairs)")
        return size

    def _check_options(self, rope_scaling: dict | None) -> None:
        if rope_scaling is not None:
            raise ValueError(f"rope_scaling={rope_scaling!r} is not supported by NanoHammer; use None (plain RoPE)")
        if self.hidden_act != "silu":
            raise ValueError(
                f"hidden_act={self.hidden_act!r} is not supported; NanoHammer's MLP is SwiGLU (hidden_act='silu')"
            )
        if self.rotation_style not in ROTATION_STYLES:
            raise ValueError(f"rotation_style must be one of {ROTATION_STYLES}, got {self.rotation_style!r}")
        if not 0.0 <= self.attention_dropout < 1.0:
            raise ValueError(f"attention_dropout must be in [0, 1), got {self.attention_dropout!r}")
        if self.rms_norm_eps <= 0:
            raise ValueError(f"rms_norm_eps must be positive, got {self.rms_norm_eps!r}")
