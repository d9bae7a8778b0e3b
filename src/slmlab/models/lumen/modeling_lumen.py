"""SAGE-Lumen: a tiny Llama-style causal LM (seed 002), as a transformers model.

Parameter names equal those of transformers' ``LlamaForCausalLM`` for the equivalent config, so a
Llama state_dict loads with ``strict=True``; :func:`convert_seed_state_dict` maps a state_dict of
the seed's ``SAGE_Lumen_3M`` module onto ours.
"""

from __future__ import annotations

import torch
from torch import nn
from transformers import GenerationMixin
from transformers.modeling_outputs import BaseModelOutputWithPast, CausalLMOutputWithPast

from ...layers import CausalSelfAttention, KVState, ModelCache, RMSNorm, RotaryEmbedding, SwiGLU
from ...layers.masks import causal_bias, position_ids_from_mask
from ..base import (
    SLMPreTrainedModel,
    causal_lm_loss,
    resolve_cache_arg,
    validate_embeds,
    validate_input_ids,
    validate_length,
)
from .configuration_lumen import LumenConfig


class LumenDecoderLayer(nn.Module):
    """Pre-norm block: ``h = x + Attn(RMSNorm(x))``, ``y = h + SwiGLU(RMSNorm(h))``."""

    def __init__(self, config: LumenConfig) -> None:
        super().__init__()
        self.input_layernorm = RMSNorm(config.hidden_dim, config.rms_norm_eps)
        self.self_attn = CausalSelfAttention(config.hidden_dim, config.num_heads, config.num_kv_heads)
        self.post_attention_layernorm = RMSNorm(config.hidden_dim, config.rms_norm_eps)
        self.mlp = SwiGLU(config.hidden_dim, config.intermediate_dim)

    def forward(self, x, cos, sin, bias, state: KVState | None = None) -> torch.Tensor:
        x = x + self.self_attn(self.input_layernorm(x), cos, sin, bias, state)
        return x + self.mlp(self.post_attention_layernorm(x))


class LumenPreTrainedModel(SLMPreTrainedModel):
    config_class = LumenConfig
    _no_split_modules = ["LumenDecoderLayer"]


class LumenModel(LumenPreTrainedModel):
    """Embedding, decoder stack and final norm; returns the last hidden states."""

    def __init__(self, config: LumenConfig) -> None:
        super().__init__(config)
        self.embed_tokens = nn.Embedding(config.vocab_size, config.hidden_dim)
        self.layers = nn.ModuleList(LumenDecoderLayer(config) for _ in range(config.num_layers))
        self.norm = RMSNorm(config.hidden_dim, config.rms_norm_eps)
        self.rotary_emb = RotaryEmbedding(config.head_dim, config.rope_theta, 1.0, config.max_seq_len)
        self.post_init()

    def get_input_embeddings(self) -> nn.Embedding:
        return self.embed_tokens

    def set_input_embeddings(self, value: nn.Embedding) -> None:
        self.embed_tokens = value

    def new_cache(self, batch_size: int | None = None) -> ModelCache:
        return ModelCache([KVState() for _ in self.layers])

    def forward(
        self,
        input_ids: torch.Tensor | None = None,
        attention_mask: torch.Tensor | None = None,
        position_ids: torch.Tensor | None = None,
        cache: ModelCache | None = None,
        inputs_embeds: torch.Tensor | None = None,
        use_cache: bool | None = None,
        past_key_values: ModelCache | None = None,
        **kwargs,
    ) -> BaseModelOutputWithPast:
        if (input_ids is None) == (inputs_embeds is None):
            raise ValueError("pass exactly one of input_ids or inputs_embeds")
        cache = resolve_cache_arg(cache, past_key_values)
        if input_ids is not None:
            validate_input_ids(input_ids, self.config.vocab_size)
            inputs_embeds = self.embed_tokens(input_ids)
        else:
            validate_embeds(inputs_embeds, self.config.hidden_dim)
        use_cache = self.config.use_cache if use_cache is None else use_cache
        if use_cache and cache is None:
            cache = self.new_cache()
        b, t, _ = inputs_embeds.shape
        past = cache.seen_tokens if cache is not None else 0
        validate_length(past + t, self.config.max_seq_len, "max_seq_len")
        if attention_mask is not None and attention_mask.shape != (b, past + t):
            raise ValueError(
                f"attention_mask must have shape [batch, past + seq_len] = {(b, past + t)}, got {tuple(attention_mask.shape)}"
            )
        if position_ids is None:
            position_ids = position_ids_from_mask(attention_mask, past, t, b, inputs_embeds.device)
        cos, sin = self.rotary_emb(position_ids)
        bias = causal_bias(attention_mask, t, past + t, inputs_embeds.device)
        x = inputs_embeds
        for i, layer in enumerate(self.layers):
            x = layer(x, cos, sin, bias, cache[i] if cache is not None else None)
        if cache is not None:
            cache.seen_tokens += t
        return BaseModelOutputWithPast(last_hidden_state=self.norm(x), cache=cache if use_cache else None)


