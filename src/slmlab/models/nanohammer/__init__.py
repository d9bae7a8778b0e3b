"""NanoHammer family (seed 003): holographic state tokens beside Llama attention; its table (presets, budget
rule, LoRA targets) and its registration."""

from ..budget import ScalingRule
from ..registry import Family, register_family
from .configuration_nanohammer import NanoHammerConfig
from .convert import EXPORT
from .modeling_nanohammer import NanoHammerForCausalLM, NanoHammerModel, audit_parameters, cache_nbytes

PRESETS = {
    "nanohammer-seed": {},
    "nanohammer-tiny": {
        "vocab_size": 2048,
        "hidden_size": 128,
        "intermediate_size": 512,
        "num_hidden_layers": 4,
        "num_attention_heads": 4,
        "num_key_value_heads": 2,
        "num_state_heads": 4,
        "max_position_embeddings": 2048,
        "bos_token_id": None,
        "eos_token_id": None,
    },
    "nanohammer-small": {
        "vocab_size": 8192,
        "hidden_size": 512,
        "intermediate_size": 2048,
        "num_hidden_layers": 8,
        "num_attention_heads": 8,
        "num_key_value_heads": 2,
        "num_state_heads": 8,
        "max_position_embeddings": 4096,
        "bos_token_id": None,
        "eos_token_id": None,
    },
    "nanohammer-seed-compat": {"rotation_style": "seed", "hidden_attends_self": False},
}


def _budget_layout(k: int, base: dict) -> dict:
    width = 16 * k
    return {"hidden_size": width, "num_hidden_layers": int(base.get("num_hidden_layers", 4)),
            "num_attention_heads": 4, "num_key_value_heads": 2, "head_dim": width // 4, "num_state_heads": 4,
            "state_hidden_size": width // 4, "intermediate_size": 4 * width}


# how `slmlab compare --budget` sizes the family (slmlab.models.budget)
SCALING = ScalingRule(
    "width d = 16k, 4 layers (the tiny preset's depth), 4 query / 2 KV heads of dim d/4, 4 state heads over a"
    " state of d/4 (even, divisible by the state heads; the default's d/4 ratio), SwiGLU 4d; the SwiGLU width"
    " (multiples of 8) absorbs the rounding",
    _budget_layout, "intermediate_size", 8,
)

# the layers `slmlab finetune --lora` adapts by default (slmlab.train.lora):
# attention and SwiGLU projections (Llama names) and the state path's projections (token_to_state,
# state_to_hidden); the state cell's small MLP and the tied embedding stay frozen
LORA_TARGETS = ("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj", "token_to_state",
                "state_to_hidden")

FAMILY = register_family(Family(
    name="nanohammer", config_class=NanoHammerConfig, model_class=NanoHammerForCausalLM,
    audit=audit_parameters, export=EXPORT, presets=PRESETS, scaling=SCALING, lora_targets=LORA_TARGETS,
    description="NanoHammer: rotated cumulative-sum state tokens beside Llama attention (GQA, RoPE, SwiGLU)",
))

__all__ = ["FAMILY", "NanoHammerConfig", "NanoHammerForCausalLM", "NanoHammerModel", "audit_parameters", "cache_nbytes"]
