"""NanoHammer's budget-fitting rule (``slmlab compare``; :mod:`slmlab.models.budget`)."""

from ..budget import ScalingRule


def _layout(k: int, base: dict) -> dict:
    width = 16 * k
    return {"hidden_size": width, "num_hidden_layers": int(base.get("num_hidden_layers", 4)),
            "num_attention_heads": 4, "num_key_value_heads": 2, "head_dim": width // 4, "num_state_heads": 4,
            "state_hidden_size": width // 4, "intermediate_size": 4 * width}


SCALING = ScalingRule(
    "width d = 16k, 4 layers (the tiny preset's depth), 4 query / 2 KV heads of dim d/4, 4 state heads over a"
    " state of d/4 (even, divisible by the state heads; the default's d/4 ratio), SwiGLU 4d; the SwiGLU width"
    " (multiples of 8) absorbs the rounding",
    _layout, "intermediate_size", 8,
)