class LumenForCausalLM(LumenPreTrainedModel, GenerationMixin):
    """SAGE-Lumen with an LM head tied to the embedding table (by default)."""

    _tied_weights_keys = {"lm_head.weight": "model.embed_tokens.weight"}

    def __init__(self, config: LumenConfig) -> None:
        super().__init__(config)
        self.model = LumenModel(config)
        self.lm_head = nn.Linear(config.hidden_dim, config.vocab_size, bias=False)
        self.post_init()

    def get_input_embeddings(self) -> nn.Embedding:
        return self.model.embed_tokens

    def set_input_embeddings(self, value: nn.Embedding) -> None:
        self.model.embed_tokens = value

    def get_output_embeddings(self) -> nn.Linear:
        return self.lm_head

    def set_output_embeddings(self, value: nn.Linear) -> None:
        self.lm_head = value

    def new_cache(self, batch_size: int | None = None) -> ModelCache:
        return self.model.new_cache(batch_size)

    def forward(
        self,
        input_ids: torch.Tensor | None = None,
        attention_mask: torch.Tensor | None = None,
        position_ids: torch.Tensor | None = None,
        cache: ModelCache | None = None,
        inputs_embeds: torch.Tensor | None = None,
        labels: torch.Tensor | None = None,
        use_cache: bool | None = None,
        return_dict: bool | None = None,
        past_key_values: ModelCache | None = None,
        logits_to_keep: int = 0,
        **kwargs,
    ) -> CausalLMOutputWithPast:
        out = self.model(
            input_ids=input_ids,
            attention_mask=attention_mask,
            position_ids=position_ids,
            cache=cache,
            inputs_embeds=inputs_embeds,
            use_cache=use_cache,
            past_key_values=past_key_values,
        )
        hidden = out.last_hidden_state
        if logits_to_keep:
            hidden = hidden[:, -logits_to_keep:]
        logits = self.lm_head(hidden)
        loss = causal_lm_loss(logits, labels) if labels is not None else None
        result = CausalLMOutputWithPast(loss=loss, logits=logits, cache=out.cache)
        return result if return_dict is not False else result.to_tuple()


def convert_seed_state_dict(state_dict: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """Map a state_dict of the seed's ``SAGE_Lumen_3M`` onto :class:`LumenForCausalLM` names.

    The seed keeps blocks at ``layers.N.attention.*`` and the stack at the top level; ours nests
    them under ``model.`` with ``self_attn`` (the Llama names). The tied ``lm_head.weight`` is kept.
    """
    out = {}
    for name, tensor in state_dict.items():
        if name == "lm_head.weight":
            out[name] = tensor
            continue
        if name.startswith("rotary_emb.") or name == "causal_mask":
            continue
        out["model." + name.replace(".attention.", ".self_attn.")] = tensor
    return out


def audit_parameters(model: LumenForCausalLM) -> dict[str, int]:
    """The seed's parameter-budget categories, counted truthfully (shared tensors once)."""
    inner = model.model
    embed = inner.embed_tokens.weight.numel()
    blocks = sum(p.numel() for p in inner.layers.parameters())
    final_norm = sum(p.numel() for p in inner.norm.parameters())
    total = sum(p.numel() for p in model.parameters())  # parameters() yields a tied tensor once
    head_untied = 0 if model.lm_head.weight is inner.embed_tokens.weight else model.lm_head.weight.numel()
    label = "Tied embedding table" if not head_untied else "Embedding table"
    rows = {label: embed}
    if head_untied:
        rows["LM head (untied)"] = head_untied
    rows.update(
        {
            "Decoder blocks": blocks,
            "Final norm": final_norm,
            "Unique (without embedding table)": total - embed,
            "Total": total,
        }
    )
    return rows
