"""Exclusive Self Attention (Zhai, "Exclusive Self Attention", arXiv 2603.09078), docs/neollm-attention.md#xsa.

Each head's output loses its component along the token's own value:
``z_{t,h} = y_{t,h} − (y_{t,h}·v_ref)/(‖v_ref‖² + ε) · v_ref``. The reference value ``v_ref[t, h // G]``
is chosen at construction (:class:`RawValue` / :class:`ConsumedValue`): the ``v_proj`` output (after
the FAN value-residual hook) while MEA and LUCID are off; with either on, the value the kernel
consumed (post MEA mixing, post LUCID ``V′``), averaged over the IHA slots (our decision). fp32, no
parameters, nothing cached.
"""

from __future__ import annotations

import torch
from torch import nn


class ExclusiveSelfAttention(nn.Module):
    """Args:
        num_heads: ``H``; num_kv_heads: ``H_kv`` (``G = H / H_kv`` heads share a ``v_ref``).
        eps: ``xsa_eps``.
    Shapes:
        o ``[B, T, H, D]``, v_ref ``[B, T, H_kv, D]`` -> ``[B, T, H, D]``.
    """

    def __init__(self, num_heads: int, num_kv_heads: int, eps: float) -> None:
        super().__init__()
        self.groups = num_heads // num_kv_heads
        self.eps = float(eps)

    @classmethod
    def from_config(cls, config, layer_idx: int) -> nn.Module:
        """XSA when ``use_xsa``, else :class:`NoXSA`."""
        if not config.use_xsa:
            return NoXSA()
        return cls(config.num_attention_heads, config.num_key_value_heads, config.xsa_eps)

    def forward(self, o: torch.Tensor, v_ref: torch.Tensor) -> torch.Tensor:
        b, t, h, d = o.shape
        y = o.float().view(b, t, h // self.groups, self.groups, d)
        v = v_ref.float().unsqueeze(3)
        coef = (y * v).sum(-1, keepdim=True) / (v.pow(2).sum(-1, keepdim=True) + self.eps)
        return (y - coef * v).view(b, t, h, d).to(o.dtype)


class RawValue(nn.Module):
    """``v_ref`` = the post-hook ``v_proj`` output. Shapes: v ``[B, T, H_kv, D]``, consumed (unused) -> v."""

    @classmethod
    def from_config(cls, config, layer_idx: int) -> nn.Module:
        """:class:`ConsumedValue` when MEA or LUCID changes the value the kernel reads, else the raw value."""
        return ConsumedValue() if config.use_mea_attention or config.use_lucid_attention else cls()

    def forward(self, v: torch.Tensor, consumed: torch.Tensor) -> torch.Tensor:
        return v


class ConsumedValue(nn.Module):
    """``v_ref`` = the kernel's value averaged over slots. Shapes: consumed ``[B, T, H_kv, P, D]`` -> ``[B, T, H_kv, D]``."""

    def forward(self, v: torch.Tensor, consumed: torch.Tensor) -> torch.Tensor:
        return consumed.mean(3)


class NoXSA(nn.Module):
    """The "off" switch."""

    def forward(self, o: torch.Tensor, v_ref: torch.Tensor) -> torch.Tensor:
        return o
