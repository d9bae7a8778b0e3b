"""SAGE-Lumen's decode plan (see :mod:`slmlab.generation.plan`): the one-token step of
:class:`~.modeling_lumen.LumenForCausalLM` over pre-arranged weights and fixed K/V buffers."""

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


@dataclass(frozen=True)
class LumenLayerWeights:
    """One Lumen block, arranged for the decode step.

    Args:
        norm1: ``[d]`` input RMSNorm weight.
        qkv: ``[d, (H + 2 H_kv) D]`` q|k|v columns (q, k in adjacent-pair order), or int8 rows.
        o: ``[H D, d]`` output projection, transposed (or int8 rows).
        mlp: the SwiGLU feed-forward, or None for attention-only blocks (``intermediate_dim=0``).
    """

    norm1: torch.Tensor
    qkv: Projection
    o: Projection
    mlp: FeedForwardWeights | None


def lumen_step(weights: StackWeights, states: list, tokens: torch.Tensor, position: torch.Tensor) -> torch.Tensor:
    """``tokens [B, 1]`` at ``position [1]`` -> logits ``[B, V]``; writes K/V into ``states``."""
    eps, d, qk_width = weights.eps, weights.hidden, weights.qk_width
    x = F.embedding(tokens, weights.embed)  # [B, 1, d]
    turn = weights.rope.index_select(0, position)
    allowed = weights.slots <= position
    layer: LumenLayerWeights
    for layer, buffers in zip(weights.layers, states):
        qkv = project(F.rms_norm(x, (d,), layer.norm1, eps), layer.qkv)
        qk = rotate_pairs(qkv[..., :qk_width], turn)
        q, k = qk.split(weights.split, dim=-1)
        x = x + project(cached_attention(q, k, qkv[..., qk_width:], buffers, position, allowed), layer.o)
        if layer.mlp is not None:  # fixed per model: attention-only blocks have none
            x = feed_forward(x, layer.mlp, eps)
    return project(F.rms_norm(x[:, -1], (d,), weights.norm, eps), weights.head)


@torch.no_grad()
def lumen_decode_plan(model, capacity: int) -> DecodePlan:
    """The plan for ``model`` (a ``LumenForCausalLM``) with room for ``capacity`` positions."""
    config, inner = model.config, model.model
    heads, kv_heads, head_dim = config.num_heads, config.num_kv_heads, config.head_dim
    layers = []
    for block in inner.layers:
        attn, mlp = block.self_attn, block.mlp
        layers.append(
            LumenLayerWeights(
                norm1=block.input_layernorm.weight,
                qkv=qkv_columns(attn.q_proj, attn.k_proj, attn.v_proj, heads, kv_heads, head_dim),
                o=columns(attn.o_proj),
                mlp=None if mlp is None else FeedForwardWeights.from_linears(
                    block.post_attention_layernorm.weight, mlp.gate_proj, mlp.up_proj, mlp.down_proj
                ),
            )
        )
    weights = stack_weights(model, inner.norm.weight, config.rms_norm_eps, heads, kv_heads, head_dim, config.rope_theta, capacity, layers)
    key_order = adjacent_pair_order(head_dim)
    return DecodePlan(weights, lumen_step, lambda cache: [kv_buffers_from(s, capacity, key_order) for s in cache], capacity)
