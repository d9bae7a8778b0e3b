"""MLP activations of NeoLLM.

xIELU (Huang & Schlag, "Deriving Activation Functions Using Integration", arXiv 2411.13010):
``f(x) = α_p x² + β x`` for ``x > 0`` and ``α_n (expm1(min(x, ε)) − x) + β x`` otherwise, with
``α_p = softplus(a_p)``, ``α_n = β + softplus(a_n)``, ``β = 0.5`` and ``ε = −1e-6`` fixed. Same formula
as transformers' ``XIELUActivation`` (tested against it), but the two trainable scalars are created
and evaluated in fp32 regardless of the model dtype (transformers' class defaults to bf16).

PolyNorm (Zhuo et al., "Polynomial Composition Activations: Unleashing the Dynamics of Large Language
Models", arXiv 2411.03884): ``w₁N(x) + w₂N(x²) + w₃N(x³) + b`` with ``N`` an RMS normalisation
without affine; with ``polynorm_exclusive=True`` it is the only MLP nonlinearity (``hidden_act`` is
then ignored by the MLP).
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import nn
from transformers.activations import ACT2FN


def _inverse_softplus(y: float) -> float:
    return math.log(math.expm1(y))


class XIELU(nn.Module):
    """Trainable xIELU with fp32 scalars ``a_p``, ``a_n`` (2 parameters per instance).

    Args:
        alpha_p_init: initial ``α_p`` (0.8).
        alpha_n_init: initial ``α_n`` (0.8; stored as ``a_n = softplus⁻¹(α_n − β)``).
        beta: the fixed linear slope ``β`` (0.5).
        eps: the fixed clamp ``ε`` of the negative branch (−1e-6).
    Shapes:
        x ``[...]`` -> same shape and dtype (computed in fp32).
    Reference values at init: f(2) = 4.2, f(1) = 1.3, f(−1) = −0.2057.
    """

    def __init__(self, alpha_p_init: float = 0.8, alpha_n_init: float = 0.8, beta: float = 0.5, eps: float = -1e-6) -> None:
        super().__init__()
        if alpha_n_init <= beta:
            raise ValueError(f"alpha_n_init must exceed beta={beta}, got {alpha_n_init}")
        self.alpha_p_init, self.alpha_n_init = float(alpha_p_init), float(alpha_n_init)
        self.beta, self.eps = float(beta), float(eps)
        self.alpha_p = nn.Parameter(torch.tensor([_inverse_softplus(self.alpha_p_init)], dtype=torch.float32))
        self.alpha_n = nn.Parameter(torch.tensor([_inverse_softplus(self.alpha_n_init - self.beta)], dtype=torch.float32))

    def reset_parameters_with(self, init_module) -> None:
        """Restore the init values through ``transformers.initialization`` (respects loaded weights)."""
        init_module.constant_(self.alpha_p, _inverse_softplus(self.alpha_p_init))
        init_module.constant_(self.alpha_n, _inverse_softplus(self.alpha_n_init - self.beta))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        dtype = x.dtype
        x = x.float()
        alpha_p = F.softplus(self.alpha_p.float())
        alpha_n = self.beta + F.softplus(self.alpha_n.float())
        branch = torch.where(x > 0, alpha_p * x * x, alpha_n * (torch.expm1(x.clamp(max=self.eps)) - x))
        return (branch + self.beta * x).to(dtype)

    def extra_repr(self) -> str:
        return f"beta={self.beta}, eps={self.eps}"


class PolyNorm(nn.Module):
    """``w₁N(x) + w₂N(x²) + w₃N(x³) + b`` with ``N(t) = t / sqrt(mean(t²) + ε)`` over the last axis;
    ``w = (⅓, ⅓, ⅓)`` and ``b = 0`` trainable fp32 (4 parameters); powers computed in fp32.

    Args:
        eps: ``ε`` (``rms_norm_eps``).
    Shapes:
        x ``[..., I]`` -> same shape and dtype.
    """

    def __init__(self, eps: float = 1e-6) -> None:
        super().__init__()
        self.eps = float(eps)
        self.weight = nn.Parameter(torch.full((3,), 1.0 / 3.0, dtype=torch.float32))
        self.bias = nn.Parameter(torch.zeros(1, dtype=torch.float32))

    def reset_parameters_with(self, init_module) -> None:
        init_module.constant_(self.weight, 1.0 / 3.0)
        init_module.zeros_(self.bias)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        dtype, x = x.dtype, x.float()
        powers = torch.stack([x, x * x, x * x * x])
        normed = F.rms_norm(powers, powers.shape[-1:], eps=self.eps)
        out = torch.einsum("k,k...->...", self.weight.float(), normed) + self.bias.float()
        return out.to(dtype)

    def extra_repr(self) -> str:
        return f"eps={self.eps}"


def make_activation(hidden_act: str, polynorm_exclusive: bool = False, eps: float = 1e-6) -> nn.Module:
    """The MLP gate activation: :class:`PolyNorm` when ``polynorm_exclusive`` (``hidden_act`` is then
    ignored), a fresh :class:`XIELU` per call for ``"xielu"``, otherwise the transformers activation
    of that name.

    Args:
        hidden_act: ``config.hidden_act``.
        polynorm_exclusive: PolyNorm as the exclusive nonlinearity (``docs/neollm-residual.md#polynorm``).
        eps: PolyNorm's ``ε`` (``rms_norm_eps``).
    """
    if polynorm_exclusive:
        return PolyNorm(eps)
    if hidden_act == "xielu":
        return XIELU()
    if hidden_act not in ACT2FN:
        raise ValueError(f"hidden_act={hidden_act!r} is not a known activation; use 'xielu' or one of transformers' ACT2FN")
    return ACT2FN[hidden_act]
