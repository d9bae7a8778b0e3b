"""Momentum Attention (Maitra, "Momentum Attention: The Physics of In-Context Learning and Spectral
Forensics for Mechanistic Interpretability", arXiv 2602.04902), docs/neollm-attention.md#momentum.

A causal first-difference shear of the rotated q and k along the token axis:
``q̂_t = q_t + γ·m_t·(q_t − q_{t−1})`` (same for k; values untouched). Boundary (our decision): ``m_t = 0`` when
the token has no predecessor in its own sequence — the first token of the stream, or
``position_ids[t] == 0`` (left padding, packed sequences) — else 1. In decoding the previous
token's rotated, pre-shear q/k come from the layer state, so decode == prefill exactly.
"""

from __future__ import annotations

import torch
from torch import nn


class MomentumShear(nn.Module):
    """Args:
        gamma: ``momentum_gamma`` (a constant, no parameters).
    Shapes:
        q ``[B, T, H, P, D]``, k ``[B, T, H_kv, P, D]``, position_ids ``[B, T]``; state: a
        :class:`NeoLLMAttentionState` or None -> sheared q, k (same shapes).
    """

    def __init__(self, gamma: float) -> None:
        super().__init__()
        self.gamma = float(gamma)

    @classmethod
    def from_config(cls, config, layer_idx: int) -> nn.Module:
        """The shear with ``momentum_gamma`` when ``use_momentum_attention``, else :class:`NoMomentum`."""
        return cls(config.momentum_gamma) if config.use_momentum_attention else NoMomentum()

    def forward(self, q, k, position_ids, state=None):
        b = q.shape[0]
        if state is not None and state.prev_q is not None:
            q0, k0, has_prev = state.prev_q, state.prev_k, state.has_prev
        else:
            q0, k0 = torch.zeros_like(q[:, :1]), torch.zeros_like(k[:, :1])
            has_prev = torch.zeros(b, dtype=torch.bool, device=q.device)
        q_prev = torch.cat((q0, q[:, :-1]), dim=1)
        k_prev = torch.cat((k0, k[:, :-1]), dim=1)
        first = torch.cat((has_prev[:, None], torch.ones_like(position_ids[:, 1:], dtype=torch.bool)), dim=1)
        # (1 + γm) q_t − γm q_{t−1} = lerp(q_{t−1}, q_t, 1 + γm): one fused pass per tensor.
        w = 1.0 + (first & (position_ids != 0)).to(q.dtype)[:, :, None, None, None] * self.gamma
        if state is not None:
            state.prev_q, state.prev_k = q[:, -1:], k[:, -1:]
            state.has_prev = torch.ones(b, dtype=torch.bool, device=q.device)
        return torch.lerp(q_prev, q, w), torch.lerp(k_prev, k, w)


class NoMomentum(nn.Module):
    """The "off" switch: q and k pass through."""

    def forward(self, q, k, position_ids, state=None):
        return q, k
