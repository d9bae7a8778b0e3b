"""Affine-scaled attention (Bae et al., "Affine-Scaled Attention: Towards Flexible and Stable
Transformer Attention", arXiv 2602.23057), ``docs/neollm-attention.md#affine-scaled-softmax``.

The softmax weights get a query-dependent scale and a compensating bias:
``o_i = Σ_j [α_i·A_ij + β_i]·v_j`` over the keys ``j`` visible to query ``i``, with
``A = softmax(QKᵀ/√D)`` (dropout on ``A`` while training), ``β_i = (α_ma − α_i)/N_i`` and ``N_i`` the
number of keys (pseudo-keys under IHA) visible to ``i`` — never on masked keys, which would leak the
future. Each row of ``αA + β`` sums to ``α_ma``. Our parameterisation: ``α_{t,h} = 2σ(x_t W_α + b)_h``
per query head (``W_α``, ``b`` init 0, so ``α = 1``; shared by the IHA slots of a head) and a
persistent buffer ``α_ma ∈ R^H`` (init 1).

The same output is ``α_i·SDPA(q, K, V)_i + (α_ma − α_i)·mean_{j visible}(v_j)``: the fused path
(``ATTENTION_FUNCTIONS["affine"]``) computes exactly that, with the visible mean given by the core
from prefix sums over tokens (:func:`visible_token_mean`, ``O(S·D)`` also under a window); ``"affine_eager"`` materialises the
probabilities (``attn_implementation="eager"``). The entries live in ``functions.py``.

``α_ma`` is an exponential moving average of the batch-mean ``α``: after β used its entry value,
once per forward call in training, ``α_ma ← ρ α_ma + (1−ρ)·mean_{b, real t}(α)`` under ``no_grad``
(all-reduced across ranks when ``torch.distributed`` is initialised); frozen in eval, where
decode == prefill holds. Under gradient checkpointing the layer's recomputation in backward reuses
the entry value and skips the update (:mod:`..recompute`), so a step updates ``α_ma`` once and
gives the plain backward's gradients. Parameters ``d·H + H`` (4,104 per layer at the seed defaults).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.distributed as dist
from torch import nn

from ..recompute import current_run


@dataclass(frozen=True)
class AffineTerms:
    """``alpha [B, T, H]`` (fp32), the ``alpha_ma [H]`` this call uses (the entry value) and, once the
    core has computed it, the visible mean ``[B, H_kv, T, D]`` of the fresh tokens (blocked path)."""

    alpha: torch.Tensor
    alpha_ma: torch.Tensor
    mean: torch.Tensor | None = None


def visible_token_mean(
    values: torch.Tensor, valid: torch.Tensor | None, q_len: int, window: int | torch.Tensor | None
) -> torch.Tensor:
    """Mean of the values each query token may read, by prefix sums over tokens (``O(S·D)``), fp32.

    Query token ``i`` is key token ``S − q_len + i``; it reads key tokens ``s ≤ i`` with ``i − s < W``
    (no lower bound without a window) that are real (``valid``), all ``P`` slots of each (the IHA
    mask is token-level). A query that reads nothing (a pad row) gets 0.

    Args:
        values: ``[B, H_kv, S, P, D]``; valid: ``[B, S]`` bool or None; q_len: ``T``; window: ``W``, one
            window per row (``[B]``) or None.
    Returns:
        ``[B, H_kv, T, D]``.
    """
    b, _, s, p, _ = values.shape
    w = torch.ones(b, s, device=values.device) if valid is None else valid.float()
    per_token = values.float().sum(3) * w[:, None, :, None]
    zero = per_token.new_zeros(per_token[:, :, :1].shape)
    sums = torch.cat((zero, per_token.cumsum(2)), dim=2)  # [B, H_kv, S + 1, D]
    counts = torch.cat((w.new_zeros(b, 1), w.cumsum(1)), dim=1)  # [B, S + 1]
    hi = torch.arange(s - q_len + 1, s + 1, device=values.device)
    if isinstance(window, torch.Tensor):  # one window per row: gather each row's lower ends
        lo = (hi[None] - window.to(hi.device)[:, None]).clamp(min=0)  # [B, T]
        n = (counts[:, hi] - counts.gather(1, lo)) * p
        low_sums = sums.gather(2, lo[:, None, :, None].expand(-1, sums.shape[1], -1, sums.shape[-1]))
        return (sums[:, :, hi] - low_sums) / n.clamp(min=1.0)[:, None, :, None]
    lo = torch.zeros_like(hi) if window is None else (hi - window).clamp(min=0)
    n = (counts[:, hi] - counts[:, lo]) * p
    return (sums[:, :, hi] - sums[:, :, lo]) / n.clamp(min=1.0)[:, None, :, None]


class AffineScale(nn.Module):
    """Args:
        hidden_size: ``d``; num_heads: ``H``; momentum: ``ρ = affine_momentum``.
    Shapes:
        x ``[B, T, d]``, attention_mask ``[B, past + T]`` or None -> :class:`AffineTerms`.
    """

    def __init__(self, hidden_size: int, num_heads: int, momentum: float) -> None:
        super().__init__()
        self.momentum = float(momentum)
        self.proj = nn.Linear(hidden_size, num_heads)
        self.register_buffer("alpha_ma", torch.ones(num_heads), persistent=True)
        self.reset_parameters_with(nn.init)

    @classmethod
    def from_config(cls, config, layer_idx: int) -> nn.Module:
        """The α network when ``use_affine_scaled_attention``, else :class:`NoAffine`."""
        if not config.use_affine_scaled_attention:
            return NoAffine()
        return cls(config.hidden_size, config.num_attention_heads, config.affine_momentum)

    def reset_parameters_with(self, init_module) -> None:
        """``W_α``, ``b`` at 0 and ``α_ma`` at 1 (a buffer ``from_pretrained`` loaded is kept)."""
        init_module.zeros_(self.proj.weight)
        init_module.zeros_(self.proj.bias)
        init_module.ones_(self.alpha_ma)

    def forward(self, x: torch.Tensor, attention_mask: torch.Tensor | None = None) -> AffineTerms:
        alpha = 2.0 * torch.sigmoid(self.proj(x).float())
        entry = self.alpha_ma.float().clone()
        run = current_run()
        if run is not None:  # checkpointed: the recomputation reuses the entry value, steps nothing
            entry = run.keep(self, entry)
        terms = AffineTerms(alpha, entry)
        if self.training and (run is None or not run.recomputing):
            self.update(alpha.detach(), attention_mask)
        return terms

    @torch.no_grad()
    def update(self, alpha: torch.Tensor, attention_mask: torch.Tensor | None) -> None:
        """One EMA step with the mean α over the real tokens of this call (across ranks when distributed)."""
        t = alpha.shape[1]
        w = torch.ones(alpha.shape[:2], device=alpha.device) if attention_mask is None else attention_mask[:, -t:].float()
        stats = torch.cat(((alpha * w[..., None]).sum((0, 1)), w.sum().reshape(1)))
        if dist.is_available() and dist.is_initialized():
            dist.all_reduce(stats)
        mean = stats[:-1] / stats[-1].clamp(min=1.0)
        self.alpha_ma.mul_(self.momentum).add_((1.0 - self.momentum) * mean.to(self.alpha_ma.dtype))


class NoAffine(nn.Module):
    """The "off" switch: no α (the attention function ignores the missing terms)."""

    def forward(self, x, attention_mask=None):
        return None


__all__ = ["AffineScale", "AffineTerms", "NoAffine", "visible_token_mean"]
