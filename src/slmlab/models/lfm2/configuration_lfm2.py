"""LFM2Small configuration (seed 004): the LFM2 backbone as a general causal language model."""

from __future__ import annotations

import logging
from pathlib import Path

import yaml
from transformers import PretrainedConfig

from ...layers.attention import check_head_layout
from ..registry import InitOnly, KeepsSavedKeys, accept_keywords, check_positive_ints, config_signature

logger = logging.getLogger(__name__)

LAYER_KINDS = ("conv", "attn")
DEFAULT_LAYER_ORDER = ("conv", "conv", "attn", "conv", "attn", "conv", "attn", "conv")

# transformers' Lfm2 spells the layer kinds differently.
_HF_LAYER_TYPES = {"conv": "conv", "attn": "full_attention"}
_FROM_HF_LAYER_TYPES = {v: k for k, v in _HF_LAYER_TYPES.items()}
# transformers' spellings of `layer_order`, taken when it is not given, never stored (`layer_types` is the
# property that reads `layer_order` back in that spelling).
INIT_ONLY_KEYWORDS = {"layer_types": InitOnly(None, "list[str] | None"),
                      "full_attn_idxs": InitOnly(None, "list[int] | None")}


def effective_intermediate_size(
    intermediate_size: int,
    block_auto_adjust_ff_dim: bool,
    block_multiple_of: int,
    block_ffn_dim_multiplier: float | None,
) -> int:
    """LFM2's SwiGLU width: ``m * ceil(int(mult * int(2 I / 3)) / m)`` when auto-adjusting.

    With ``I = 1024``, ``mult = 1``, ``m = 256``: ``int(2048 / 3) = 682`` rounded up to 768. A
    ``None`` multiplier (allowed by transformers' Lfm2, not by the seed) keeps ``int(2 I / 3)``
    unrounded, as transformers does.
    """
    if not block_auto_adjust_ff_dim:
        return intermediate_size
    size = int(2 * intermediate_size / 3)
    if block_ffn_dim_multiplier is None:
        return size
    size = int(block_ffn_dim_multiplier * size)
    return block_multiple_of * ((size + block_multiple_of - 1) // block_multiple_of)


@config_signature(INIT_ONLY_KEYWORDS)
class Lfm2SmallConfig(KeepsSavedKeys, PretrainedConfig):
    """LFM2 backbone: gated short causal convolutions interleaved with GQA attention (QK-norm).

    Every field of the seed's ``ModelConfig`` is accepted under its own name and default;
    transformers' ``Lfm2Config`` names are aliases (``num_hidden_layers``, ``norm_eps``,
    ``conv_L_cache``), and ``layer_types`` / ``full_attn_idxs`` are accepted as an alternative
    spelling of ``layer_order`` (keywords only: ``layer_types`` is read back from ``layer_order``). The
    transaction-specific fields (``num_transactions``, ``num_features``) are kept for the transaction
    encoder; the text LM does not read them. Typed, as every family config: the fields are annotated
    class attributes, checked (and ``head_dim`` derived) in ``__post_init__``.

    Args:
        vocab_size: token vocabulary of the text LM (2048).
        hidden_size: model width ``d`` (256).
        intermediate_size: nominal SwiGLU width before auto-adjustment (1024 -> 768).
        num_attention_heads: query heads (4).
        num_key_value_heads: key/value heads (2; GQA group 2).
        num_layers: decoder blocks (8).
        layer_order: one of ``"conv"``/``"attn"`` per block
            (conv-conv-attn-conv-attn-conv-attn-conv).
        conv_kernel_size: short-convolution kernel ``K`` (3); the decode cache keeps ``K-1`` inputs.
        block_auto_adjust_ff_dim: apply LFM2's ``2/3`` rule and rounding (True).
        block_multiple_of: rounding multiple of the adjusted width (256).
        block_ffn_dim_multiplier: multiplier before rounding (1.0).
        rms_norm_eps: epsilon of every RMSNorm (1e-6).
        rope_theta: RoPE base (1e6).
        max_position_embeddings: longest sequence accepted (4096).
        initializer_range: std of the normal init (0.02).
        num_transactions: transactions per sequence (64; transaction encoder only).
        num_features: features per transaction (15; transaction encoder only).
        conv_bias: biases on ``in_proj``, ``conv`` and ``out_proj`` (False, as the seed and LFM2).
        tie_word_embeddings: share the embedding table with the LM head (True, as LFM2).
        use_cache: return a decoding cache from ``forward`` by default (True).
    """

    model_type = "slm_lfm2"
    attribute_map = {
        "num_hidden_layers": "num_layers",
        "norm_eps": "rms_norm_eps",
        "conv_L_cache": "conv_kernel_size",
    }

    vocab_size: int = 2048
    hidden_size: int = 256
    intermediate_size: int = 1024
    num_attention_heads: int = 4
    num_key_value_heads: int = 2
    num_layers: int = 8
    layer_order: list[str] | None = None  # None -> layer_types / full_attn_idxs, else DEFAULT_LAYER_ORDER
    conv_kernel_size: int = 3
    block_auto_adjust_ff_dim: bool = True
    block_multiple_of: int = 256
    block_ffn_dim_multiplier: float | None = 1.0
    rms_norm_eps: float = 1e-6
    rope_theta: float = 1_000_000.0
    max_position_embeddings: int = 4096
    initializer_range: float = 0.02
    num_transactions: int = 64
    num_features: int = 15
    conv_bias: bool = False
    tie_word_embeddings: bool = True
    use_cache: bool = True

    def __post_init__(self, **kwargs):
        """Called by the generated ``__init__`` once the fields are assigned, with the keywords that are not
        fields: resolves ``layer_order`` (from ``layer_types`` / ``full_attn_idxs`` when not given), checks
        the fields, derives ``head_dim``, then runs transformers' post-init and validators. An unknown
        keyword (a typo) raises ``ValueError`` with "did you mean" (:func:`reject_unknown_keys`)."""
        accept_keywords(self, kwargs)
        kwargs.pop("head_dim", None)  # derived; written by to_dict, recomputed here
        kwargs.pop("effective_intermediate_size", None)
        layer_types, full_attn_idxs = kwargs.pop("layer_types", None), kwargs.pop("full_attn_idxs", None)
        if self.layer_order is None:
            self.layer_order = _layer_order_from_hf(layer_types, full_attn_idxs, self.num_layers)
        self.layer_order = list(self.layer_order)
        self._validate()
        self.head_dim = check_head_layout(self.hidden_size, self.num_attention_heads, self.num_key_value_heads, None)
        if self.head_dim % 2:
            raise ValueError(f"head dimension hidden_size/num_attention_heads = {self.head_dim} must be even for RoPE")
        # bos/eos/pad ids: None until `slmlab train` records its tokenizer's (so generate() stops at eos)
        super().__post_init__(**{"bos_token_id": None, "eos_token_id": None, "pad_token_id": None, **kwargs})
        self.validate()  # transformers' class validators, as its own __init__ runs them

    def _validate(self) -> None:
        check_positive_ints(self, ("vocab_size", "hidden_size", "intermediate_size", "num_layers", "conv_kernel_size",
                                   "block_multiple_of", "max_position_embeddings"))
        if len(self.layer_order) != self.num_layers:
            raise ValueError(
                f"layer_order has {len(self.layer_order)} entries but num_layers={self.num_layers}; give one kind per layer"
            )
        bad = [kind for kind in self.layer_order if kind not in LAYER_KINDS]
        if bad:
            raise ValueError(f"layer_order entries must be one of {LAYER_KINDS}, got {bad!r}")
        mult = self.block_ffn_dim_multiplier
        if mult is not None and not mult > 0:
            raise ValueError(f"block_ffn_dim_multiplier must be > 0 (or None), got {mult!r}")
        if not self.rms_norm_eps > 0:
            raise ValueError(f"rms_norm_eps must be > 0, got {self.rms_norm_eps!r}")
        if self.effective_intermediate_size <= 0:
            raise ValueError(
                f"intermediate_size={self.intermediate_size} gives an empty SwiGLU after auto-adjustment; use a larger value"
            )

    # -- derived quantities (computed in one place) ------------------------------------------
    @property
    def num_kv_groups(self) -> int:
        return self.num_attention_heads // self.num_key_value_heads

    @property
    def effective_intermediate_size(self) -> int:
        return effective_intermediate_size(
            self.intermediate_size, self.block_auto_adjust_ff_dim, self.block_multiple_of, self.block_ffn_dim_multiplier
        )

    @property
    def layer_types(self) -> list[str]:
        """``layer_order`` in transformers' spelling (``"conv"`` / ``"full_attention"``)."""
        return [_HF_LAYER_TYPES[kind] for kind in self.layer_order]

    # -- constructors ------------------------------------------------------------------------
    @classmethod
    def from_yaml(cls, path: str | Path, **overrides) -> Lfm2SmallConfig:
        """Read the seed's ``configs/model.yaml`` layout: model fields under ``backbone:``,
        ``num_transactions`` / ``features_per_transaction`` under ``sequence:``.

        Unlike the seed (which silently drops them), ``max_position_embeddings``,
        ``initializer_range``, ``vocab_size``, ``conv_bias`` and ``tie_word_embeddings`` under
        ``backbone:`` are honoured too; unknown keys are reported in a warning.
        """
        with open(path) as f:
            raw = yaml.safe_load(f) or {}
        if not isinstance(raw, dict):
            raise ValueError(f"{path}: expected a mapping with `backbone:` / `sequence:` sections")
        backbone = dict(raw.get("backbone") or {})
        sequence = dict(raw.get("sequence") or {})
        known = {
            "vocab_size", "hidden_size", "intermediate_size", "num_attention_heads", "num_key_value_heads",
            "num_layers", "layer_order", "conv_kernel_size", "block_auto_adjust_ff_dim", "block_multiple_of",
            "block_ffn_dim_multiplier", "rms_norm_eps", "rope_theta", "max_position_embeddings",
            "initializer_range", "conv_bias", "tie_word_embeddings",
        }
        unknown = sorted(set(backbone) - known)
        if unknown:
            logger.warning("%s: ignoring unknown backbone keys %s", path, unknown)
        kwargs = {k: v for k, v in backbone.items() if k in known}
        if "num_transactions" in sequence:
            kwargs["num_transactions"] = sequence["num_transactions"]
        if "features_per_transaction" in sequence:
            kwargs["num_features"] = sequence["features_per_transaction"]
        return cls(**{**kwargs, **overrides})


def _layer_order_from_hf(layer_types, full_attn_idxs, num_layers) -> list[str]:
    if layer_types is not None:
        bad = [t for t in layer_types if t not in _FROM_HF_LAYER_TYPES]
        if bad:
            raise ValueError(f"layer_types entries must be one of {tuple(_FROM_HF_LAYER_TYPES)}, got {bad!r}")
        return [_FROM_HF_LAYER_TYPES[t] for t in layer_types]
    if full_attn_idxs is not None:
        return ["attn" if i in set(full_attn_idxs) else "conv" for i in range(num_layers)]
    return list(DEFAULT_LAYER_ORDER)  # the seed's default; validated against num_layers
