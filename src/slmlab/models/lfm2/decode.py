"""LFM2Small's decode plan (see :mod:`slmlab.generation.plan`): the one-token step of
:class:`~.modeling_lfm2.Lfm2SmallForCausalLM` over pre-arranged weights, fixed K/V buffers for the
attention layers and ``K-1``-wide windows for the gated short convolutions."""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F

from ...generation.plan import (
    DecodePlan,
    FeedForwardWeights,
    Projection,
    StackWeights,
    adjacent_pair_order,
    cached_attention,
    columns,
    feed_forward,
    kv_buffers_from,
    project,
    qkv_columns,
    rotate_pairs,
    stack_weights,
)
from ...layers.cache import ConvState


@dataclass(frozen=True)
class Lfm2AttentionWeights:
    """GQA with QK-norm, arranged for the decode step.

    Args:
        qkv: ``[d, (H + 2 H_kv) D]`` q|k|v columns (q, k in adjacent-pair order), or int8 rows.
        qk_norm: ``[H + H_kv, D]`` q/k RMSNorm weights per head, in adjacent-pair order.
        out_proj: ``[H D, d]`` output projection, transposed (or int8 rows).
    """

    qkv: Projection
    qk_norm: torch.Tensor
    out_proj: Projection


@dataclass(frozen=True)
class Lfm2ConvWeights:
    """The gated short convolution ``out_proj(C ⊙ conv_K(B ⊙ x))``, arranged for the decode step.

    Args:
        in_proj: ``[d, 3 d]`` (B | C | x), transposed (or int8 rows).
        conv: ``[d, K]`` depthwise kernel.
        out_proj: ``[d, d]``, transposed (or int8 rows).
        in_proj_bias, conv_bias, out_proj_bias: ``[3 d]``, ``[d]``, ``[d]``, or None
            (``conv_bias=False``).
    """

    in_proj: Projection
    conv: torch.Tensor
    out_proj: Projection
    in_proj_bias: torch.Tensor | None = None
    conv_bias: torch.Tensor | None = None
    out_proj_bias: torch.Tensor | None = None


@dataclass(frozen=True)
class Lfm2LayerWeights:
    """One LFM2 block: ``operator_norm``, its mixer (attention or conv, fixed by ``layer_order``),
    and the SwiGLU feed-forward (``ffn_norm``, ``w1|w3``, ``w2``)."""

    operator_norm: torch.Tensor
    mixer: Lfm2AttentionWeights | Lfm2ConvWeights
    feed_forward: FeedForwardWeights


def _linear(x: torch.Tensor, weight: Projection, bias: torch.Tensor | None) -> torch.Tensor:
    y = project(x, weight)
    return y if bias is None else y + bias  # biases fixed per model (conv_bias)


def gated_conv_step(h: torch.Tensor, conv: Lfm2ConvWeights, window: torch.Tensor) -> torch.Tensor:
    """``out_proj(C ⊙ conv_K(B ⊙ x))`` for one token ``h [B, 1, d]``; slides ``window [B, d, K-1]``."""
    b_gate, c_gate, u = _linear(h, conv.in_proj, conv.in_proj_bias).chunk(3, dim=-1)
    full = torch.cat((window, (b_gate * u).transpose(1, 2)), dim=-1)  # [B, d, K]
    y = (full * conv.conv).sum(-1)[:, None]  # [B, 1, d]
    if conv.conv_bias is not None:
        y = y + conv.conv_bias
    window.copy_(full[..., 1:])
    return _linear(c_gate * y, conv.out_proj, conv.out_proj_bias)


def lfm2_step(weights: StackWeights, states: list, tokens: torch.Tensor, position: torch.Tensor) -> torch.Tensor:
    """``tokens [B, 1]`` at ``position [1]`` -> logits ``[B, V]``; updates ``states`` in place."""
    eps, d, head_dim, qk_width = weights.eps, weights.hidden, weights.head_dim, weights.qk_width
    b = tokens.shape[0]
    x = F.embedding(tokens, weights.embed)
    turn = weights.rope.index_select(0, position)
    allowed = weights.slots <= position
    layer: Lfm2LayerWeights
    for layer, state in zip(weights.layers, states):
        h = F.rms_norm(x, (d,), layer.operator_norm, eps)
        mixer = layer.mixer
        if isinstance(mixer, Lfm2AttentionWeights):  # which mixer a layer has is fixed by config.layer_order
            qkv = project(h, mixer.qkv)
            qk = F.rms_norm(qkv[..., :qk_width].view(b, -1, head_dim), (head_dim,), None, eps) * mixer.qk_norm
            q, k = rotate_pairs(qk.view(b, 1, qk_width), turn).split(weights.split, dim=-1)
            x = x + project(cached_attention(q, k, qkv[..., qk_width:], state, position, allowed), mixer.out_proj)
        else:
            x = x + gated_conv_step(h, mixer, state[0])
        x = feed_forward(x, layer.feed_forward, eps)
    return project(F.rms_norm(x[:, -1], (d,), weights.norm, eps), weights.head)


def _attention_weights(attn, heads: int, kv_heads: int, head_dim: int) -> Lfm2AttentionWeights:
    order = adjacent_pair_order(head_dim).to(attn.q_layernorm.weight.device)
    qk_norm = torch.cat(
        (attn.q_layernorm.weight[order].expand(heads, head_dim), attn.k_layernorm.weight[order].expand(kv_heads, head_dim))
    )
    return Lfm2AttentionWeights(
        qkv=qkv_columns(attn.q_proj, attn.k_proj, attn.v_proj, heads, kv_heads, head_dim),
        qk_norm=qk_norm.contiguous(),
        out_proj=columns(attn.out_proj),
    )


def _conv_weights(conv) -> Lfm2ConvWeights:
    return Lfm2ConvWeights(
        in_proj=columns(conv.in_proj),
        conv=conv.conv.weight[:, 0].contiguous(),  # [d, K]
        out_proj=columns(conv.out_proj),
        in_proj_bias=conv.in_proj.bias,
        conv_bias=conv.conv.bias,
        out_proj_bias=conv.out_proj.bias,
    )


@torch.no_grad()
def lfm2_decode_plan(model, capacity: int) -> DecodePlan:
    """The plan for ``model`` (an ``Lfm2SmallForCausalLM``) with room for ``capacity`` positions."""
    config, inner = model.config, model.model
    heads, kv_heads, head_dim = config.num_attention_heads, config.num_key_value_heads, config.head_dim
    layers = []
    for block in inner.layers:
        ff = block.feed_forward
        mixer = _attention_weights(block.self_attn, heads, kv_heads, head_dim) if hasattr(block, "self_attn") else _conv_weights(block.conv)
        layers.append(
            Lfm2LayerWeights(
                operator_norm=block.operator_norm.weight,
                mixer=mixer,
                feed_forward=FeedForwardWeights.from_linears(block.ffn_norm.weight, ff.w1, ff.w3, ff.w2),
            )
        )
    weights = stack_weights(
        model, inner.embedding_norm.weight, config.rms_norm_eps, heads, kv_heads, head_dim, config.rope_theta, capacity, layers
    )
    key_order = adjacent_pair_order(head_dim)

    def load_cache(cache) -> list:
        # a conv layer's window after the prompt: [B, d, K-1], copied (the step slides it in place)
        return [(s.window.clone(),) if isinstance(s, ConvState) else kv_buffers_from(s, capacity, key_order) for s in cache]

    return DecodePlan(weights, lfm2_step, load_cache, capacity)
