"""Parameter audit: per-category parameter counts of a model, and their printed table.

A family with its own categories declares them as ``Family.audit``; :meth:`Family.parameter_audit`
falls back to :func:`module_breakdown` for a family without one.
"""

from __future__ import annotations

from torch import nn


def count_unique_parameters(model: nn.Module) -> int:
    """Parameters counted once even when tied (``model.parameters()`` de-duplicates shared tensors)."""
    return sum(p.numel() for p in model.parameters())


def module_breakdown(model: nn.Module) -> dict[str, int]:
    """Parameters per module two names deep (``model.layers``, ``lm_head``), shared tensors once,
    then ``Total``."""
    rows: dict[str, int] = {}
    seen: set[int] = set()
    for name, p in model.named_parameters():
        if id(p) in seen:
            continue
        seen.add(id(p))
        key = ".".join(name.split(".")[:2])
        rows[key] = rows.get(key, 0) + p.numel()
    rows["Total"] = count_unique_parameters(model)
    return rows


def format_audit(rows: dict[str, int], title: str) -> str:
    """The audit as a two-column table under ``title``."""
    width = max(len(k) for k in rows) + 2
    lines = [title, "-" * (width + 14)]
    lines += [f"  {k:<{width}}{v:>12,}" for k, v in rows.items()]
    return "\n".join(lines)
