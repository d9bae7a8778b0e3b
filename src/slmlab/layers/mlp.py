"""Feed-forward layers."""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from .fused import ConcatenatedWeights, fusable, project_each


class SwiGLU(nn.Module):
    """Gated SiLU feed-forward (Shazeer 2020, arXiv:2002.05202).

    ``y = down_proj(silu(gate_proj(x)) * up_proj(x))``; names as in transformers' Llama. The gate and
    up projections run as one GEMM over their concatenated weights.

    Args:
        hidden_size: model width.
        intermediate_size: inner width.
        bias: whether the three projections have a bias.
    Shapes:
        x ``[B, T, hidden_size]`` -> ``[B, T, hidden_size]``.
    """

    def __init__(self, hidden_size: int, intermediate_size: int, bias: bool = False) -> None:
        super().__init__()
        self.gate_proj = nn.Linear(hidden_size, intermediate_size, bias=bias)
        self.up_proj = nn.Linear(hidden_size, intermediate_size, bias=bias)
        self.down_proj = nn.Linear(intermediate_size, hidden_size, bias=bias)
        self._gate_up = ConcatenatedWeights()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if not fusable(self.gate_proj, self.up_proj):  # e.g. LoRA-wrapped: each its own forward
            gate, up = project_each(x, self.gate_proj, self.up_proj).chunk(2, dim=-1)
            return self.down_proj(F.silu(gate) * up)
        w = self._gate_up(self.gate_proj.weight, self.up_proj.weight)
        b = None if self.gate_proj.bias is None else torch.cat((self.gate_proj.bias, self.up_proj.bias))
        gate, up = F.linear(x, w, b).chunk(2, dim=-1)
        return self.down_proj(F.silu(gate) * up)
