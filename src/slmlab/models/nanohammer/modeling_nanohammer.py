"""NanoHammer (seed 003) as a transformers causal LM.

Forward, for token embeddings ``e_t`` at positions ``p_t``:

1. ``C_t = Σ_{i<=t} R(p_i) W_s e_i`` (``W_s`` = ``token_to_state``, ``R`` the holographic rotation,
   padded positions contribute 0).
2. Per layer ``l``: ``s^l_t = Cell_l(s^{l-1}_t)`` (``s^0 = C``); the state token at ``t`` is
   ``z_t = RMSNorm(W_z R(-p_t) s^l_{t-1})`` with ``s^l_{-1} = 0`` (shift by one position, then rotate
   back into the frame of position ``t``); hidden tokens then run a pre-norm Llama block whose
   attention lets hidden query ``t`` see state tokens ``<= t`` and hidden tokens ``<= t`` (``< t`` with
   ``hidden_attends_self=False``), all keyed with RoPE at their positions. Only the ``T`` hidden
   queries and their MLP are computed (the seed also computed ``T`` state-token queries and an MLP
   on them, then discarded the results).

Parameter names equal the seed's, so a seed state_dict loads with ``strict=True``; the config
switches ``rotation_style="seed"`` and ``hidden_attends_self=False`` reproduce the seed's prefill
maths. Decoding through :class:`~slmlab.layers.ModelCache` equals the full forward in both modes.
"""

from __future__ import annotations

import torch
from torch import nn
from transformers import initialization as init
from transformers.modeling_layers import GradientCheckpointingLayer

from ...layers import ModelCache, RMSNorm, RotaryEmbedding, SwiGLU
from ..base import ForwardInputs, SLMBaseModel, SLMForCausalLM, SLMPreTrainedModel
from .attention_nanohammer import HammerLayerState, NanoHammerAttention, RunningSum, hammer_bias
from .configuration_nanohammer import NanoHammerConfig
from .holographic import ROTATIONS, HolographicRotation, StateTokenProjection, StateUpdateCell, shift_right


class NanoHammerDecoderLayer(GradientCheckpointingLayer):
    """State step + state tokens + pre-norm attention/SwiGLU block on the hidden tokens.

    ``s' = Cell(s)``; ``z = Proj(R(-p) shift(s'))``;
    ``h = x + Attn(RMSNorm(x), RMSNorm(z))``; ``y = h + SwiGLU(RMSNorm(h))``.

    Args:
        config: the family config (read once here to build the modules).
        rotation: the model's (shared, parameter-free) holographic rotation.
    Shapes:
        x ``[B, T, d]``, state ``[B, T, S]`` -> same shapes.
    """

    def __init__(self, config: NanoHammerConfig, rotation: HolographicRotation) -> None:
        super().__init__()
        self.rotation = rotation  # the model's shared instance (no parameters, no buffers)
        eps = config.rms_norm_eps
        self.state_cell = StateUpdateCell(config.state_hidden_size, config.num_state_heads, eps)
        self.state_projection = StateTokenProjection(config.state_hidden_size, config.hidden_size, eps)
        self.input_layernorm = RMSNorm(config.hidden_size, eps)
        self.self_attn = NanoHammerAttention(
            config.hidden_size,
            config.num_attention_heads,
            config.num_key_value_heads,
            config.head_dim,
            bias=config.attention_bias,
            dropout=config.attention_dropout,
        )
        self.post_attention_layernorm = RMSNorm(config.hidden_size, eps)
        self.mlp = SwiGLU(config.hidden_size, config.intermediate_size, bias=config.mlp_bias)

    def forward(self, x, state, position_ids, cos, sin, bias, cache: HammerLayerState | None = None):
        state = self.state_cell(state)
        previous = cache.last_state if cache is not None else None
        if cache is not None:
            cache.last_state = state[:, -1:]
        tokens = self.state_projection(self.rotation.unrotate(shift_right(state, previous), position_ids))
        x = x + self.self_attn(self.input_layernorm(x), self.input_layernorm(tokens), cos, sin, bias, cache)
        x = x + self.mlp(self.post_attention_layernorm(x))
        return x, state


class NanoHammerPreTrainedModel(SLMPreTrainedModel):
    config_class = NanoHammerConfig
    _no_split_modules = ["NanoHammerDecoderLayer"]

    def _init_weights(self, module: nn.Module) -> None:
        super()._init_weights(module)
        if isinstance(module, StateUpdateCell):
            init.constant_(module.step_size, 0.1)


