"""LFM2's budget-fitting rule (``slmlab compare``; :mod:`slmlab.models.budget`)."""

from ..budget import ScalingRule
from .configuration_lfm2 import Lfm2SmallConfig


def _layout(k: int, base: dict) -> dict:
    heads = int(base.get("num_attention_heads", 4))
    width = 2 * heads * k  # head dimension 2k: even for RoPE
    order = list(base.get("layer_order", Lfm2SmallConfig().layer_order))
    return {"hidden_size": width, "num_layers": len(order), "layer_order": order, "num_attention_heads": heads,
            "num_key_value_heads": int(base.get("num_key_value_heads", 2)), "intermediate_size": 4 * width,
            "block_multiple_of": 8}


SCALING = ScalingRule(
    "width d = 8k (head dim d/4, even), the default's 8 layers [conv, conv, attn, conv, attn, conv, attn, conv],"
    " 4 query / 2 KV heads, intermediate 4d (SwiGLU 2/3 of it, rounded up to 8); intermediate_size (multiples"
    " of 12) absorbs the rounding",
    _layout, "intermediate_size", 12,
)
