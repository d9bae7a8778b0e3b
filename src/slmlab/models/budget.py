"""Budget fitting: a family's config overrides for a target number of non-embedding parameters.

Each family states one scaling rule (:class:`ScalingRule`, given to its registry entry as
``Family.scaling``): a width on a grid at fixed depth and ratios (``layout(k, base)`` for grid index
``k = 1, 2, ...``), every point of which satisfies the family's constraints (head layouts, even
rotary dimensions, power-of-two Hadamard widths, ...), plus one fine field (the MLP width) that
absorbs the grid's rounding. :func:`fit_budget` picks the largest grid width whose model stays
within the budget, then the fine field's value whose count is closest to it.

Counting is the family's own ``audit`` on a model built on the meta device (no memory, no
initialisation): ``Total`` minus the audit's embedding rows (the token table and an untied head).
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass

TOLERANCE = 0.10  # a fitted model lies within ±10% of the requested non-embedding budget
_MAX_GRID = 1 << 14


@dataclass(frozen=True)
class ScalingRule:
    """How a family grows with its budget.

    Args:
        description: the rule in one sentence (``slmlab compare`` prints it; ``docs/compare.md``).
        layout: ``(k, base) -> overrides`` for grid index ``k >= 1``: width and everything tied to it
            (heads, state sizes, ratios); depth and head counts come from ``base`` when given there.
        fine_field: the config field that absorbs the grid's rounding (the MLP width), or None.
        fine_quantum: the fine field takes multiples of this.
    """

    description: str
    layout: Callable[[int, dict], dict]
    fine_field: str | None = None
    fine_quantum: int = 8


def non_embedding_parameters(family, overrides: dict) -> int:
    """Non-embedding parameters of ``family`` built with ``overrides`` on the meta device: the
    audit's ``Total`` minus its embedding rows (tied table, or table and untied head)."""
    import torch

    config = family.make_config(None, **overrides)
    with torch.device("meta"):
        model = family.model_class(config)
    rows = family.parameter_audit(model)
    return int(rows["Total"]) - sum(int(v) for v in model.embedding_rows().values())


def _largest_at_most(count: Callable[[int], int], budget: int, guess: int = 1) -> int | None:
    """Largest ``j >= 1`` with ``count(j) <= budget`` for a count non-decreasing in ``j`` (None if
    even ``count(1)`` is over), searched from ``guess``: galloping away from it until the answer is
    bracketed, then bisecting (a good guess costs two or three counts)."""
    if count(1) > budget:
        return None
    j = min(max(1, int(guess)), _MAX_GRID)
    step = 1
    if count(j) <= budget:  # answer >= j: gallop up
        lo, hi = j, None
        while hi is None:
            nxt = min(lo + step, _MAX_GRID)
            if nxt == lo:
                return lo
            if count(nxt) <= budget:
                lo, step = nxt, step * 2
            else:
                hi = nxt
    else:  # answer < j: gallop down
        hi, lo = j, None
        while lo is None:
            nxt = max(hi - step, 1)
            if count(nxt) <= budget:
                lo = nxt
            else:
                hi, step = nxt, step * 2
    while hi - lo > 1:
        mid = (lo + hi) // 2
        if count(mid) <= budget:
            lo = mid
        else:
            hi = mid
    return lo


def _quadratic_guess(count: Callable[[int], int], budget: int) -> int:
    """Where ``count(k) = budget`` for the quadratic through ``k = 1, 2, 3`` (widths grow parameters
    about quadratically at fixed depth)."""
    y1, y2, y3 = count(1), count(2), count(3)
    c = (y3 - 2 * y2 + y1) / 2
    b = (y2 - y1) - 3 * c
    a = y1 - b - c
    if c <= 0:
        return max(1, int((budget - a) / b)) if b > 0 else 1
    return max(1, int((-b + math.sqrt(max(b * b - 4 * c * (a - budget), 0.0))) / (2 * c)))


def fit_budget(family, non_embedding_budget: int, base: dict | None = None) -> dict:
    """Config overrides giving ``family`` about ``non_embedding_budget`` non-embedding parameters.

    Args:
        family: a registry :class:`~slmlab.models.registry.Family` with a ``scaling`` rule.
        non_embedding_budget: the target count.
        base: fields every candidate keeps (``vocab_size``, ``tie_word_embeddings``, depth, ...).
    Returns:
        ``{**base, **layout, fine_field: value}``: what ``Family.make_config`` takes.
    Raises:
        ValueError: the family has no rule, the budget is below its smallest valid config (the
            minimum is named), or no config lands within ±10%.
    """
    rule = getattr(family, "scaling", None)
    if rule is None:
        raise ValueError(f"family {family.name!r} has no budget-fitting rule; give its registry entry a ScalingRule"
                         " (slmlab.models.budget) or compare it at a preset")
    base = dict(base or {})
    budget = int(non_embedding_budget)
    cache: dict[tuple, int] = {}

    def overrides(k: int, fine: int | None = None) -> dict:
        out = {**base, **rule.layout(k, base)}
        if fine is not None:
            out[rule.fine_field] = fine
        return out

    def count(k: int, fine: int | None = None) -> int:
        key = (k, fine)
        if key not in cache:
            cache[key] = non_embedding_parameters(family, overrides(k, fine))
        return cache[key]

    q = rule.fine_quantum
    smallest = count(1, q) if rule.fine_field else count(1)
    if budget < smallest * (1 - TOLERANCE):
        raise ValueError(
            f"a {budget:,}-parameter budget is below {family.name}'s smallest valid config ({smallest:,} non-embedding"
            f" parameters at grid width 1); use --budget {_format_count(smallest)} or more, or leave {family.name} out"
        )
    k = _largest_at_most(count, budget, _quadratic_guess(count, budget)) or 1
    fine = None
    if rule.fine_field:
        one, two = count(k, q), count(k, 2 * q)  # linear in the fine field
        guess = 1 + (budget - one) / (two - one) if two > one else 1
        j = _largest_at_most(lambda j: count(k, j * q), budget, int(guess)) or 1
        candidates = [j, j + 1] if j < _MAX_GRID else [j]
        fine = q * min(candidates, key=lambda c: abs(count(k, c * q) - budget))
    got = count(k, fine)
    if abs(got - budget) > TOLERANCE * budget:
        raise ValueError(
            f"{family.name} cannot be fitted to {budget:,} non-embedding parameters within ±10% (closest: {got:,});"
            " choose another --budget"
        )
    return overrides(k, fine)


def _format_count(n: int) -> str:
    """``n`` rounded up to whole thousands, as ``--budget`` accepts it (``37,123`` -> ``38k``)."""
    return f"{-(-int(n) // 1000)}k"
