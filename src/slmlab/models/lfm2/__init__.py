"""LFM2Small family (seed 004): gated short-convolution / GQA hybrid with a streaming conv cache."""

from ..registry import Family, register_family
from .configuration_lfm2 import Lfm2SmallConfig, effective_intermediate_size
from .convert import EXPORT, config_from_transformers, config_to_transformers, from_transformers
from .lora import LORA_TARGETS
from .modeling_lfm2 import (
    Lfm2SmallBackbone,
    Lfm2SmallForCausalLM,
    Lfm2SmallModel,
    audit_parameters,
)
from .scaling import SCALING

PRESETS = {
    "lfm2-small": {},
    "lfm2-tiny": {
        "hidden_size": 64,
        "intermediate_size": 192,
        "num_attention_heads": 4,
        "num_key_value_heads": 2,
        "num_layers": 4,
        "layer_order": ["conv", "attn", "conv", "attn"],
        "block_multiple_of": 64,
    },
    "lfm2-medium": {"hidden_size": 512, "intermediate_size": 2048, "num_attention_heads": 8, "num_key_value_heads": 2},
}

FAMILY = register_family(
    Family(
        name="lfm2",
        config_class=Lfm2SmallConfig,
        model_class=Lfm2SmallForCausalLM,
        presets=PRESETS,
        audit=audit_parameters,
        scaling=SCALING,
        export=EXPORT,
        lora_targets=LORA_TARGETS,
        description="LFM2Small: gated short-conv / GQA (QK-norm) hybrid, SwiGLU, streaming conv cache",
    )
)

__all__ = [
    "FAMILY",
    "PRESETS",
    "Lfm2SmallBackbone",
    "Lfm2SmallConfig",
    "Lfm2SmallForCausalLM",
    "Lfm2SmallModel",
    "audit_parameters",
    "config_from_transformers",
    "config_to_transformers",
    "effective_intermediate_size",
    "from_transformers",
]
