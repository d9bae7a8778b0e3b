"""NeoLLM family (seed 000): a research transformer whose every mechanism is a switch.

``import slmlab`` registers ``NeoLLMConfig`` / ``NeoLLMForCausalLM`` (model_type ``neollm``) with the
Auto classes. Spelling Bee embeddings are on by default: call
``model.model.spelling_bee.set_byte_table(tokenizer)`` once after building a fresh model. This module
holds the family's table (presets, budget rule, LoRA targets) and its registration.
"""

from ..budget import ScalingRule
from ..registry import Family, register_family
from .configuration_neollm import NeoLLMConfig
from .convert import EXPORT
from .modeling_neollm import NeoLLMForCausalLM, NeoLLMModel, audit_parameters

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


def _iha_pattern(layers: int) -> str:
    """The default's local/global pattern, ``"LLLLG"`` (every fifth layer global), cut so that a model of fewer
    than five layers still ends in a global layer: with ``"LLLLG"`` a 4-layer model would be local everywhere
    (a window of ``T / 8`` tokens at P = 2) and could not read anything further back than four windows."""
    return "L" * (min(layers, 5) - 1) + "G"


def _budget_layout(k: int, base: dict) -> dict:
    head_dim = 8 * k  # partial rotary (1/4 of the head) stays even
    width = 4 * head_dim  # H * D = d, as the Hadamard o_proj needs
    layers = int(base.get("num_hidden_layers", 4))
    return {"hidden_size": width, "num_hidden_layers": layers,
            "num_attention_heads": 4, "num_key_value_heads": 2, "head_dim": head_dim, "intermediate_size": 3 * width,
            "use_hadamard_o_proj": width & (width - 1) == 0, "iha_local_global_pattern": _iha_pattern(layers)}


# how `slmlab compare --budget` sizes the family (slmlab.models.budget)
SCALING = ScalingRule(
    "width d = 32k, 4 layers (the tiny preset's depth), 4 query / 2 KV heads with H*D = d, intermediate 3d (the"
    " default's ratio), local/global pattern LLLG (the default's LLLLG cut to 4 layers so the last layer is"
    " global), every other switch at its default; the Hadamard o_proj where d is a power of two, a dense"
    " o_proj otherwise; the intermediate width (multiples of 8) absorbs the rounding",
    _budget_layout, "intermediate_size", 8,
)

# the layers `slmlab finetune --lora` adapts by default (slmlab.train.lora):
# attention and MLP projections (FAN's periodic/linear projections where FAN is on, REPO's w_g and w_c). A
# projection with learnable multipliers (RowMultipliedLinear, `use_learnable_multipliers`) is not a plain
# linear layer: LoRA's merge would not commute with its multiplier, so it is skipped.
LORA_TARGETS = ("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj", "periodic_proj",
                "linear_proj", "w_g", "w_c")

FAMILY = register_family(Family(
    name="neollm", config_class=NeoLLMConfig, model_class=NeoLLMForCausalLM,
    audit=audit_parameters, export=EXPORT, presets=PRESETS, scaling=SCALING, lora_targets=LORA_TARGETS,
    description="NeoLLM: switchable research transformer (SiameseNorm, IHA, REPO-GRAPE, momentum, XSA, FAN, Spelling Bee)",
))

__all__ = ["FAMILY", "NeoLLMConfig", "NeoLLMForCausalLM", "NeoLLMModel", "PRESETS", "audit_parameters"]
