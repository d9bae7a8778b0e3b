"""NeoLLM family (seed 000): a research transformer whose every mechanism is a switch.

``import slmlab`` registers ``NeoLLMConfig`` / ``NeoLLMForCausalLM`` (model_type ``neollm``) with the
Auto classes. Spelling Bee embeddings are on by default: call
``model.model.spelling_bee.set_byte_table(tokenizer)`` once after building a fresh model.
"""

from ..registry import Family, register_family
from .configuration_neollm import NeoLLMConfig
from .convert import EXPORT
from .lora import LORA_TARGETS
from .modeling_neollm import NeoLLMForCausalLM, NeoLLMModel, audit_parameters
from .scaling import SCALING

_TINY = dict(
    vocab_size=300,
    hidden_size=64,
    intermediate_size=128,
    num_hidden_layers=4,
    num_attention_heads=4,
    num_key_value_heads=2,
    head_dim=16,
    max_position_embeddings=2048,
    iha_sliding_window=4,
)

# Named configurations (a table; model code never reads a preset's name).
PRESETS = {
    "neollm-113m": {},  # the seed's signature defaults: 113,131,288 parameters
    "neollm-small": dict(
        hidden_size=256, intermediate_size=768, num_hidden_layers=6, num_attention_heads=4, num_key_value_heads=2, head_dim=64
    ),
    "neollm-tiny": _TINY,
}

FAMILY = register_family(
    Family(
        name="neollm",
        config_class=NeoLLMConfig,
        model_class=NeoLLMForCausalLM,
        presets=PRESETS,
        audit=audit_parameters,
        scaling=SCALING,
        export=EXPORT,
        lora_targets=LORA_TARGETS,
        description="NeoLLM: switchable research transformer (SiameseNorm, IHA, REPO-GRAPE, momentum, XSA, FAN, Spelling Bee)",
    )
)

__all__ = ["FAMILY", "NeoLLMConfig", "NeoLLMForCausalLM", "NeoLLMModel", "PRESETS", "audit_parameters"]
