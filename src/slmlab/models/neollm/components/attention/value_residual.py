"""The value residual of NeoLLM (``use_fan_residual``; ResFormer: Zhou et al., "Value Residual
Learning", arXiv 2410.17897; ``docs/neollm-residual.md#value-residual``).

Layer 0 hands its raw ``v_proj`` output ``V_0`` to later layers through the residual state
(``ResidualState.v0``); a layer ``n ≥ 1`` uses ``Ṽ_n = λ₁·V_n + λ₂·V_0`` (``λ`` init 0.5 each, fp32)
everywhere after ``v_proj`` (IHA, cache, XSA). ``V_0`` is recomputed by layer 0 at every decoding
step, so nothing extra is cached.
"""

from __future__ import annotations

import torch
from torch import nn


class NoValueResidual(nn.Module):
    """The "off" switch (``use_fan_residual=False``): v unchanged, the residual state untouched.
    Shapes: v ``[B, T, H_c, D]`` -> v."""

    def forward(self, v, carry=None):
        return v


class ValueResidualSource(nn.Module):
    """Layer 0: v unchanged; writes ``carry.v0 = v`` for the layers above (when a state is given)."""

    def forward(self, v, carry=None):
        if carry is not None:
            carry.v0 = v
        return v


class ValueResidualMix(nn.Module):
    """Layers ``n ≥ 1``: ``Ṽ = λ₁ v + λ₂ v0``; ``value_residual_lambda`` ``[2]`` init ``(0.5, 0.5)``.

    Raises:
        ValueError: if the residual state carries no ``v0`` (layer 0 did not run first).
    """

    def __init__(self) -> None:
        super().__init__()
        self.value_residual_lambda = nn.Parameter(torch.full((2,), 0.5))

    @classmethod
    def from_config(cls, config, layer_idx: int) -> nn.Module:
        """:class:`NoValueResidual` when ``use_fan_residual`` is off, the source on layer 0, else the mix."""
        if not config.use_fan_residual:
            return NoValueResidual()
        return ValueResidualSource() if layer_idx == 0 else cls()

    def reset_parameters_with(self, init_module) -> None:
        init_module.constant_(self.value_residual_lambda, 0.5)

    def forward(self, v, carry=None):
        v0 = None if carry is None else carry.v0
        if v0 is None:
            raise ValueError("use_fan_residual=True: layers >= 1 need v0, written into the residual state by layer 0")
        lam = self.value_residual_lambda
        return (lam[0] * v.float() + lam[1] * v0.float()).to(v.dtype)


def make_value_residual(enabled: bool, layer_idx: int) -> nn.Module:
    """Kept for callers of the earlier API; new code uses :meth:`ValueResidualMix.from_config`."""
    if not enabled:
        return NoValueResidual()
    return ValueResidualSource() if layer_idx == 0 else ValueResidualMix()
