"""Parameter audit: per-category parameter counts of any registered family."""

from __future__ import annotations

from torch import nn

from ..models.registry import Family


def count_unique_parameters(model: nn.Module) -> int:
    """Parameters counted once even when tied (``model.parameters()`` de-duplicates shared tensors)."""
    return sum(p.numel() for p in model.parameters())


def audit_model(family: Family, model: nn.Module) -> dict[str, int]:
    """The family's own categories, or a per-top-level-module breakdown when it has none."""
    if family.audit is not None:
        return family.audit(model)
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
    width = max(len(k) for k in rows) + 2
    lines = [title, "-" * (width + 14)]
    lines += [f"  {k:<{width}}{v:>12,}" for k, v in rows.items()]
    return "\n".join(lines)
