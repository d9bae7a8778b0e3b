"""PGSM family (seed 001): attention-free conv backbone with query-only sparse RoPE retrieval."""

from ..registry import Family, register_family
from .configuration_pgsm import SIZE_PRESETS, PGSMConfig
from .convert import EXPORT, config_from_seed, convert_seed_state_dict
from .lora import LORA_TARGETS
from .modeling_pgsm import PGSMForCausalLM, PGSMModel, audit_parameters, build_pgsm_model
from .scaling import SCALING

PRESETS = {f"pgsm-{size}": dict(values) for size, values in SIZE_PRESETS.items()}

FAMILY = register_family(
    Family(
        name="pgsm",
        config_class=PGSMConfig,
        model_class=PGSMForCausalLM,
        presets=PRESETS,
        audit=audit_parameters,
        scaling=SCALING,
        export=EXPORT,
        lora_targets=LORA_TARGETS,
        description="PGSM: attention-free causal-conv backbone + query-only sparse RoPE retrieval",
    )
)

__all__ = [
    "FAMILY",
    "PRESETS",
    "PGSMConfig",
    "PGSMForCausalLM",
    "PGSMModel",
    "audit_parameters",
    "build_pgsm_model",
    "config_from_seed",
    "convert_seed_state_dict",
]
