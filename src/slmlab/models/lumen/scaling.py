"""SAGE-Lumen's budget-fitting rule (``slmlab compare``; :mod:`slmlab.models.budget`)."""

from ..budget import ScalingRule


def _layout(k: int, base: dict) -> dict:
    heads = int(base.get("num_heads", 4))
    width = 2 * heads * k  # head dimension 2k: even for RoPE
    return {"hidden_dim": width, "num_layers": int(base.get("num_layers", 4)), "num_heads": heads,
            "num_kv_heads": int(base.get("num_kv_heads", 1)), "intermediate_dim": 2 * width}


SCALING = ScalingRule(
    "width d = 8k (head dim d/4, even), 4 layers, 4 query / 1 KV heads, SwiGLU width 2d (the default's ratios);"
    " the SwiGLU width (multiples of 8) absorbs the rounding",
    _layout, "intermediate_dim", 8,
)
