"""Multi-head Explicit Attention (Peng et al., "Explicit Multi-head Attention for Inter-head
Interaction in Large Language Models", arXiv 2601.19611), ``docs/neollm-attention.md#mea``.

* :class:`MEAHeadMix` — head-level linear composition (HLC) of keys and values:
  ``k̄[t,h] = Σ_c W_K[c,h] k[t,c]`` (same for ``v`` with ``W_V``) turns the ``H_c`` component heads of
  ``k_proj``/``v_proj`` into the ``H_kv`` heads the kernel reads. With IHA it runs after the pseudo-head
  mix, independently in each pseudo-slot (the same ``W`` for every slot). It sits before the
  positional operator so per-KV-head rotations (REPO, GRAPE, GOAT) keep their relative law.
  Init (our decision for a non-square ``W``): ``W[c, h] = 1`` iff ``c == h mod H_c`` — the identity
  when ``H_c == H_kv``; with ``H_c < H_kv`` every mixed head starts as a copy of a component head.
* :class:`MEAHeadRMSNorm` — after the IHA collapse, every (token, query head) output is RMS-normalised
  over ``D`` with its own gain: ``o ← γ_h ⊙ o / sqrt(mean_D(o²) + ε)``, ``γ ∈ R^{H×D}`` init 1.

Parameters ``2·H_c·H_kv + H·D`` per layer (544 at the seed defaults). The cache holds the mixed
``H_kv`` heads (no re-mixing at decode).
"""

from __future__ import annotations

import torch
from torch import nn


def component_heads(config) -> int:
    """``H_c``: the K/V heads ``k_proj``/``v_proj`` produce (``mea_component_key_value_heads`` with MEA on,
    else ``num_key_value_heads``)."""
    return int(config.mea_component_key_value_heads) if config.use_mea_attention else config.num_key_value_heads


def _mod_identity(components: int, heads: int) -> torch.Tensor:
    c = torch.arange(components)[:, None]
    h = torch.arange(heads)[None, :]
    return (c == h % components).float()


class MEAHeadMix(nn.Module):
    """Args:
        num_components: ``H_c``; num_kv_heads: ``H_kv``.
    Shapes:
        k, v ``[B, T, H_c, P, D]`` -> ``[B, T, H_kv, P, D]`` each (D may differ between k and v).
    """

    def __init__(self, num_components: int, num_kv_heads: int) -> None:
        super().__init__()
        self.k_mix = nn.Parameter(_mod_identity(num_components, num_kv_heads))
        self.v_mix = nn.Parameter(_mod_identity(num_components, num_kv_heads))

    @classmethod
    def from_config(cls, config, layer_idx: int) -> nn.Module:
        """The HLC when ``use_mea_attention``, else :class:`NoMEAHeadMix`."""
        if not config.use_mea_attention:
            return NoMEAHeadMix()
        return cls(component_heads(config), config.num_key_value_heads)

    def reset_parameters_with(self, init_module) -> None:
        for w in (self.k_mix, self.v_mix):
            init_module.copy_(w, _mod_identity(*w.shape).to(w.device, w.dtype))

    def forward(self, k: torch.Tensor, v: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        return (
            torch.einsum("btcpd,ch->bthpd", k, self.k_mix.to(k.dtype)),
            torch.einsum("btcpd,ch->bthpd", v, self.v_mix.to(v.dtype)),
        )


class NoMEAHeadMix(nn.Module):
    """The "off" switch: k and v pass through."""

    def forward(self, k, v):
        return k, v


class MEAHeadRMSNorm(nn.Module):
    """Args:
        num_heads: ``H``; head_dim: ``D``; eps: ``mea_groupnorm_eps``.
    Shapes:
        o ``[B, T, H, D]`` -> ``[B, T, H, D]`` (statistics in fp32, per token and head).
    """

    def __init__(self, num_heads: int, head_dim: int, eps: float) -> None:
        super().__init__()
        self.eps = float(eps)
        self.weight = nn.Parameter(torch.ones(num_heads, head_dim))

    @classmethod
    def from_config(cls, config, layer_idx: int) -> nn.Module:
        """The head norm when ``use_mea_attention``, else :class:`NoHeadNorm`."""
        if not config.use_mea_attention:
            return NoHeadNorm()
        return cls(config.num_attention_heads, config.head_dim, config.mea_groupnorm_eps)

    def reset_parameters_with(self, init_module) -> None:
        init_module.ones_(self.weight)

    def forward(self, o: torch.Tensor) -> torch.Tensor:
        of = o.float()
        of = of * torch.rsqrt(of.pow(2).mean(-1, keepdim=True) + self.eps)
        return (self.weight.float() * of).to(o.dtype)


class NoHeadNorm(nn.Module):
    """The "off" switch."""

    def forward(self, o):
        return o


__all__ = ["MEAHeadMix", "MEAHeadRMSNorm", "NoHeadNorm", "NoMEAHeadMix", "component_heads"]
