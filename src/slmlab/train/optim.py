"""Optimisers and learning-rate schedules.

AdamW (Loshchilov & Hutter, arXiv:1711.05101) with decay only on the weight matrices; optionally Muon
(Jordan et al. 2024; Liu et al., arXiv:2502.16982): momentum orthogonalised by Newton-Schulz, applied
to the 2-D hidden matrices, AdamW on everything else. Schedules are pure functions of the step, so
resuming at step ``s`` reproduces the uninterrupted learning rate exactly.
"""

from __future__ import annotations

import math

import torch
from torch import nn

from .config import OptimConfig, ScheduleConfig


def _embedding_param_ids(model: nn.Module) -> set[int]:
    ids = {id(p) for m in model.modules() if isinstance(m, nn.Embedding) for p in m.parameters(recurse=False)}
    head = model.get_output_embeddings() if hasattr(model, "get_output_embeddings") else None
    if head is not None:
        ids |= {id(p) for p in head.parameters(recurse=False)}
    return ids


def split_parameters(model: nn.Module) -> dict[str, list[tuple[str, nn.Parameter]]]:
    """Group trainable parameters: ``matrix`` (2-D hidden weights), ``embedding`` (token tables and
    the output head) and ``other`` (norms, biases, gains, conv kernels with fewer than 2 dims)."""
    emb = _embedding_param_ids(model)
    groups: dict[str, list[tuple[str, nn.Parameter]]] = {"matrix": [], "embedding": [], "other": []}
    seen: set[int] = set()
    for name, p in model.named_parameters():
        if not p.requires_grad or id(p) in seen:
            continue
        seen.add(id(p))
        kind = "embedding" if id(p) in emb else "matrix" if p.dim() == 2 else "other"
        groups[kind].append((name, p))
    return groups


class CombinedOptimizer:
    """Several optimisers stepped together (Muon for matrices + AdamW for the rest).

    Exposes ``param_groups``, ``step``, ``zero_grad``, ``state_dict`` and ``load_state_dict`` like a
    single ``torch.optim.Optimizer``; its state dict is ``{"optimizers": [sd, ...]}``.
    """

    def __init__(self, optimizers: list[torch.optim.Optimizer]) -> None:
        self.optimizers = optimizers

    @property
    def param_groups(self) -> list[dict]:
        return [g for opt in self.optimizers for g in opt.param_groups]

    def step(self) -> None:
        for opt in self.optimizers:
            opt.step()

    def zero_grad(self, set_to_none: bool = True) -> None:
        for opt in self.optimizers:
            opt.zero_grad(set_to_none=set_to_none)

    def state_dict(self) -> dict:
        return {"optimizers": [opt.state_dict() for opt in self.optimizers]}

    def load_state_dict(self, state: dict) -> None:
        parts = state.get("optimizers")
        if not isinstance(parts, list) or len(parts) != len(self.optimizers):
            raise ValueError(f"optimizer state holds {len(parts or [])} optimisers, this run builds {len(self.optimizers)}")
        for opt, sd in zip(self.optimizers, parts):
            opt.load_state_dict(sd)


def _adamw(groups: list[dict], cfg: OptimConfig, device: torch.device) -> torch.optim.AdamW:
    # The fused kernel (one kernel for every parameter's update). It updates parameters without
    # bumping their version counters, which is safe: slmlab.layers.fused caches concatenated weights
    # only inside frozen_weights() blocks (the decode loops), never across training steps.
    return torch.optim.AdamW(groups, lr=cfg.lr, betas=cfg.betas, eps=cfg.eps, fused=True)


def _lr_scale(name: str, scales: dict[str, float]) -> float:
    """The multiplier of the longest prefix in ``scales`` that ``name`` starts with (1 if none)."""
    best = max((p for p in scales if name.startswith(p)), key=len, default=None)
    return 1.0 if best is None else scales[best]


def _scaled(group: dict, named: list[tuple[str, nn.Parameter]], scales: dict[str, float]) -> list[dict]:
    """``group`` split by lr scale (``OptimConfig.lr_scales``): one group per distinct scale."""
    by_scale: dict[float, list[nn.Parameter]] = {}
    for name, p in named:
        by_scale.setdefault(_lr_scale(name, scales), []).append(p)
    out = []
    for scale, params in sorted(by_scale.items(), reverse=True):
        suffix = "" if scale == 1.0 else f"@x{scale:g}"
        out.append({**group, "params": params, "base_lr": group["base_lr"] * scale, "name": group["name"] + suffix})
    return out


def build_optimizer(model: nn.Module, cfg: OptimConfig) -> torch.optim.Optimizer | CombinedOptimizer:
    """The optimiser of ``cfg.name``; every group records its peak lr as ``base_lr`` (times its
    ``cfg.lr_scales`` multiplier).

    Args:
        model: the (unwrapped) model.
        cfg: optimiser settings.
    """
    device = next(model.parameters()).device
    parts = split_parameters(model)
    no_decay = [p for _, p in parts["embedding"]] + [p for _, p in parts["other"]]
    matrices = [p for _, p in parts["matrix"]]
    if cfg.name == "adamw":
        groups = _scaled({"weight_decay": cfg.weight_decay, "base_lr": cfg.lr, "name": "matrix"},
                         parts["matrix"], cfg.lr_scales)
        groups += _scaled({"weight_decay": 0.0, "base_lr": cfg.lr, "name": "no_decay"},
                          parts["embedding"] + parts["other"], cfg.lr_scales)
        return _adamw([g for g in groups if g["params"]], cfg, device)
    muon = torch.optim.Muon(
        [{"params": matrices, "base_lr": cfg.muon_lr, "name": "muon"}],
        lr=cfg.muon_lr,
        weight_decay=cfg.weight_decay,
    )
    adamw = _adamw([{"params": no_decay, "weight_decay": 0.0, "base_lr": cfg.lr, "name": "no_decay"}], cfg, device)
    return CombinedOptimizer([muon, adamw])


def lr_factor(step: int, max_steps: int, cfg: ScheduleConfig) -> float:
    """Multiplier of the peak lr at optimiser step ``step`` (0-based).

    cosine: ``s/w`` during warm-up, then ``m + (1-m)(1+cos(pi*t))/2`` with ``t`` the post-warm-up
    progress; wsd: flat at 1 until the last ``decay_frac`` steps, then linear to ``m``.
    """
    warmup = int(round(cfg.warmup * max_steps)) if cfg.warmup < 1 else int(cfg.warmup)
    if step < warmup:
        return (step + 1) / warmup
    m = cfg.min_lr_ratio
    if cfg.name == "constant":
        return 1.0
    if cfg.name == "wsd":
        decay_start = max(warmup, int(max_steps * (1.0 - cfg.decay_frac)))
        if step < decay_start:
            return 1.0
        t = (step - decay_start + 1) / max(1, max_steps - decay_start)
        return 1.0 - (1.0 - m) * min(1.0, t)
    t = min(1.0, (step - warmup) / max(1, max_steps - warmup))
    return m + (1.0 - m) * 0.5 * (1.0 + math.cos(math.pi * t))


def set_lr(optimizer, factor: float) -> float:
    """Set every group's lr to ``base_lr * factor``; returns the first group's lr (for logging)."""
    for group in optimizer.param_groups:
        group["lr"] = group["base_lr"] * factor
    return optimizer.param_groups[0]["lr"]
