"""Directional routing (Taylor, "Directional Routing in Transformers", arXiv 2603.14923),
``docs/neollm-attention.md#directional-routing``.

Each query head owns ``K`` learned suppression directions ``U_{h,k} ∈ R^D`` (normalised on use,
``û = U/‖U‖``); a router shared by all heads reads the block input and decides, per token, how much
of each direction to remove:

``w_{t,h,k} = σ((x_t W_r + b_r)_{h,k} / τ)``,  ``o_{t,h} ← o_{t,h} − Σ_k w_{t,h,k} (o_{t,h}·û_{h,k}) û_{h,k}``.

It runs after XSA and before the output gate (our placement: both are per-head projections of the
kernel output). Init (our decision): ``U ~ N(0, 1)``, ``W_r`` truncated normal with the model's
``initializer_range``, ``b_r = 0`` (so ``w ≈ 0.5`` at init, a mild suppression). Per token, nothing
cached. Parameters ``H·K·D + d·H·K + H·K`` (18,464 per layer at the seed defaults).
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn


class DirectionalRouting(nn.Module):
    """Args:
        hidden_size: ``d`` (router input width); num_heads: ``H``; num_directions: ``K``;
        head_dim: ``D``; temperature: ``τ``; init_std: truncated-normal std of ``W_r``.
    Shapes:
        o ``[B, T, H, D]``, x ``[B, T, d]`` -> ``[B, T, H, D]``.
    """

    def __init__(
        self, hidden_size: int, num_heads: int, num_directions: int, head_dim: int, temperature: float, init_std: float
    ) -> None:
        super().__init__()
        self.num_heads, self.num_directions = num_heads, num_directions
        self.temperature = float(temperature)
        self.init_std = init_std
        self.directions = nn.Parameter(torch.empty(num_heads, num_directions, head_dim))
        self.router = nn.Linear(hidden_size, num_heads * num_directions)
        self.reset_parameters_with(nn.init)

    @classmethod
    def from_config(cls, config, layer_idx: int) -> nn.Module:
        """Routing when ``use_directional_routing``, else :class:`NoRouting`."""
        if not config.use_directional_routing:
            return NoRouting()
        return cls(
            config.hidden_size,
            config.num_attention_heads,
            config.directional_routing_k,
            config.head_dim,
            config.directional_routing_temp,
            config.initializer_range,
        )

    def reset_parameters_with(self, init_module) -> None:
        s = self.init_std
        init_module.normal_(self.directions, mean=0.0, std=1.0)
        init_module.trunc_normal_(self.router.weight, mean=0.0, std=s, a=-2 * s, b=2 * s)
        init_module.zeros_(self.router.bias)

    def forward(self, o: torch.Tensor, x: torch.Tensor) -> torch.Tensor:
        b, t, h, _ = o.shape
        w = torch.sigmoid(self.router(x).view(b, t, h, self.num_directions).float() / self.temperature)
        u = F.normalize(self.directions.float(), dim=-1)  # [H, K, D]
        of = o.float()
        coef = torch.einsum("bthd,hkd->bthk", of, u) * w
        return (of - torch.einsum("bthk,hkd->bthd", coef, u)).to(o.dtype)


class NoRouting(nn.Module):
    """The "off" switch."""

    def forward(self, o, x):
        return o


__all__ = ["DirectionalRouting", "NoRouting"]
