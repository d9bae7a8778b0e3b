"""LayerNorm Scaling, LNS (Sun et al., "The Curse of Depth in Large Language Models", arXiv 2502.05795).

Pre-norm stacks let the residual stream's variance grow with depth, so deep layers receive inputs
whose updates barely matter. LNS multiplies the output of every sublayer pre-norm of layer ``l``
(0-based) by ``1 / sqrt(l + 1)``: ``u ← u / sqrt(l + 1)``. It is a fixed constant, kept as a
non-persistent scalar buffer (no parameter, nothing in the state dict), applied to the sublayer
input of whichever residual flow is built (``docs/neollm-residual.md#lns``). Position-wise, no state.
"""

from __future__ import annotations

import math

import torch
from torch import nn


class LayerNormScaling(nn.Module):
    """``u ↦ u / sqrt(l + 1)`` for layer ``l``.

    Args:
        layer_idx: ``l`` (0-based).
    Shapes:
        u ``[B, T, D]`` -> same shape and dtype.
    """

    def __init__(self, layer_idx: int) -> None:
        super().__init__()
        self.register_buffer("scale", torch.tensor(1.0 / math.sqrt(layer_idx + 1)), persistent=False)

    @classmethod
    def from_config(cls, config, layer_idx: int) -> nn.Module:
        """LNS when ``use_lns``, else the identity."""
        return cls(layer_idx) if config.use_lns else nn.Identity()

    def forward(self, u: torch.Tensor) -> torch.Tensor:
        return u * self.scale.to(u.dtype)

    def extra_repr(self) -> str:
        return f"scale={float(self.scale):.6f}"


__all__ = ["LayerNormScaling"]
