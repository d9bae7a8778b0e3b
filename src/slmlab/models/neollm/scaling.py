"""NeoLLM's budget-fitting rule (``slmlab compare``; :mod:`slmlab.models.budget`)."""

from ..budget import ScalingRule


def iha_pattern(layers: int) -> str:
    """The default's local/global pattern, ``"LLLLG"`` (every fifth layer global), cut so that a model of fewer
    than five layers still ends in a global layer: with ``"LLLLG"`` a 4-layer model would be local everywhere
    (a window of ``T / 8`` tokens at P = 2) and could not read anything further back than four windows."""
    return "L" * (min(layers, 5) - 1) + "G"


def _layout(k: int, base: dict) -> dict:
    head_dim = 8 * k  # partial rotary (1/4 of the head) stays even
    width = 4 * head_dim  # H * D = d, as the Hadamard o_proj needs
    layers = int(base.get("num_hidden_layers", 4))
    return {"hidden_size": width, "num_hidden_layers": layers,
            "num_attention_heads": 4, "num_key_value_heads": 2, "head_dim": head_dim, "intermediate_size": 3 * width,
            "use_hadamard_o_proj": width & (width - 1) == 0, "iha_local_global_pattern": iha_pattern(layers)}


SCALING = ScalingRule(
    "width d = 32k, 4 layers (the tiny preset's depth), 4 query / 2 KV heads with H*D = d, intermediate 3d (the"
    " default's ratio), local/global pattern LLLG (the default's LLLLG cut to 4 layers so the last layer is"
    " global), every other switch at its default; the Hadamard o_proj where d is a power of two, a dense"
    " o_proj otherwise; the intermediate width (multiples of 8) absorbs the rounding",
    _layout, "intermediate_size", 8,
)
