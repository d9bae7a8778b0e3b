"""Gradient-Preserving Activation Scaling, GPAS (Chen et al., "GPAS: Accelerating Convergence of LLM
Pretraining via Gradient-Preserving Activation Scaling", arXiv 2506.22049).

At every residual junction (after a sublayer's update has been added) the stream is scaled down in
the forward pass while its gradient passes unchanged: ``x ← x − SiLU(α)·sg(x)`` with ``sg`` the
stop-gradient. Forward value ``(1 − SiLU(α))·x``; ``∂x'/∂x = I``; ``α`` receives
``−SiLU'(α)·Σ g ⊙ x``. One fp32 scalar per junction, two per layer (after the attention add and
after the MLP add; the authors' code shares one per layer, we keep two), init 0 so the layer starts
as the identity. Which stream is the junction depends on the flow (``docs/neollm-residual.md#gpas``).
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn


class GPAS(nn.Module):
    """Two gates ``α = (α_attn, α_mlp)`` (fp32, init 0): ``x ↦ x − SiLU(α_k)·x.detach()``.

    Shapes:
        x ``[B, T, D]``, sublayer ``k ∈ {0, 1}`` -> same shape and dtype.
    """

    def __init__(self) -> None:
        super().__init__()
        self.alpha = nn.Parameter(torch.zeros(2, dtype=torch.float32))

    @classmethod
    def from_config(cls, config, layer_idx: int) -> nn.Module:
        """GPAS when ``use_gpas``, else :class:`NoGPAS`."""
        return cls() if config.use_gpas else NoGPAS()

    def reset_parameters_with(self, init_module) -> None:
        """Gates back to 0 (the identity) through ``transformers.initialization``."""
        init_module.zeros_(self.alpha)

    def forward(self, x: torch.Tensor, sublayer: int) -> torch.Tensor:
        return x - F.silu(self.alpha[sublayer]).to(x.dtype) * x.detach()


class NoGPAS(nn.Module):
    """GPAS off: the junction passes through."""

    def forward(self, x: torch.Tensor, sublayer: int) -> torch.Tensor:
        return x


__all__ = ["GPAS", "NoGPAS"]
