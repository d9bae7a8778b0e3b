"""LFM2Small family (seed 004): gated short-convolution / GQA hybrid with a streaming conv cache; its table
(presets, budget rule, LoRA targets) and its registration."""

from ..budget import ScalingRule
from ..registry import Family, register_family
from .configuration_lfm2 import Lfm2SmallConfig, effective_intermediate_size
from .convert import EXPORT, config_from_transformers, config_to_transformers, from_transformers
from .modeling_lfm2 import (
    Lfm2SmallBackbone,
    Lfm2SmallForCausalLM,
    Lfm2SmallModel,
    audit_parameters,
)

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


def _budget_layout(k: int, base: dict) -> dict:
    heads = int(base.get("num_attention_heads", 4))
    width = 2 * heads * k  # head dimension 2k: even for RoPE
    order = list(base.get("layer_order", Lfm2SmallConfig().layer_order))
    return {"hidden_size": width, "num_layers": len(order), "layer_order": order, "num_attention_heads": heads,
            "num_key_value_heads": int(base.get("num_key_value_heads", 2)), "intermediate_size": 4 * width,
            "block_multiple_of": 8}


# how `slmlab compare --budget` sizes the family (slmlab.models.budget)
SCALING = ScalingRule(
    "width d = 8k (head dim d/4, even), the default's 8 layers [conv, conv, attn, conv, attn, conv, attn, conv],"
    " 4 query / 2 KV heads, intermediate 4d (SwiGLU 2/3 of it, rounded up to 8); intermediate_size (multiples"
    " of 12) absorbs the rounding",
    _budget_layout, "intermediate_size", 12,
)

# the layers `slmlab finetune --lora` adapts by default (slmlab.train.lora):
# attention (q, k, v, out_proj), the gated short convolutions' in/out projections (in_proj, out_proj) and
# the SwiGLU (w1, w3, w2); the convolution kernels, norms and tied embedding stay frozen
LORA_TARGETS = ("q_proj", "k_proj", "v_proj", "out_proj", "in_proj", "w1", "w2", "w3")

FAMILY = register_family(Family(
    name="lfm2", config_class=Lfm2SmallConfig, model_class=Lfm2SmallForCausalLM,
    audit=audit_parameters, export=EXPORT, presets=PRESETS, scaling=SCALING, lora_targets=LORA_TARGETS,
    description="LFM2Small: gated short-conv / GQA (QK-norm) hybrid, SwiGLU, streaming conv cache",
))

__all__ = ["FAMILY", "PRESETS", "Lfm2SmallBackbone", "Lfm2SmallConfig", "Lfm2SmallForCausalLM", "Lfm2SmallModel",
           "audit_parameters", "config_from_transformers", "config_to_transformers", "effective_intermediate_size",
           "from_transformers"]
