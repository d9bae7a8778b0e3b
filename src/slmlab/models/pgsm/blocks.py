"""The PGSM backbone block: causal depthwise conv state mixing plus a SiLU-gated MLP (seed 001).

Parameter names equal the seed's (``norm_state``, ``local_state.conv``, ``state_mix``,
``state_gate``, ``norm_ff``, ``ff_in``, ``ff_out``), so its state_dicts load unchanged.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn
from transformers.modeling_layers import GradientCheckpointingLayer

from ...layers import CausalDepthwiseConv1d, ConvState


class CausalLocalState(nn.Module):
    """Causal depthwise convolution over a ``[B, T, D]`` stream: ``y_t = b + Σ_k w_k x_{t-K+1+k}``.

    A thin wrapper that keeps the seed's parameter path (``local_state.conv.weight``) around the shared
    :class:`~slmlab.layers.CausalDepthwiseConv1d`, which streams one token in O(K·D) with a
    :class:`ConvState`.

    Args:
        dim: channels ``D``.
        kernel_size: ``K``.
    Shapes:
        x ``[B, T, D]`` -> ``[B, T, D]``.
    """

    def __init__(self, dim: int, kernel_size: int) -> None:
        super().__init__()
        self.conv = CausalDepthwiseConv1d(dim, kernel_size)

    def forward(self, x: torch.Tensor, state: ConvState | None = None) -> torch.Tensor:
        return self.conv(x.transpose(1, 2), state).transpose(1, 2)


class ParallelGeometricBlock(GradientCheckpointingLayer):
    """Attention-free "parallel geometric" block of PGSM (seed 001).

    ``h = LN(x)``; ``x ← x + tanh(W_mix · conv(h)) ⊙ σ(W_gate · h)``;
    ``x ← x + W_out (SiLU(g) ⊙ v)`` with ``[v, g] = W_in · LN(x)``.
    Padded positions are zeroed before the convolution, so padding never enters the conv state.

    Args:
        dim: model width ``D``.
        hidden: MLP inner width.
        kernel_size: conv width ``K``.
        dropout: dropout on both residual branches.
    Shapes:
        x ``[B, T, D]``, keep ``[B, T, 1]`` (1 = real token, 0 = padding) -> ``[B, T, D]``.
    """

    def __init__(self, dim: int, hidden: int, kernel_size: int, dropout: float = 0.0) -> None:
        super().__init__()
        self.norm_state = nn.LayerNorm(dim)
        self.local_state = CausalLocalState(dim, kernel_size)
        self.state_mix = nn.Linear(dim, dim)
        self.state_gate = nn.Linear(dim, dim)
        self.drop_state = nn.Dropout(dropout)
        self.norm_ff = nn.LayerNorm(dim)
        self.ff_in = nn.Linear(dim, 2 * hidden)
        self.ff_out = nn.Linear(hidden, dim)
        self.drop_ff = nn.Dropout(dropout)

    def forward(self, x: torch.Tensor, keep: torch.Tensor, state: ConvState | None = None) -> torch.Tensor:
        h = self.norm_state(x)
        local = self.local_state(h * keep, state)
        x = x + self.drop_state(torch.tanh(self.state_mix(local)) * torch.sigmoid(self.state_gate(h)))
        value, gate = self.ff_in(self.norm_ff(x)).chunk(2, dim=-1)
        return x + self.drop_ff(self.ff_out(F.silu(gate) * value))


class IdentityBlock(nn.Module):
    """The "off" post-retrieval block (``use_post_retrieval_block=False``): returns ``x``."""

    def forward(self, x: torch.Tensor, keep: torch.Tensor, state: ConvState | None = None) -> torch.Tensor:
        return x
