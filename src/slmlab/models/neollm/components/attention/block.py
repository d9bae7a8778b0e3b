"""``NeoLLMAttention``: one NeoLLM attention block composed from modules that each build themselves
from the config (``Mechanism.from_config(config, layer_idx)``, returning the mechanism or its
identity twin). The forward is the binding order of operations
(``docs/neollm-attention.md#order-of-operations``):

1. FAN periodic features (FANformer, arXiv 2502.21309)        6. rotation: integer RoPE / REPO / REPO-GRAPE
2. q_proj (query + folded gate, row multipliers), k/v_proj    7. momentum shear
   + value residual (reads/writes the residual state)         9-10. KV cache + attention core (masks, window,
3. IHA mixing into P pseudo-slots                                   the attention function, dropout)
11. IHA collapse  13. XSA  15. output gate  16. Hadamard (or dense) o_proj

Steps 4/5/8/12/14 (MEA, QK-norm [not used], GOAT, MEA norm, directional routing) and the LUCID /
affine-scaled softmax variants are not built: their flags are rows of the one ``UNBUILT`` table
(``components/unbuilt.py``), refused when the model is constructed.
"""

from __future__ import annotations

import torch
from torch import nn

from ..context import ForwardContext, ResidualState
from ..fan import FANFeatures
from ..multipliers import multiplied_linear
from ..unbuilt import UNBUILT, check_built
from .core import AttentionCore
from .iha import IHACollapse, IHAMix
from .momentum import MomentumShear
from .output import HadamardOutput, OutputGate
from .positions import RepoRotation
from .state import NeoLLMAttentionState
from .value_residual import ValueResidualMix
from .xsa import ExclusiveSelfAttention

# Attention options not built yet: flag -> docs section (the attention rows of `UNBUILT`).
UNBUILT_FLAGS = {flag: doc for flag, doc in UNBUILT.items() if "neollm-attention" in doc}


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
        self.layer_idx, self.kind = layer_idx, config.iha_kind(layer_idx)
        self.num_heads, self.num_kv_heads, self.head_dim = h, h_kv, hd
        self.fan = FANFeatures.from_config(config, layer_idx)
        d_in, bias = self.fan.out_features, config.attention_bias
        self.q_proj = multiplied_linear(d_in, h * 2 * hd, row=True, enabled=config.use_learnable_multipliers, bias=bias)
        self.k_proj = nn.Linear(d_in, h_kv * hd, bias=bias)
        self.v_proj = nn.Linear(d_in, h_kv * hd, bias=bias)
        self.value_residual = ValueResidualMix.from_config(config, layer_idx)
        self.iha = IHAMix.from_config(config, layer_idx)
        self.positions = RepoRotation.from_config(config, layer_idx)
        self.momentum = MomentumShear.from_config(config, layer_idx)
        self.core = AttentionCore.from_config(config, layer_idx)
        self.collapse = IHACollapse.from_config(config, layer_idx)
        self.xsa = ExclusiveSelfAttention.from_config(config, layer_idx)
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
        k = self.k_proj(xf).view(b, t, self.num_kv_heads, self.head_dim)
        v = self.value_residual(self.v_proj(xf).view(b, t, self.num_kv_heads, self.head_dim), carry)
        qs, ks, vs = self.iha(q, k, v)
        qs, ks = self.positions(x, ctx.position_ids, qs, ks)
        qs, ks = self.momentum(qs, ks, ctx.position_ids, state)
        o = self.collapse(self.core(qs, ks, vs, ctx.attention_mask, state))
        o = self.gate(self.xsa(o, v), gate)
        return self.o_proj(o.reshape(b, t, self.num_heads * self.head_dim))


__all__ = ["NeoLLMAttention", "UNBUILT_FLAGS", "check_built"]
