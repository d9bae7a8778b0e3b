"""LAUREL, the learned augmented residual (Menghani, Kumar & Kumar, "LAuReL: Learned Augmented
Residual Layer", arXiv 2411.07501), as a residual flow of the standard pre-norm topology.

For each sublayer (attention and MLP, separately) with ``x`` the un-normalised stream entering it and
``f`` its (dropped-out) output, the plain ``x + f`` becomes (``docs/neollm-residual.md#laurel``):

* RW (``use_laurel_rw``): ``α f + β x`` with ``(α, β) = softmax([α̃, β̃])``, logits fp32, init 0
  (``α = β = ½``);
* LR (``use_laurel_lr``): ``f + x + (x·A)·B`` with ``A ∈ R^{D×r}``, ``B ∈ R^{r×D}``,
  ``r = laurel_lr_rank``, ``A[i, j] = 1/sqrt(r·D)`` iff ``i mod r == j`` and ``B = 0`` (the row
  convention: the seed's "B A x" does not type-check with these shapes);
* RW+LR: ``α f + β (x + (x·A)·B)``.

Each part is a module chosen at construction with an identity twin, so the combination is
``weights(f, low_rank(x))``. Parameters per layer: 4 (RW) and ``2·2·r·D`` (LR; 65,536 at r = 32,
D = 512). Position-wise, no state across time.
"""

from __future__ import annotations

import math

import torch
from torch import nn

from .context import ResidualState
from .residual import PreNormResidual


def laurel_a_init(dim: int, rank: int) -> torch.Tensor:
    """``A[i, j] = 1/sqrt(r·D)`` where ``i mod r == j``, else 0 (``[D, r]``)."""
    a = torch.zeros(dim, rank)
    a[torch.arange(dim), torch.arange(dim) % rank] = 1.0 / math.sqrt(rank * dim)
    return a


class LaurelLowRank(nn.Module):
    """LR: ``x ↦ x + (x·A)·B`` (``A [D, r]``, ``B [r, D]``, the branch is 0 at init because ``B = 0``).

    Shapes:
        x ``[B, T, D]`` -> ``[B, T, D]``.
    """

    def __init__(self, dim: int, rank: int) -> None:
        super().__init__()
        self.lr_a = nn.Parameter(laurel_a_init(dim, rank))
        self.lr_b = nn.Parameter(torch.zeros(rank, dim))

    def reset_parameters_with(self, init_module) -> None:
        init_module.copy_(self.lr_a, laurel_a_init(*self.lr_a.shape).to(self.lr_a.device))
        init_module.zeros_(self.lr_b)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x + (x @ self.lr_a.to(x.dtype)) @ self.lr_b.to(x.dtype)


class NoLowRank(nn.Module):
    """LR off: ``x ↦ x``."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x


class LaurelWeights(nn.Module):
    """RW: ``(f, x) ↦ α f + β x``, ``(α, β) = softmax(logits)``, logits ``[2]`` fp32 init 0."""

    def __init__(self) -> None:
        super().__init__()
        self.rw_logits = nn.Parameter(torch.zeros(2, dtype=torch.float32))

    def reset_parameters_with(self, init_module) -> None:
        init_module.zeros_(self.rw_logits)

    def forward(self, f: torch.Tensor, x: torch.Tensor) -> torch.Tensor:
        # α f + β x with α + β = 1 is x + α (f − x): one fused lerp instead of two scales and an add
        alpha = self.rw_logits.float().softmax(0)[0].to(f.dtype)
        return torch.lerp(x, f, alpha)


class PlainSum(nn.Module):
    """RW off: ``(f, x) ↦ f + x``."""

    def forward(self, f: torch.Tensor, x: torch.Tensor) -> torch.Tensor:
        return f + x


class LaurelCombine(nn.Module):
    """One sublayer's LAUREL combination ``weights(f, low_rank(x))``.

    Args:
        dim: ``D``; rank: ``r``; rw / lr: build the RW / LR parts.
    """

    def __init__(self, dim: int, rank: int, rw: bool, lr: bool) -> None:
        super().__init__()
        self.low_rank = LaurelLowRank(dim, rank) if lr else NoLowRank()
        self.weights = LaurelWeights() if rw else PlainSum()

    def forward(self, x: torch.Tensor, f: torch.Tensor) -> torch.Tensor:
        return self.weights(f, self.low_rank(x))


class LaurelResidual(PreNormResidual):
    """The pre-norm flow with LAUREL combinations: ``h ← combine_k(h, f)`` for sublayer ``k``
    (0 attention, 1 MLP), where ``h`` is the stream before the sublayer's pre-norm.

    Args:
        dim, layer_idx, eps, input_norm: as :class:`PreNormResidual`.
        rank: ``laurel_lr_rank``; rw / lr: ``use_laurel_rw`` / ``use_laurel_lr``.
    Shapes:
        state.streams ``(h,)`` with ``h [B, T, D]``.
    """

    def __init__(self, dim: int, layer_idx: int, eps: float = 1e-6, input_norm: bool = True, *, rank: int = 32,
                 rw: bool = False, lr: bool = False) -> None:
        super().__init__(dim, layer_idx, eps, input_norm)
        self.laurel = nn.ModuleList(LaurelCombine(dim, rank, rw, lr) for _ in range(2))

    @classmethod
    def from_config(cls, config, layer_idx: int) -> LaurelResidual:
        return cls(
            config.hidden_size, layer_idx, config.rms_norm_eps, config.use_embedding_input_norm,
            rank=config.laurel_lr_rank, rw=config.use_laurel_rw, lr=config.use_laurel_lr,
        )

    def attn_input(self, state: ResidualState) -> torch.Tensor:
        state.sublayer = 0
        return super().attn_input(state)

    def mlp_input(self, state: ResidualState) -> torch.Tensor:
        state.sublayer = 1
        return super().mlp_input(state)

    def add(self, state: ResidualState, update: torch.Tensor) -> None:
        state.streams = (self.laurel[state.sublayer](state.streams[0], update),)


__all__ = ["LaurelCombine", "LaurelLowRank", "LaurelResidual", "LaurelWeights", "NoLowRank", "PlainSum", "laurel_a_init"]
