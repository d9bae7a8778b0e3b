"""``NeoLLMAttention``: one NeoLLM attention block composed from modules that each build themselves
from the config (``Mechanism.from_config(config, layer_idx)``, returning the mechanism or its
identity twin). The forward is the binding order of operations
(``docs/neollm-attention.md#order-of-operations``):

1. FAN periodic features (FANformer, arXiv 2502.21309)        7. momentum shear
2. q_proj (query + folded gate, row multipliers), k/v_proj    8. GOAT prior channels (REPO layers)
   + value residual (reads/writes the residual state)         9. LUCID V′ (needs the cached keys and V′)
3. IHA mixing into P pseudo-slots                             10. KV cache + attention core (masks, window,
4. MEA head mixing of K/V (H_c -> H_kv heads)                     the attention function: softmax or affine)
6. rotation: integer RoPE / REPO / REPO-GRAPE                 11. IHA collapse  12. MEA head norm
13. XSA (against the raw or the consumed value)  14. directional routing  15. output gate
16. Hadamard (or dense) o_proj

Every step is a module chosen in ``__init__``, an identity twin when its flag is off (step 5, QK-norm,
is not used). The affine α network feeds the attention function through the per-call terms.
"""

from __future__ import annotations

import torch
from torch import nn

from ..context import ForwardContext, ResidualState
from ..fan import FANFeatures
from ..multipliers import multiplied_linear
from .affine import AffineScale
from .core import AttentionCore
from .goat import GoatPrior
from .iha import IHACollapse, IHAMix
from .lucid import LucidPreconditioner
from .mea import MEAHeadMix, MEAHeadRMSNorm, component_heads
from .momentum import MomentumShear
from .output import HadamardOutput, OutputGate
from .positions import RepoRotation
from .routing import DirectionalRouting
from .state import NeoLLMAttentionState
from .value_residual import ValueResidualMix
from .xsa import ExclusiveSelfAttention, RawValue


class NeoLLMAttention(nn.Module):
    """The NeoLLM attention block of layer ``layer_idx``.

    Args:
        config: a :class:`NeoLLMConfig` (each mechanism maps it to its own explicit arguments).
        layer_idx: 0-based layer index (selects the IHA kind and RoPE vs REPO).
    Shapes:
        x ``[B, T, d]`` (block input); ``ctx`` carries position_ids ``[B, T]`` (real-token positions)
        and attention_mask ``[B, past + T]`` or None; ``carry`` is the residual state (its ``v0`` is
        read and written by the value residual) -> o ``[B, T, d]`` before the decoder layer's dropout.
    """

    def __init__(self, config, layer_idx: int) -> None:
        super().__init__()
        h, h_kv, hd = config.num_attention_heads, config.num_key_value_heads, config.head_dim
        h_c = component_heads(config)
        self.layer_idx, self.kind = layer_idx, config.iha_kind(layer_idx)
        self.num_heads, self.num_kv_heads, self.num_components, self.head_dim = h, h_kv, h_c, hd
        self.fan = FANFeatures.from_config(config, layer_idx)
        d_in, bias = self.fan.out_features, config.attention_bias
        self.q_proj = multiplied_linear(d_in, h * 2 * hd, row=True, enabled=config.use_learnable_multipliers, bias=bias)
        self.k_proj = nn.Linear(d_in, h_c * hd, bias=bias)
        self.v_proj = nn.Linear(d_in, h_c * hd, bias=bias)
        self.value_residual = ValueResidualMix.from_config(config, layer_idx)
        self.iha = IHAMix.from_config(config, layer_idx)
        self.mea = MEAHeadMix.from_config(config, layer_idx)
        self.positions = RepoRotation.from_config(config, layer_idx)
        self.momentum = MomentumShear.from_config(config, layer_idx)
        self.goat = GoatPrior.from_config(config, layer_idx)
        self.lucid = LucidPreconditioner.from_config(config, layer_idx)
        self.affine = AffineScale.from_config(config, layer_idx)
        self.core = AttentionCore.from_config(config, layer_idx)
        self.collapse = IHACollapse.from_config(config, layer_idx)
        self.head_norm = MEAHeadRMSNorm.from_config(config, layer_idx)
        self.v_ref = RawValue.from_config(config, layer_idx)
        self.xsa = ExclusiveSelfAttention.from_config(config, layer_idx)
        self.routing = DirectionalRouting.from_config(config, layer_idx)
        self.gate = OutputGate.from_config(config, layer_idx)
        self.o_proj = HadamardOutput.from_config(config, layer_idx)
        self.pseudo_heads = self.core.pseudo_heads

    def new_state(self) -> NeoLLMAttentionState:
        """An empty decoding state for this layer (K/V, momentum, frozen IHA window)."""
        return NeoLLMAttentionState(self.pseudo_heads)

    def forward(
        self,
        x: torch.Tensor,
        ctx: ForwardContext,
        state: NeoLLMAttentionState | None = None,
        carry: ResidualState | None = None,
    ) -> torch.Tensor:
        b, t, _ = x.shape
        xf = self.fan(x)
        q, gate = self.q_proj(xf).view(b, t, self.num_heads, 2 * self.head_dim).chunk(2, dim=-1)
        k = self.k_proj(xf).view(b, t, self.num_components, self.head_dim)
        v = self.value_residual(self.v_proj(xf).view(b, t, self.num_components, self.head_dim), carry)
        qs, ks, vs = self.iha(q, k, v)
        ks, vs = self.mea(ks, vs)
        qs, ks, coords = self.positions(x, ctx.position_ids, qs, ks)
        qs, ks = self.momentum(qs, ks, ctx.position_ids, state)
        qs, ks = self.goat(qs, ks, coords, ctx.position_ids)
        vs = self.lucid(ks, vs, ctx.attention_mask, self.core.resolve_window(t, state, ctx.attention_mask), state)
        o = self.core(qs, ks, vs, ctx.attention_mask, state, self.affine(x, ctx.attention_mask), ctx.attention_weights)
        o = self.xsa(self.head_norm(self.collapse(o)), self.v_ref(v, vs))
        o = self.gate(self.routing(o, x), gate)
        return self.o_proj(o.reshape(b, t, self.num_heads * self.head_dim))


__all__ = ["NeoLLMAttention"]
