"""``NeoLLMAttention``: one NeoLLM attention block composed from modules resolved once from the
config (A§1). The forward is the binding order of operations; each step is a module, and a
switched-off step is an identity module:

1. FAN periodic features (FANformer, arXiv 2502.21309)        6. rotation: integer RoPE / REPO / REPO-GRAPE
2. q_proj (query + folded gate, row multipliers), k/v_proj    7. momentum shear
   + FAN value-residual hook                                  9-10. KV cache + attention core (masks, window, dropout)
3. IHA mixing into P pseudo-slots                             11. IHA collapse
13. XSA  15. output gate  16. Hadamard (or dense) o_proj

Steps 4/5/8/12/14 (MEA, QK-norm [not used, A§4.5], GOAT, MEA norm, directional routing) and the
LUCID / affine-scaled options are not built here: their flags raise ``NotImplementedError`` at
construction (NeoLLM part 2/3).
"""

from __future__ import annotations

from torch import nn

from ..fan import make_fan
from ..multipliers import multiplied_linear
from .core import AttentionCore
from .iha import IHACollapse, IHAMix, NoIHAMix, SingleSlot
from .momentum import MomentumShear, NoMomentum
from .output import HadamardOutput, OutputGate, dense_output
from .positions import IntegerRoPE, RepoRotation
from .rotation import rope_frequencies
from .state import NeoLLMAttentionState
from .value_residual import make_value_residual
from .xsa import ExclusiveSelfAttention, NoXSA

# Attention options of the seed that later parts build (flag -> spec section).
UNBUILT_FLAGS = {
    "use_mea_attention": "A§4.4",
    "use_lucid_attention": "A§4.11",
    "use_affine_scaled_attention": "A§4.13",
    "use_directional_routing": "A§4.15",
    "use_repo_goat_prior": "A§4.9",
}


def check_built(config) -> None:
    """Refuse, at construction, an attention option that is not built yet.

    Raises:
        NotImplementedError: naming the flag and the part that adds it.
    """
    for flag, section in UNBUILT_FLAGS.items():
        if getattr(config, flag):
            raise NotImplementedError(
                f"`{flag}=True` ({section}) is not built yet: it arrives with NeoLLM part 2/3 (attention options). "
                f"Set `{flag}=False`."
            )


class NeoLLMAttention(nn.Module):
    """The NeoLLM attention block of layer ``layer_idx``.

    Args:
        config: a :class:`NeoLLMConfig` (read here only, mapped to explicit module arguments).
        layer_idx: 0-based layer index (selects the IHA kind and RoPE vs REPO, A§0).
    Shapes:
        x ``[B, T, d]`` (block input), position_ids ``[B, T]`` (real-token positions),
        attention_mask ``[B, past + T]`` or None, v0 ``[B, T, H_kv, D]`` or None
        -> (o ``[B, T, d]`` before the decoder layer's dropout, v0_out or None).
    """

    def __init__(self, config, layer_idx: int) -> None:
        super().__init__()
        check_built(config)
        d, h, h_kv, hd = config.hidden_size, config.num_attention_heads, config.num_key_value_heads, config.head_dim
        kind = config.iha_kind(layer_idx)
        p = config.iha_num_pseudo_heads if kind in ("local", "global") else 1
        self.layer_idx, self.kind, self.pseudo_heads = layer_idx, kind, p
        self.num_heads, self.num_kv_heads, self.head_dim = h, h_kv, hd

        self.fan = make_fan(d, config.fan_ratio)
        d_in = self.fan.out_features
        bias = config.attention_bias
        self.q_proj = multiplied_linear(d_in, h * 2 * hd, row=True, enabled=config.use_learnable_multipliers, bias=bias)
        self.k_proj = nn.Linear(d_in, h_kv * hd, bias=bias)
        self.v_proj = nn.Linear(d_in, h_kv * hd, bias=bias)
        self.value_residual = make_value_residual(config.use_fan_residual, layer_idx)
        self.iha = IHAMix(h, h_kv, p) if kind != "none" else NoIHAMix()
        freqs, scaling = rope_frequencies(config)
        if config.is_repo_layer(layer_idx):
            self.positions = RepoRotation(
                d, config.repo_d_p, h, h_kv, freqs, scaling, bool(config.use_repo_grape), config.initializer_range
            )
        else:
            self.positions = IntegerRoPE(freqs, scaling)
        self.momentum = MomentumShear(config.momentum_gamma) if config.use_momentum_attention else NoMomentum()
        self.core = AttentionCore(p, kind == "local", config.iha_sliding_window, config.attention_dropout)
        self.collapse = IHACollapse(h, p) if p > 1 else SingleSlot()
        self.xsa = ExclusiveSelfAttention(h, h_kv, config.xsa_eps) if config.use_xsa else NoXSA()
        self.gate = OutputGate()
        if config.use_hadamard_o_proj:
            self.o_proj = HadamardOutput(h * hd, d)
        else:
            self.o_proj = dense_output(h * hd, d, config.use_learnable_multipliers, bias)

    def new_state(self) -> NeoLLMAttentionState:
        """An empty decoding state for this layer (K/V, momentum, frozen IHA window)."""
        return NeoLLMAttentionState(self.pseudo_heads)

    def forward(self, x, position_ids, attention_mask=None, state=None, v0=None):
        b, t, _ = x.shape
        xf = self.fan(x)
        q, gate = self.q_proj(xf).view(b, t, self.num_heads, 2 * self.head_dim).chunk(2, dim=-1)
        k = self.k_proj(xf).view(b, t, self.num_kv_heads, self.head_dim)
        v = self.v_proj(xf).view(b, t, self.num_kv_heads, self.head_dim)
        v, v0_out = self.value_residual(v, v0)
        qs, ks, vs = self.iha(q, k, v)
        qs, ks = self.positions(x, position_ids, qs, ks)
        qs, ks = self.momentum(qs, ks, position_ids, state)
        o = self.collapse(self.core(qs, ks, vs, attention_mask, state))
        o = self.gate(self.xsa(o, v), gate)
        return self.o_proj(o.reshape(b, t, self.num_heads * self.head_dim)), v0_out


__all__ = ["NeoLLMAttention", "UNBUILT_FLAGS", "check_built"]
