"""LFM2Small's decode plan (see :mod:`slmlab.layers.decode`): the one-token step of
:class:`~.modeling_lfm2.Lfm2SmallForCausalLM` over pre-arranged weights, fixed K/V buffers for the
attention layers and ``K-1``-wide windows for the gated short convolutions."""

from __future__ import annotations

import torch
import torch.nn.functional as F

from ...layers.decode import (
    DecodePlan,
    adjacent_pair_order,
    cached_attention,
    kv_buffers_from,
    qkv_columns,
    rotate_pairs,
    stack_weights,
)
from ...layers.cache import ConvState


def _linear(x: torch.Tensor, layer: dict, name: str) -> torch.Tensor:
    y = x @ layer[name]
    return y + layer[name + "_bias"] if name + "_bias" in layer else y  # biases fixed per model (conv_bias)


def gated_conv_step(h: torch.Tensor, layer: dict, window: torch.Tensor) -> torch.Tensor:
    """``out_proj(C ⊙ conv_K(B ⊙ x))`` for one token ``h [B, 1, d]``; slides ``window [B, d, K-1]``."""
    b_gate, c_gate, u = _linear(h, layer, "in_proj").chunk(3, dim=-1)
    full = torch.cat((window, (b_gate * u).transpose(1, 2)), dim=-1)  # [B, d, K]
    y = (full * layer["conv"]).sum(-1)[:, None]  # [B, 1, d]
    if "conv_bias" in layer:
        y = y + layer["conv_bias"]
    window.copy_(full[..., 1:])
    return _linear(c_gate * y, layer, "out_proj")


def lfm2_step(weights: dict, states: list, tokens: torch.Tensor, position: torch.Tensor) -> torch.Tensor:
    """``tokens [B, 1]`` at ``position [1]`` -> logits ``[B, V]``; updates ``states`` in place."""
    eps, d, head_dim, qk_width = weights["eps"], weights["hidden"], weights["head_dim"], weights["qk_width"]
    b = tokens.shape[0]
    x = F.embedding(tokens, weights["embed"])
    turn = weights["rope"].index_select(0, position)
    allowed = weights["slots"] <= position
    for layer, state in zip(weights["layers"], states):
        h = F.rms_norm(x, (d,), layer["operator_norm"], eps)
        if "qkv" in layer:  # which mixer a layer has is fixed by config.layer_order
            qkv = h @ layer["qkv"]
            qk = F.rms_norm(qkv[..., :qk_width].view(b, -1, head_dim), (head_dim,), None, eps) * layer["qk_norm"]
            q, k = rotate_pairs(qk.view(b, 1, qk_width), turn).split(weights["split"], dim=-1)
            x = x + cached_attention(q, k, qkv[..., qk_width:], state, position, allowed) @ layer["out_proj"]
        else:
            x = x + gated_conv_step(h, layer, state[0])
        gate, up = (F.rms_norm(x, (d,), layer["ffn_norm"], eps) @ layer["w13"]).chunk(2, dim=-1)
        x = x + (F.silu(gate) * up) @ layer["w2"]
    return F.rms_norm(x[:, -1], (d,), weights["norm"], eps) @ weights["head"]


def _attention_weights(attn, heads: int, kv_heads: int, head_dim: int) -> dict:
    order = adjacent_pair_order(head_dim).to(attn.q_proj.weight.device)
    qkv = qkv_columns(attn.q_proj.weight, attn.k_proj.weight, attn.v_proj.weight, heads, kv_heads, head_dim)
    qk_norm = torch.cat(
        (attn.q_layernorm.weight[order].expand(heads, head_dim), attn.k_layernorm.weight[order].expand(kv_heads, head_dim))
    )
    return {"qkv": qkv, "qk_norm": qk_norm.contiguous(), "out_proj": attn.out_proj.weight.t().contiguous()}


def _conv_weights(conv) -> dict:
    out = {
        "in_proj": conv.in_proj.weight.t().contiguous(),
        "conv": conv.conv.weight[:, 0].contiguous(),  # [d, K]
        "out_proj": conv.out_proj.weight.t().contiguous(),
    }
    for name, bias in (("in_proj_bias", conv.in_proj.bias), ("conv_bias", conv.conv.bias), ("out_proj_bias", conv.out_proj.bias)):
        if bias is not None:
            out[name] = bias
    return out


@torch.no_grad()
def lfm2_decode_plan(model, capacity: int) -> DecodePlan:
    """The plan for ``model`` (an ``Lfm2SmallForCausalLM``) with room for ``capacity`` positions."""
    config, inner = model.config, model.model
    heads, kv_heads, head_dim = config.num_attention_heads, config.num_key_value_heads, config.head_dim
    layers = []
    for block in inner.layers:
        mixer = _attention_weights(block.self_attn, heads, kv_heads, head_dim) if hasattr(block, "self_attn") else _conv_weights(block.conv)
        ff = block.feed_forward
        layers.append(
            {
                "operator_norm": block.operator_norm.weight,
                "ffn_norm": block.ffn_norm.weight,
                "w13": torch.cat((ff.w1.weight, ff.w3.weight)).t().contiguous(),
                "w2": ff.w2.weight.t().contiguous(),
                **mixer,
            }
        )
    weights = stack_weights(
        model, inner.embedding_norm.weight, config.rms_norm_eps, heads, kv_heads, head_dim, config.rope_theta, capacity, layers
    )
    key_order = adjacent_pair_order(head_dim)

    def load_cache(cache) -> list:
        # a conv layer's window after the prompt: [B, d, K-1], copied (the step slides it in place)
        return [(s.window.clone(),) if isinstance(s, ConvState) else kv_buffers_from(s, capacity, key_order) for s in cache]

    return DecodePlan(weights, lfm2_step, load_cache, capacity)

