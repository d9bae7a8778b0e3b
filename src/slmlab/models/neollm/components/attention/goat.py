"""REPO-GOAT attention prior (Litman & Guo, "You Need Better Attention Priors", arXiv 2601.15380),
``docs/neollm-attention.md#goat-prior``.

GOAT reads softmax attention as entropic optimal transport with an implicit uniform prior and
replaces that prior by a learned log-prior ``K(i, j)`` added to the logits. Here (our decisions) the
prior lives on REPO layers, uses the REPO coordinate ``u_i = z_i^{(g)}`` of the query's KV group
``g`` and is written as ``2F + 2`` extra q/k channels appended after the momentum shear, so any
dot-product kernel computes it:

* relative part (``2F`` channels), ``ω_f = θ^{−f / max(F−1, 1)}`` (``θ = rope_theta``):
  q ``[λ⁺ cos ω u_i + λ⁻ sin ω u_i, λ⁺ sin ω u_i − λ⁻ cos ω u_i]``, k ``[cos ω u_j, sin ω u_j]``,
  whose product is ``Σ_f λ⁺_f cos ω_f(u_i − u_j) + λ⁻_f sin ω_f(u_i − u_j)`` (translation-equivariant);
* sink channel: q ``c_g``, k ``exp(−pos_j / repo_goat_sink_decay)`` (``pos`` = integer position id);
* key-bias channel: q ``1``, k ``tanh(r_j · w_u^{(g)})`` with ``r_j`` the REPO features.

The q-side channels are multiplied by ``√D`` and the kernel scale is ``1/√D`` (not ``1/√(D+2F+2)``),
so ``logit = q·k/√D + K(i, j)``. Values keep ``D`` channels. ``λ⁺, λ⁻, c, w_u`` start at 0: the prior
is 0 at init. Momentum, LUCID, XSA and the MEA norm only see the first ``D`` (content) channels; the
cache holds the ``D + 2F + 2``-channel keys. Parameters ``H_kv·(2F + 1 + d_p)`` per REPO layer.
"""

from __future__ import annotations

import math

import torch
from torch import nn


class GoatPrior(nn.Module):
    """Args:
        num_heads: ``H``; num_kv_heads: ``H_kv``; head_dim: ``D``; num_frequencies: ``F``;
        d_p: REPO feature width; sink_decay: ``repo_goat_sink_decay``; theta: ``rope_theta``.
    Shapes:
        q ``[B, T, H, P, D]``, k ``[B, T, H_kv, P, D]``, coords ``(r [B, T, d_p], z [B, T, H_kv])``,
        position_ids ``[B, T]`` -> q, k with ``D + 2F + 2`` channels.
    """

    def __init__(
        self, num_heads: int, num_kv_heads: int, head_dim: int, num_frequencies: int, d_p: int, sink_decay: float,
        theta: float,
    ) -> None:
        super().__init__()
        f = num_frequencies
        self.groups = num_heads // num_kv_heads
        self.q_scale = math.sqrt(head_dim)
        self.sink_decay = float(sink_decay)
        self.omegas = tuple(float(theta) ** (-i / max(f - 1, 1)) for i in range(f))
        self.cos_weight = nn.Parameter(torch.zeros(num_kv_heads, f))  # λ⁺
        self.sin_weight = nn.Parameter(torch.zeros(num_kv_heads, f))  # λ⁻
        self.sink_weight = nn.Parameter(torch.zeros(num_kv_heads))  # c
        self.key_bias = nn.Parameter(torch.zeros(num_kv_heads, d_p))  # w_u

    @classmethod
    def from_config(cls, config, layer_idx: int) -> nn.Module:
        """The prior on REPO layers when ``use_repo_goat_prior``, else :class:`NoGoat`."""
        if not (config.use_repo_goat_prior and config.is_repo_layer(layer_idx)):
            return NoGoat()
        return cls(
            config.num_attention_heads,
            config.num_key_value_heads,
            config.head_dim,
            config.repo_goat_num_frequencies,
            config.repo_d_p,
            config.repo_goat_sink_decay,
            config.rope_theta,
        )

    def reset_parameters_with(self, init_module) -> None:
        for p in (self.cos_weight, self.sin_weight, self.sink_weight, self.key_bias):
            init_module.zeros_(p)

    def channels(self, coords, position_ids) -> tuple[torch.Tensor, torch.Tensor]:
        """q-side ``[B, T, H_kv, 2F+2]`` (not yet scaled by √D) and k-side ``[B, T, H_kv, 2F+2]`` channels, fp32."""
        r, z = coords
        omega = torch.tensor(self.omegas, device=z.device, dtype=torch.float32)
        ang = z.float()[..., None] * omega  # [B, T, Hk, F]
        cos, sin = ang.cos(), ang.sin()
        lp, lm = self.cos_weight.float(), self.sin_weight.float()
        sink = torch.exp(-position_ids.float() / self.sink_decay)[:, :, None, None].expand(*z.shape, 1)
        bias = torch.tanh(r.float() @ self.key_bias.float().T)[..., None]
        ones = torch.ones_like(bias)
        q_side = torch.cat((lp * cos + lm * sin, lp * sin - lm * cos, self.sink_weight.float().expand_as(z)[..., None], ones), -1)
        k_side = torch.cat((cos, sin, sink, bias), -1)
        return q_side, k_side

    def forward(self, q, k, coords, position_ids):
        q_side, k_side = self.channels(coords, position_ids)
        p = q.shape[3]
        q_side = (q_side * self.q_scale).repeat_interleave(self.groups, dim=2)[:, :, :, None].expand(-1, -1, -1, p, -1)
        k_side = k_side[:, :, :, None].expand(-1, -1, -1, p, -1)
        return torch.cat((q, q_side.to(q.dtype)), -1), torch.cat((k, k_side.to(k.dtype)), -1)


class NoGoat(nn.Module):
    """The "off" switch (also every non-REPO layer)."""

    def forward(self, q, k, coords, position_ids):
        return q, k


__all__ = ["GoatPrior", "NoGoat"]
