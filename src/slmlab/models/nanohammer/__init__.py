"""NanoHammer family (seed 003): holographic state tokens beside Llama attention."""

from ..registry import Family, register_family
from .configuration_nanohammer import NanoHammerConfig
from .convert import EXPORT
from .lora import LORA_TARGETS
from .modeling_nanohammer import NanoHammerForCausalLM, NanoHammerModel, audit_parameters, cache_nbytes
from .scaling import SCALING

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

FAMILY = register_family(
    Family(
        name="nanohammer",
        config_class=NanoHammerConfig,
        model_class=NanoHammerForCausalLM,
        presets=PRESETS,
        audit=audit_parameters,
        scaling=SCALING,
        export=EXPORT,
        lora_targets=LORA_TARGETS,
        description="NanoHammer: rotated cumulative-sum state tokens beside Llama attention (GQA, RoPE, SwiGLU)",
    )
)

__all__ = ["FAMILY", "NanoHammerConfig", "NanoHammerForCausalLM", "NanoHammerModel", "audit_parameters", "cache_nbytes"]
