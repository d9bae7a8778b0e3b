"""SAGE-Lumen family (seed 002)."""

from ..registry import Family, register_family
from .configuration_lumen import LumenConfig
from .convert import EXPORT, convert_seed_state_dict
from .lora import LORA_TARGETS
from .modeling_lumen import LumenForCausalLM, LumenModel, audit_parameters
from .scaling import SCALING

PRESETS = {
    "lumen-3m": {},
    "lumen-tiny": {"hidden_dim": 64, "num_layers": 2, "num_heads": 4, "num_kv_heads": 2, "intermediate_dim": 128},
    "lumen-gqa": {"num_kv_heads": 2},
}

FAMILY = register_family(
    Family(
        name="lumen",
        config_class=LumenConfig,
        model_class=LumenForCausalLM,
        presets=PRESETS,
        audit=audit_parameters,
        scaling=SCALING,
        export=EXPORT,
        lora_targets=LORA_TARGETS,
        description="SAGE-Lumen: tiny Llama-style decoder (MQA/GQA, RoPE, SwiGLU, tied embeddings)",
    )
)

__all__ = ["FAMILY", "LumenConfig", "LumenForCausalLM", "LumenModel", "audit_parameters", "convert_seed_state_dict"]
