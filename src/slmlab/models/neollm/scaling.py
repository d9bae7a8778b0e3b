"""NeoLLM's budget-fitting rule (``slmlab compare``; :mod:`slmlab.models.budget`)."""

from ..budget import ScalingRule


def _layout(k: int, base: dict) -> dict:
    head_dim = 8 * k  # partial rotary (1/4 of the head) stays even
    width = 4 * head_dim  # H * D = d, as the Hadamard o_proj needs
    return {"hidden_size": width, "num_hidden_layers": int(base.get("num_hidden_layers", 4)),
            "num_attention_heads": 4, "num_key_value_heads": 2, "head_dim": head_dim, "intermediate_size": 3 * width,
            "use_hadamard_o_proj": width & (width - 1) == 0}


SCALING = ScalingRule(
    "width d = 32k, 4 layers (the tiny preset's depth), 4 query / 2 KV heads with H*D = d, intermediate 3d (the"
    " default's ratio), every other switch at its default; the Hadamard o_proj where d is a power of two, a dense"
    " o_proj otherwise; the intermediate width (multiples of 8) absorbs the rounding",
    _layout, "intermediate_size", 8,
)
