"""Normalisation layers."""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn


class RMSNorm(nn.Module):
    """Root-mean-square layer norm (Zhang & Sennrich 2019, arXiv:1910.07467).

    ``y = x / sqrt(mean(x^2) + eps) * weight``, computed in fp32 and cast back, as in
    transformers' Llama and LFM2 so that parity tests hold to 1e-6.

    Args:
        dim: size of the last axis.
        eps: added to the mean square.
    Shapes:
        x: ``[..., dim]`` -> ``[..., dim]``.
    """

    def __init__(self, dim: int, eps: float = 1e-6) -> None:
        super().__init__()
        self.eps = eps
        self.weight = nn.Parameter(torch.ones(dim))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if x.dtype == torch.float32 and self.weight.dtype == torch.float32:
            return F.rms_norm(x, self.weight.shape, self.weight, self.eps)  # one fused kernel
        return self.weight * F.rms_norm(x.float(), self.weight.shape, None, self.eps).to(x.dtype)

    def extra_repr(self) -> str:
        return f"{self.weight.shape[0]}, eps={self.eps}"