class NanoHammerModel(SLMBaseModel, NanoHammerPreTrainedModel):
    """Embedding, holographic integration, decoder stack and final norm; returns the last hidden states."""

    def __init__(self, config: NanoHammerConfig) -> None:
        super().__init__(config)
        self.embed_tokens = nn.Embedding(config.vocab_size, config.hidden_size, config.pad_token_id)
        self.token_to_state = nn.Linear(config.hidden_size, config.state_hidden_size, bias=False)
        self.holographic_rope = ROTATIONS[config.rotation_style](config.state_hidden_size, config.state_rope_base)
        self.layers = nn.ModuleList(
            NanoHammerDecoderLayer(config, self.holographic_rope) for _ in range(config.num_hidden_layers)
        )
        self.norm = RMSNorm(config.hidden_size, config.rms_norm_eps)
        self.rotary_emb = RotaryEmbedding(
            config.head_dim, config.rope_theta, 1.0, min(config.max_position_embeddings, 4096)
        )
        self.self_offset = 1 if config.hidden_attends_self else 0
        self.post_init()

    def new_cache(self, batch_size: int | None = None) -> ModelCache:
        return ModelCache([HammerLayerState() for _ in self.layers], extra={"cumsum": RunningSum()})

    def layer_loop(self, inputs: ForwardInputs) -> torch.Tensor:
        x, mask, cache = inputs.embeds, inputs.attention_mask, inputs.cache
        b, t, _ = x.shape
        position_ids = inputs.position_ids.expand(b, t)  # [1, T] or [B, T], checked by the frame
        cos, sin = self.rotary_emb(position_ids)
        bias = inputs.collect_weights(hammer_bias(mask, t, inputs.past, self.self_offset, x.device))

        rotated = self.holographic_rope.rotate(self.token_to_state(x), position_ids)
        if mask is not None:
            rotated = rotated * mask[:, -t:, None].to(rotated.dtype)  # padding never enters the sum
        state = cache.extra["cumsum"].integrate(rotated) if cache is not None else rotated.float().cumsum(1).to(rotated.dtype)
        for i, layer in enumerate(self.layers):
            x, state = layer(x, state, position_ids, cos, sin, bias, inputs.state(i))
            inputs.record(x)
        return self.norm(x)


class NanoHammerForCausalLM(SLMForCausalLM, NanoHammerPreTrainedModel):
    """NanoHammer with an LM head (untied by default, as in the seed)."""

    base_model_class = NanoHammerModel


def cache_nbytes(cache: ModelCache) -> dict[str, int]:
    """Bytes held by a NanoHammer cache: ``filled`` (keys/values of the seen tokens plus the O(1)
    running states) and ``allocated`` (including the spare capacity of the growing K/V buffers)."""
    filled = allocated = 0
    for state in cache.layers:
        if state.keys is not None:
            per_slot = state.keys[:, :, :1].nbytes + state.values[:, :, :1].nbytes
            filled += per_slot * state.length
            allocated += state.keys.nbytes + state.values.nbytes
        if state.last_state is not None:
            filled += state.last_state.nbytes
            allocated += state.last_state.nbytes
    total = cache.extra["cumsum"].total
    if total is not None:
        filled += total.nbytes
        allocated += total.nbytes
    return {"filled": filled, "allocated": allocated}


def audit_parameters(model: NanoHammerForCausalLM) -> dict[str, int]:
    """Parameter counts by component, shared tensors counted once."""
    inner = model.model

    def count(modules) -> int:
        return sum(p.numel() for m in modules for p in m.parameters())

    layers = list(inner.layers)
    rows = {
        **model.embedding_rows(),
        "Token -> state projection": inner.token_to_state.weight.numel(),
        "State update cells": count(layer.state_cell for layer in layers),
        "State token projections": count(layer.state_projection for layer in layers),
        "Attention": count(layer.self_attn for layer in layers),
        "MLP": count(layer.mlp for layer in layers),
        "Block norms": count(m for layer in layers for m in (layer.input_layernorm, layer.post_attention_layernorm)),
        "Final norm": inner.norm.weight.numel(),
    }
    rows["Total"] = sum(p.numel() for p in model.parameters())
    return rows
