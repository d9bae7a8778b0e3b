"""SAGE-Lumen family (seed 002): its table (presets, budget rule, LoRA targets) and its registration."""

from ..budget import ScalingRule
from ..registry import Family, register_family
from .configuration_lumen import LumenConfig
from .convert import EXPORT, convert_seed_state_dict
from .modeling_lumen import LumenForCausalLM, LumenModel, audit_parameters

PRESETS = {
    "lumen-3m": {},
    "lumen-tiny": {"hidden_dim": 64, "num_layers": 2, "num_heads": 4, "num_kv_heads": 2, "intermediate_dim": 128},
    "lumen-gqa": {"num_kv_heads": 2},
}


def _budget_layout(k: int, base: dict) -> dict:
    heads = int(base.get("num_heads", 4))
    width = 2 * heads * k  # head dimension 2k: even for RoPE
    return {"hidden_dim": width, "num_layers": int(base.get("num_layers", 4)), "num_heads": heads,
            "num_kv_heads": int(base.get("num_kv_heads", 1)), "intermediate_dim": 2 * width}


# how `slmlab compare --budget` sizes the family (slmlab.models.budget)
SCALING = ScalingRule(
    "width d = 8k (head dim d/4, even), 4 layers, 4 query / 1 KV heads, SwiGLU width 2d (the default's ratios);"
    " the SwiGLU width (multiples of 8) absorbs the rounding",
    _budget_layout, "intermediate_dim", 8,
)

# the layers `slmlab finetune --lora` adapts by default (slmlab.train.lora):
# every projection of attention (q, k, v, o) and of the SwiGLU (gate, up, down), transformers' Llama
# names; the tied embedding / LM head stays frozen
LORA_TARGETS = ("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj")

FAMILY = register_family(Family(
    name="lumen", config_class=LumenConfig, model_class=LumenForCausalLM,
    audit=audit_parameters, export=EXPORT, presets=PRESETS, scaling=SCALING, lora_targets=LORA_TARGETS,
    description="SAGE-Lumen: tiny Llama-style decoder (MQA/GQA, RoPE, SwiGLU, tied embeddings)",
))

__all__ = ["FAMILY", "LumenConfig", "LumenForCausalLM", "LumenModel", "audit_parameters", "convert_seed_state_dict"]
