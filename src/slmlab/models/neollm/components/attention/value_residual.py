"""The FAN value-residual hook (ResFormer value residual: Zhou et al., "Value Residual Learning",
arXiv 2410.17897; residual spec §6, attention spec §1 step 2).

Layer 0 hands its raw ``v_proj`` output ``V_0`` to later layers; a layer ``n ≥ 1`` uses
``Ṽ_n = λ₁·V_n + λ₂·V_0`` (``λ`` init 0.5 each, fp32) everywhere after ``v_proj`` (IHA, cache, XSA).
``V_0`` is recomputed by layer 0 at every decoding step, so nothing extra is cached.
"""

from __future__ import annotations

import torch
from torch import nn


class NoValueResidual(nn.Module):
    """The "off" switch (``use_fan_residual=False``): v unchanged, no side channel.
    Shapes: v ``[B, T, H_c, D]`` -> (v, None)."""

    def forward(self, v, v0):
        return v, None


class ValueResidualSource(nn.Module):
    """Layer 0: v unchanged, and ``v0_out = v`` for the layers above."""

    def forward(self, v, v0):
        return v, v


class ValueResidualMix(nn.Module):
    """Layers ``n ≥ 1``: ``Ṽ = λ₁ v + λ₂ v0``; ``value_residual_lambda`` ``[2]`` init ``(0.5, 0.5)``.

    Raises:
        ValueError: if no ``v0`` arrives (the decoder must pass layer 0's ``v0_out`` on).
    """

    def __init__(self) -> None:
        super().__init__()
        self.value_residual_lambda = nn.Parameter(torch.full((2,), 0.5))

    def reset_parameters_with(self, init_module) -> None:
        init_module.constant_(self.value_residual_lambda, 0.5)

    def forward(self, v, v0):
        if v0 is None:
            raise ValueError("use_fan_residual=True: layers >= 1 need v0, the v0_out returned by layer 0")
        lam = self.value_residual_lambda
        return (lam[0] * v.float() + lam[1] * v0.float()).to(v.dtype), None


def make_value_residual(enabled: bool, layer_idx: int) -> nn.Module:
    if not enabled:
        return NoValueResidual()
    return ValueResidualSource() if layer_idx == 0 else ValueResidualMix()
