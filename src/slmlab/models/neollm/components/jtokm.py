"""Leviathan-JTok-M: per-layer token-indexed modulation over the generator's latent coordinate (Yang
et al., "JTok: On Token Embedding as another Axis of Scaling Law via Joint Token Self-modulation",
arXiv 2602.00800, on the Leviathan generator's ``z̃``; ``docs/neollm.md#jtok-m``).

Layer ``l`` (``ℓ = l + 1``) has ``n_e`` surfaces; surface ``i`` maps a token to ``D`` numbers through
its latent coordinate ``z̃`` and basis values ``B = B(z̃) [d, K]`` (mode 1 of the generator)::

    M_{i,m}(t) = Π_j Σ_q B[j, q] (1 + Δ_i[m, j, q])         m = 1..M_m   (Δ ~ N(0, 0.02²))
    m_i(t)     = W_out,i M_i(t) + W_res,i z̃                 W_out,i [D, M_m], W_res,i [D, d]
    g          = W_r RMSNorm_r(h̃)  (fp32)                   h̃: the stream the MLP reads (after the attention add)
    G          = top-k(g, K_top);  w_i = σ(g_i) / Σ_{j∈G} σ(g_j)
    e          = Σ_{i∈G} w_i m_i(t)
    Δr         = (1/sqrt(2ℓ)) · s ⊙ e / sqrt(‖e‖² + ε)       s init 1 (fp32)

``Δr`` is added to the MLP's update before the residual flow combines it, in every topology. The
surfaces depend only on the id, so they run on the unique ids of the call; the router and ``Δr`` are
per token: no state across time. Load balancing, per layer over the real (non-pad) tokens ``X``::

    f_i = |{x : i ∈ G_x}| / (|X| K_top)   (no gradient),   p_i = mean_x σ(g_{x,i}) / Σ_j σ(g_{x,j})
    L_ℓ = n_e Σ_i f_i p_i                  (= 1 under perfect balance)

and the model's auxiliary loss is ``λ · mean_ℓ L_ℓ``: each layer adds ``(λ / L) L_ℓ`` to the
context's sink, only when the caller collects auxiliary losses (a forward with labels).
Parameters per layer: ``n_e (M_m d K + D M_m + D d) + n_e D + 2 D`` (338,944 at the seed's defaults).
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import nn

from ....layers.norm import RMSNorm
from .context import ForwardContext, ResidualState
from .generator import TokenLatents


class JTokM(nn.Module):
    """One decoder layer's JTok-M: ``(update, state, ctx) -> update + Δr``.

    Args:
        hidden_size: ``D``; layer_idx: ``l`` (the depth factor is ``1/sqrt(2(l+1))``); num_layers: ``L``.
        d_seed: ``d``; num_knots: ``K``; num_experts: ``n_e``; top_k: ``K_top``; num_modes: ``M_m``.
        aux_loss_weight: ``λ``; norm_eps: ``ε`` of the L2 normalisation; rms_eps: the router norm's ε;
        std: init σ of ``W_out``, ``W_res`` (truncated at ±2σ; ``W_r`` is an ``nn.Linear``).
    Shapes:
        update ``[B, T, D]``; ``state.mlp_stream`` ``[B, T, D]``; ``ctx.latents`` a :class:`TokenLatents`
        -> ``[B, T, D]``.
    """

    keep_float_linears = ("router",)  # routed in fp32 by design: int8 (slmlab.models.quantize) leaves it

    def __init__(
        self, hidden_size: int, layer_idx: int, num_layers: int, d_seed: int = 128, num_knots: int = 32,
        num_experts: int = 4, top_k: int = 2, num_modes: int = 4, aux_loss_weight: float = 1e-4,
        norm_eps: float = 1e-6, rms_eps: float = 1e-6, std: float = 0.02,
    ) -> None:
        super().__init__()
        self.num_experts, self.top_k, self.norm_eps, self.std = num_experts, top_k, norm_eps, std
        self.depth_scale = 1.0 / math.sqrt(2 * (layer_idx + 1))
        self.layer_aux_weight = aux_loss_weight / num_layers
        self.delta = nn.Parameter(torch.empty(num_experts, num_modes, d_seed, num_knots))
        self.out_proj = nn.Parameter(torch.empty(num_experts, hidden_size, num_modes))
        self.res_proj = nn.Parameter(torch.empty(num_experts, hidden_size, d_seed))
        self.router_norm = RMSNorm(hidden_size, rms_eps)
        self.router = nn.Linear(hidden_size, num_experts, bias=False)
        self.scale = nn.Parameter(torch.ones(hidden_size, dtype=torch.float32))
        self.reset_parameters_with(nn.init)

    @classmethod
    def from_config(cls, config, layer_idx: int) -> nn.Module:
        """JTok-M when ``use_jtokm``, else :class:`NoModulation`."""
        if not config.use_jtokm:
            return NoModulation()
        return cls(
            config.hidden_size, layer_idx, config.num_hidden_layers, d_seed=config.generator_d_seed,
            num_knots=config.generator_num_knots, num_experts=config.jtokm_num_experts, top_k=config.jtokm_top_k,
            num_modes=config.jtokm_num_modes, aux_loss_weight=config.jtokm_aux_loss_weight,
            norm_eps=config.jtokm_norm_eps, rms_eps=config.rms_norm_eps, std=config.initializer_range,
        )

    def reset_parameters_with(self, init_module) -> None:
        """``Δ ~ N(0, 0.02²)``, ``W_out`` / ``W_res`` truncated normal, ``s = 1`` (the router and its norm
        are re-initialised by type)."""
        init_module.normal_(self.delta, mean=0.0, std=0.02)
        for w in (self.out_proj, self.res_proj):
            init_module.trunc_normal_(w, mean=0.0, std=self.std, a=-2 * self.std, b=2 * self.std)
        init_module.ones_(self.scale)

    def surfaces(self, latents: TokenLatents) -> torch.Tensor:
        """``m_i(t)`` for every surface and unique id: ``[U, n_e, D]`` (fp32)."""
        phi = torch.einsum("ujk,emjk->uemj", latents.basis, 1.0 + self.delta.float())
        modes = phi.prod(dim=-1)  # [U, n_e, M_m]
        return torch.einsum("uem,ehm->ueh", modes, self.out_proj.float()) + torch.einsum(
            "uj,ehj->ueh", latents.z, self.res_proj.float()
        )

    def route(self, h: torch.Tensor) -> torch.Tensor:
        """Router logits ``g = W_r RMSNorm_r(h̃)`` in fp32: ``[B, T, D]`` -> ``[B, T, n_e]``."""
        return F.linear(self.router_norm(h).float(), self.router.weight.float())

    def balance_loss(self, logits: torch.Tensor, chosen: torch.Tensor, ctx: ForwardContext) -> torch.Tensor:
        """``L_ℓ = n_e Σ_i f_i p_i`` over the real tokens of this call (the padding mask's last ``T`` columns)."""
        t = logits.shape[1]
        real = torch.ones(logits.shape[:2], device=logits.device) if ctx.attention_mask is None else (
            ctx.attention_mask[:, -t:].to(device=logits.device, dtype=torch.float32)
        )
        count = real.sum().clamp(min=1.0)
        picked = F.one_hot(chosen, self.num_experts).sum(-2).float()  # [B, T, n_e], 0/1
        f = (picked * real[..., None]).sum((0, 1)) / (count * self.top_k)
        sig = torch.sigmoid(logits)
        p = (sig / sig.sum(-1, keepdim=True) * real[..., None]).sum((0, 1)) / count
        return self.num_experts * (f * p).sum()

    def forward(self, update: torch.Tensor, state: ResidualState, ctx: ForwardContext) -> torch.Tensor:
        with torch.autocast(update.device.type, enabled=False):  # router, surfaces and Δr in fp32
            logits = self.route(state.mlp_stream)
            top, chosen = logits.topk(self.top_k, dim=-1)  # [B, T, K_top]
            weights = torch.sigmoid(top)
            weights = weights / weights.sum(-1, keepdim=True)
            picked = self.surfaces(ctx.latents)[ctx.latents.inverse[..., None], chosen]  # [B, T, K_top, D]
            e = (weights[..., None] * picked).sum(-2)
            delta_r = self.depth_scale * self.scale.float() * e * torch.rsqrt(e.pow(2).sum(-1, keepdim=True) + self.norm_eps)
            if ctx.aux_losses is not None:
                ctx.add_aux_loss(self.layer_aux_weight * self.balance_loss(logits, chosen, ctx))
        return update + delta_r.to(update.dtype)


class NoModulation(nn.Module):
    """JTok-M off: the MLP update passes through."""

    def forward(self, update: torch.Tensor, state: ResidualState, ctx: ForwardContext) -> torch.Tensor:
        return update


__all__ = ["JTokM", "NoModulation"]
