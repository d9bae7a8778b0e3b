"""FANformer periodic feature map (Dong et al., "FAN: Fourier Analysis Networks", arXiv 2410.02675;
FANformer, arXiv 2502.21309), used on the MLP input (``fan_ratio_ffn``).

``FAN(u) = [cos(u W_p) ‖ sin(u W_p) ‖ u W_p̄ + b_p̄]`` with ``W_p: D→d_p`` (no bias),
``W_p̄: D→D−d_p`` (with bias) and ``d_p = int(D · ratio)``; the output is ``D + d_p`` wide
(FANformer's FAN′ layer: no activation on the linear branch). A ratio giving ``d_p = 0`` means no
FAN module at all (:class:`NoFAN`, the identity).
"""

from __future__ import annotations

import torch
from torch import nn


class FANFeatures(nn.Module):
    """Periodic + linear features of the block input.

    Args:
        dim: input width ``D``.
        ratio: fraction of ``D`` given to the periodic part (``0 < ratio < 1``).
    Shapes:
        u ``[B, T, D]`` -> ``[B, T, D + d_p]`` (``out_features``).
    """

    def __init__(self, dim: int, ratio: float) -> None:
        super().__init__()
        periodic = int(dim * ratio)
        if not 0 < periodic < dim:
            raise ValueError(f"FAN ratio {ratio} gives {periodic} periodic channels of {dim}; it must be in (0, 1)")
        self.periodic_dim = periodic
        self.out_features = dim + periodic
        self.periodic_proj = nn.Linear(dim, periodic, bias=False)
        self.linear_proj = nn.Linear(dim, dim - periodic, bias=True)

    @classmethod
    def from_config(cls, config, layer_idx: int) -> nn.Module:
        """The attention-input map ``FAN_attn`` (``fan_ratio``); :class:`NoFAN` when the ratio gives no
        periodic channel. The MLP builds its own map from ``fan_ratio_ffn`` (:class:`~.mlp.NeoLLMMLP`)."""
        return make_fan(config.hidden_size, config.fan_ratio)

    def forward(self, u: torch.Tensor) -> torch.Tensor:
        p = self.periodic_proj(u)
        return torch.cat((torch.cos(p), torch.sin(p), self.linear_proj(u)), dim=-1)


class NoFAN(nn.Identity):
    """The "off" FAN map: returns its input; ``out_features`` equals the input width."""

    def __init__(self, dim: int) -> None:
        super().__init__()
        self.out_features = dim


def make_fan(dim: int, ratio: float) -> nn.Module:
    """:class:`FANFeatures` when ``int(dim * ratio) > 0``, else :class:`NoFAN`."""
    if ratio < 0 or ratio >= 1:
        raise ValueError(f"FAN ratio must be in [0, 1), got {ratio}")
    return FANFeatures(dim, ratio) if int(dim * ratio) > 0 else NoFAN(dim)
