"""PGSM's budget-fitting rule (``slmlab compare``; :mod:`slmlab.models.budget`)."""

from ..budget import ScalingRule


def _layout(k: int, base: dict) -> dict:
    dim = 8 * k
    heads = int(base.get("retrieval_heads", 4))
    step = 2 * heads  # retrieval head dim even (its RoPE rotates pairs)
    retrieval = max(step, step * round(dim * 8 / 3 / step))
    return {"dim": dim, "layers": int(base.get("layers", 3)), "hidden": 2 * dim, "retrieval_dim": retrieval,
            "retrieval_heads": heads}


SCALING = ScalingRule(
    "dim d = 8k, the default's 3 blocks (kernel 17), hidden 2d, retriever width 8d/3 rounded to a multiple of"
    " 8 (4 heads of even dim), post-retrieval block on; the block hidden width (multiples of 8) absorbs the"
    " rounding",
    _layout, "hidden", 8,
)
