"""Causal depthwise 1-D convolution with a streaming state."""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from .cache import ConvState


class CausalDepthwiseConv1d(nn.Conv1d):
    """Depthwise ``Conv1d`` that only looks back: ``y_t = b + sum_k w_k x_{t-K+1+k}``.

    A subclass of ``nn.Conv1d`` so its parameters keep the names ``weight`` ``[C, 1, K]`` and
    ``bias`` (state_dicts of transformers' LFM2 and the PGSM seed load unchanged). Given a
    :class:`ConvState`, the first ``K-1`` inputs come from the state instead of zeros and the state
    keeps the last ``K-1`` inputs; a one-token step costs O(K·C).

    Args:
        channels: ``C``.
        kernel_size: ``K``.
        bias: whether the conv has a bias.
    Shapes:
        x ``[B, C, T]`` -> ``[B, C, T]``.
    """

    def __init__(self, channels: int, kernel_size: int, bias: bool = True) -> None:
        super().__init__(channels, channels, kernel_size, groups=channels, padding=0, bias=bias)

    def forward(self, x: torch.Tensor, state: ConvState | None = None) -> torch.Tensor:  # type: ignore[override]
        k = self.kernel_size[0]
        if state is None:
            return F.conv1d(F.pad(x, (k - 1, 0)), self.weight, self.bias, groups=self.groups)
        window = state.window
        if window is None:
            window = x.new_zeros(x.shape[0], x.shape[1], k - 1)
        if x.shape[-1] == 1:
            full = torch.cat((window, x), dim=-1)  # [B, C, K]
            y = (full * self.weight[:, 0]).sum(-1, keepdim=True)
            if self.bias is not None:
                y = y + self.bias[:, None]
        else:
            full = torch.cat((window, x), dim=-1)
            y = F.conv1d(full, self.weight, self.bias, groups=self.groups)
        state.keep(full, k - 1)
        return y
