"""Interleaved Head Attention (Duvvuri, Ekbote, Bansal, Tiwari, Khatri, Brandfonbrener, Liang,
Dhillon, Zaheer, "Interleaved Head Attention", arXiv 2602.21371), docs/neollm-attention.md#iha.

Mixing (our decision, docs/neollm-attention.md#iha): every head gets ``P`` pseudo-heads, each a learned combination of all heads,
``q̃[t,h,p] = Σ_{h'} A_Q[h,p,h'] q[t,h']`` (K/V mixed within the ``H_c`` K/V heads, keeping the GQA
ratio). The pseudo-tokens are interleaved along the sequence (index ``t·P + p``) and attend with a
token-level mask (``core.py``); the collapse ``o[t,h] = Σ_{h',p} R[h,h',p] o[t,h',p]`` returns one
output per head. Init ``A = δ`` for every ``p`` and ``R = δ/P``: IHA equals (windowed) multi-head
attention exactly at step 0. With ``P = 1`` ("mix") the layer only mixes heads, shape-preserving.
"""

from __future__ import annotations

import torch
from torch import nn

from .mea import component_heads


def _identity_mix(heads: int, slots: int) -> torch.Tensor:
    return torch.eye(heads)[:, None, :].expand(heads, slots, heads).clone()


class IHAMix(nn.Module):
    """Pseudo-head mixing.

    Args:
        num_heads: ``H``; num_kv_heads: ``H_c`` (K/V component heads); pseudo_heads: ``P``.
    Shapes:
        q ``[B, T, H, D]``, k, v ``[B, T, H_c, D]`` -> ``[B, T, H, P, D]``, ``[B, T, H_c, P, D]`` ×2.
    """

    def __init__(self, num_heads: int, num_kv_heads: int, pseudo_heads: int) -> None:
        super().__init__()
        self.q_mix = nn.Parameter(_identity_mix(num_heads, pseudo_heads))
        self.k_mix = nn.Parameter(_identity_mix(num_kv_heads, pseudo_heads))
        self.v_mix = nn.Parameter(_identity_mix(num_kv_heads, pseudo_heads))

    @classmethod
    def from_config(cls, config, layer_idx: int) -> nn.Module:
        """Mixing into ``P_eff`` pseudo-heads on IHA layers (K/V over the ``H_c`` MEA component heads), :class:`NoIHAMix` elsewhere."""
        kind = config.iha_kind(layer_idx)
        if kind == "none":
            return NoIHAMix()
        p = config.iha_num_pseudo_heads if kind in ("local", "global") else 1
        return cls(config.num_attention_heads, component_heads(config), p)

    def reset_parameters_with(self, init_module) -> None:
        for p in (self.q_mix, self.k_mix, self.v_mix):
            init_module.copy_(p, _identity_mix(p.shape[0], p.shape[1]).to(p.device, p.dtype))

    def forward(self, q, k, v):
        mix = lambda a, x: torch.einsum("hpg,btgd->bthpd", a.to(x.dtype), x)  # noqa: E731
        return mix(self.q_mix, q), mix(self.k_mix, k), mix(self.v_mix, v)


class NoIHAMix(nn.Module):
    """The "off" switch: one slot per head (``P_eff = 1``), no parameters."""

    def forward(self, q, k, v):
        return q.unsqueeze(3), k.unsqueeze(3), v.unsqueeze(3)


class IHACollapse(nn.Module):
    """``o[t,h] = Σ_{h',p} R[h,h',p] o[t,h',p]``, ``R`` init ``δ_{hh'}/P``.

    Args:
        num_heads: ``H``; pseudo_heads: ``P > 1``.
    Shapes:
        o ``[B, T, H, P, D]`` -> ``[B, T, H, D]``.
    """

    def __init__(self, num_heads: int, pseudo_heads: int) -> None:
        super().__init__()
        self.collapse = nn.Parameter(self._identity(num_heads, pseudo_heads))

    @classmethod
    def from_config(cls, config, layer_idx: int) -> nn.Module:
        """The collapse on layers with ``P_eff > 1`` ('L', and 'G' with IHA), :class:`SingleSlot` elsewhere."""
        if config.iha_kind(layer_idx) not in ("local", "global") or config.iha_num_pseudo_heads == 1:
            return SingleSlot()
        return cls(config.num_attention_heads, config.iha_num_pseudo_heads)

    @staticmethod
    def _identity(heads: int, slots: int) -> torch.Tensor:
        return torch.eye(heads)[:, :, None].expand(heads, heads, slots) / slots

    def reset_parameters_with(self, init_module) -> None:
        p = self.collapse
        init_module.copy_(p, self._identity(p.shape[0], p.shape[2]).to(p.device, p.dtype))

    def forward(self, o):
        return torch.einsum("hgp,btgpd->bthd", self.collapse.to(o.dtype), o)


class SingleSlot(nn.Module):
    """No collapse (``P_eff = 1``): drop the slot axis. Shapes: ``[B, T, H, 1, D]`` -> ``[B, T, H, D]``."""

    def forward(self, o):
        return o.squeeze(3)
