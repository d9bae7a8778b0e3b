"""SAGE-Lumen: a tiny Llama-style causal LM (seed 002), as a transformers model.

Parameter names equal those of transformers' ``LlamaForCausalLM`` for the equivalent config, so a
Llama state_dict loads with ``strict=True``; :func:`.convert.convert_seed_state_dict` maps a
state_dict of the seed's ``SAGE_Lumen_3M`` module onto ours.
"""

from __future__ import annotations

import torch
from torch import nn
from transformers.modeling_layers import GradientCheckpointingLayer

from ...layers import CausalSelfAttention, KVState, ModelCache, RMSNorm, RotaryEmbedding, SwiGLU
from ...layers.masks import causal_bias
from ..base import ForwardInputs, SLMBaseModel, SLMForCausalLM, SLMPreTrainedModel
from .configuration_lumen import LumenConfig
from .decode import lumen_decode_plan


class LumenDecoderLayer(GradientCheckpointingLayer):
    """Pre-norm block: ``h = x + Attn(RMSNorm(x))``, ``y = h + SwiGLU(RMSNorm(h))``.

    With ``intermediate_dim == 0`` the block is attention-only (``y = h``; no MLP parameters).
    """

    def __init__(self, config: LumenConfig) -> None:
        super().__init__()
        self.input_layernorm = RMSNorm(config.hidden_dim, config.rms_norm_eps)
        self.self_attn = CausalSelfAttention(config.hidden_dim, config.num_heads, config.num_kv_heads)
        if config.intermediate_dim > 0:
            self.post_attention_layernorm = RMSNorm(config.hidden_dim, config.rms_norm_eps)
            self.mlp = SwiGLU(config.hidden_dim, config.intermediate_dim)
        else:
            self.post_attention_layernorm = self.mlp = None

    def forward(self, x, cos, sin, bias, state: KVState | None = None) -> torch.Tensor:
        x = x + self.self_attn(self.input_layernorm(x), cos, sin, bias, state)
        if self.mlp is None:
            return x
        return x + self.mlp(self.post_attention_layernorm(x))


class LumenPreTrainedModel(SLMPreTrainedModel):
    config_class = LumenConfig
    _no_split_modules = ["LumenDecoderLayer"]


class LumenModel(SLMBaseModel, LumenPreTrainedModel):
    """Embedding, decoder stack and final norm; returns the last hidden states."""

    def __init__(self, config: LumenConfig) -> None:
        super().__init__(config)
        self.embed_tokens = nn.Embedding(config.vocab_size, config.hidden_dim)
        self.layers = nn.ModuleList(LumenDecoderLayer(config) for _ in range(config.num_layers))
        self.norm = RMSNorm(config.hidden_dim, config.rms_norm_eps)
        self.rotary_emb = RotaryEmbedding(config.head_dim, config.rope_theta, 1.0, config.max_seq_len)
        self.post_init()

    def new_cache(self, batch_size: int | None = None) -> ModelCache:
        return ModelCache([KVState() for _ in self.layers])

    def layer_loop(self, inputs: ForwardInputs) -> torch.Tensor:
        x = inputs.embeds
        cos, sin = self.rotary_emb(inputs.position_ids)
        bias = inputs.collect_weights(causal_bias(inputs.attention_mask, inputs.length, inputs.past + inputs.length, x.device))
        for i, layer in enumerate(self.layers):
            x = layer(x, cos, sin, bias, inputs.state(i))
            inputs.record(x)
        return self.norm(x)


class LumenForCausalLM(SLMForCausalLM, LumenPreTrainedModel):
    """SAGE-Lumen with an LM head tied to the embedding table (by default)."""

    base_model_class = LumenModel
    decode_plan_builder = staticmethod(lumen_decode_plan)


def audit_parameters(model: LumenForCausalLM) -> dict[str, int]:
    """The seed's parameter-budget categories, counted truthfully (shared tensors once)."""
    inner = model.model
    embed = inner.embed_tokens.weight.numel()
    total = sum(p.numel() for p in model.parameters())  # parameters() yields a tied tensor once
    return {
        **model.embedding_rows(),
        "Decoder blocks": sum(p.numel() for p in inner.layers.parameters()),
        "Final norm": sum(p.numel() for p in inner.norm.parameters()),
        "Unique (without embedding table)": total - embed,
        "Total": total,
    }
