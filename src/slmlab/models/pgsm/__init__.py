"""PGSM family (seed 001): attention-free conv backbone with query-only sparse RoPE retrieval; its table
(presets, budget rule, LoRA targets) and its registration."""

from ..budget import ScalingRule
from ..registry import Family, register_family
from .configuration_pgsm import SIZE_PRESETS, PGSMConfig
from .convert import EXPORT, config_from_seed, convert_seed_state_dict
from .modeling_pgsm import PGSMForCausalLM, PGSMModel, audit_parameters, build_pgsm_model

PRESETS = {f"pgsm-{size}": dict(values) for size, values in SIZE_PRESETS.items()}


def _budget_layout(k: int, base: dict) -> dict:
    dim = 8 * k
    heads = int(base.get("retrieval_heads", 4))
    step = 2 * heads  # retrieval head dim even (its RoPE rotates pairs)
    retrieval = max(step, step * round(dim * 8 / 3 / step))
    return {"dim": dim, "layers": int(base.get("layers", 3)), "hidden": 2 * dim, "retrieval_dim": retrieval,
            "retrieval_heads": heads}


# how `slmlab compare --budget` sizes the family (slmlab.models.budget)
SCALING = ScalingRule(
    "dim d = 8k, the default's 3 blocks (kernel 17), hidden 2d, retriever width 8d/3 rounded to a multiple of"
    " 8 (4 heads of even dim), post-retrieval block on; the block hidden width (multiples of 8) absorbs the"
    " rounding",
    _budget_layout, "hidden", 8,
)

# the layers `slmlab finetune --lora` adapts by default (slmlab.train.lora):
# every block's state mixer and feed-forward (state_mix, state_gate, ff_in, ff_out) and the retriever's
# projections (q, k, v, out, gate); convolution kernels and the tied embedding stay frozen
LORA_TARGETS = ("state_mix", "state_gate", "ff_in", "ff_out", "q", "k", "v", "out", "gate")

FAMILY = register_family(Family(
    name="pgsm", config_class=PGSMConfig, model_class=PGSMForCausalLM,
    audit=audit_parameters, export=EXPORT, presets=PRESETS, scaling=SCALING, lora_targets=LORA_TARGETS,
    description="PGSM: attention-free causal-conv backbone + query-only sparse RoPE retrieval",
))

__all__ = ["FAMILY", "PRESETS", "PGSMConfig", "PGSMForCausalLM", "PGSMModel", "audit_parameters", "build_pgsm_model",
           "config_from_seed", "convert_seed_state_dict"]
