"""The end of a NeoLLM attention block: the gated-attention output gate and the output projection.

* :class:`OutputGate` — Qiu et al., "Gated Attention for Large Language Models", arXiv 2505.06708
  (docs/neollm-attention.md#order-of-operations): ``o ⊙ σ(gate)``, the gate being the second half of each head's ``q_proj`` slice (our decision);
  always on (no flag), no parameters of its own.
* :class:`HadamardOutput` — Aggarwal & Kumar, "Rethinking Attention Output Projection: Structured
  Hadamard Transforms for Efficient Transformers", arXiv 2603.08343 (docs/neollm-attention.md#order-of-operations):
  ``y = α ⊙ FWHT(o)/√n + β`` with the unnormalised Sylvester Walsh–Hadamard transform, ``n = H·D``.
* :func:`dense_output` — the dense ``o_proj`` with row + column learnable multipliers.
"""

from __future__ import annotations

import math

import torch
from torch import nn

from ..multipliers import multiplied_linear


class OutputGate(nn.Module):
    """Shapes: o, gate ``[B, T, H, D]`` -> ``[B, T, H, D]``."""

    @classmethod
    def from_config(cls, config, layer_idx: int) -> OutputGate:
        """Always on (no flag)."""
        return cls()

    def forward(self, o: torch.Tensor, gate: torch.Tensor) -> torch.Tensor:
        return o * torch.sigmoid(gate)


def fwht(x: torch.Tensor) -> torch.Tensor:
    """Reference O(n log n) butterfly: the unnormalised Sylvester-order Walsh–Hadamard transform
    of the last axis (length a power of two)."""
    n = x.shape[-1]
    lead = x.shape[:-1]
    h = 1
    while h < n:
        y = x.reshape(*lead, n // (2 * h), 2, h)
        x = torch.stack((y[..., 0, :] + y[..., 1, :], y[..., 0, :] - y[..., 1, :]), dim=-2).reshape(*lead, n)
        h *= 2
    return x


def hadamard_matrix(n: int, device=None, dtype=torch.float32) -> torch.Tensor:
    """Sylvester ``H_n`` (``±1``, symmetric): ``H[i, j] = (−1)^{popcount(i & j)}``."""
    idx = torch.arange(n, device=device)
    both = idx[:, None] & idx[None, :]
    parity = torch.zeros_like(both)
    for _ in range((n - 1).bit_length()):  # i & j < n: this many bits (a static count, so graphs capture it)
        parity ^= both & 1
        both = both >> 1
    return (1 - 2 * parity).to(dtype)


class HadamardOutput(nn.Module):
    """Fixed orthogonal mixing ``H_n/√n`` plus a learned per-channel affine (α init 1, β init 0).

    The ``±1`` matrix is built on first use per device/dtype (never a buffer, so a meta-device
    build stays valid) and applied as one matmul; :func:`fwht` is the butterfly it must equal.

    Args:
        width: ``n = H·D`` (a power of two).
        hidden_size: ``d`` (must equal ``n``: the transform is square).
    Shapes:
        o ``[B, T, n]`` -> ``[B, T, d]``.
    Raises:
        ValueError: ``n`` not a power of two, or ``n != d``.
    """

    def __init__(self, width: int, hidden_size: int) -> None:
        super().__init__()
        if width <= 0 or width & (width - 1):
            raise ValueError(
                f"use_hadamard_o_proj needs num_attention_heads * head_dim to be a power of two, got {width}"
            )
        if width != hidden_size:
            raise ValueError(
                f"use_hadamard_o_proj needs num_attention_heads * head_dim ({width}) == hidden_size ({hidden_size}); "
                "set use_hadamard_o_proj=False for a dense o_proj"
            )
        self.width = width
        self.alpha = nn.Parameter(torch.ones(hidden_size))
        self.beta = nn.Parameter(torch.zeros(hidden_size))
        self._matrix: torch.Tensor | None = None

    @classmethod
    def from_config(cls, config, layer_idx: int) -> nn.Module:
        """The Hadamard output when ``use_hadamard_o_proj``, else the dense ``o_proj`` (its twin)."""
        width = config.num_attention_heads * config.head_dim
        if not config.use_hadamard_o_proj:
            return dense_output(width, config.hidden_size, config.use_learnable_multipliers, config.attention_bias)
        return cls(width, config.hidden_size)

    def reset_parameters_with(self, init_module) -> None:
        init_module.ones_(self.alpha)
        init_module.zeros_(self.beta)

    def matrix(self, device, dtype) -> torch.Tensor:
        if torch.compiler.is_compiling():  # a traced tensor must not outlive the trace: build, never cache
            return (hadamard_matrix(self.width, device, torch.float32) / math.sqrt(self.width)).to(dtype)
        m = self._matrix
        if m is None or m.device != device or m.dtype != dtype:
            with torch.inference_mode(False):  # built under inference_mode, it could never join a backward later
                m = (hadamard_matrix(self.width, device, torch.float32) / math.sqrt(self.width)).to(dtype)
            self._matrix = m
        return m

    def forward(self, o: torch.Tensor) -> torch.Tensor:
        return self.alpha.to(o.dtype) * (o @ self.matrix(o.device, o.dtype)) + self.beta.to(o.dtype)


def dense_output(width: int, hidden_size: int, multipliers: bool, bias: bool) -> nn.Module:
    """Dense ``o_proj: R^{H·D} → R^d`` with row + column multipliers when ``multipliers``."""
    return multiplied_linear(width, hidden_size, row=True, col=True, enabled=multipliers, bias=bias)
