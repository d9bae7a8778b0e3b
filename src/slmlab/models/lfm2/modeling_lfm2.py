"""LFM2Small (seed 004): the LFM2 backbone as a transformers causal LM.

LFM2 (Liquid AI, "LFM2 Technical Report", arXiv:2511.23404) interleaves *gated short
convolutions* with grouped-query attention whose queries and keys are RMS-normalised per head;
every block is pre-norm with a SwiGLU feed-forward, and the stack ends with ``embedding_norm``.

Parameter names equal those of transformers' ``Lfm2ForCausalLM`` (and the seed's ``LFM2Small``
backbone), so their state_dicts load with ``strict=True`` for the equivalent config (see
:mod:`.convert` for the config mapping). :class:`Lfm2SmallBackbone` is the stack without token
embeddings (``inputs_embeds`` in, normalised hidden states out) for encoders that embed their own
inputs; :class:`Lfm2SmallModel` adds ``embed_tokens``.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import nn
from transformers.modeling_layers import GradientCheckpointingLayer
from transformers.modeling_outputs import BaseModelOutputWithPast

from ...layers import (
    AttentionBias,
    CausalDepthwiseConv1d,
    ConcatenatedWeights,
    ConvState,
    KVState,
    LayerState,
    ModelCache,
    RMSNorm,
    RotaryEmbedding,
    attend_projected,
)
from ...layers.fused import fusable, project_each
from ...layers.masks import causal_bias, has_padding
from ..base import ForwardInputs, SLMBaseModel, SLMForCausalLM, SLMPreTrainedModel
from .configuration_lfm2 import Lfm2SmallConfig
from .decode import lfm2_decode_plan


@dataclass
class MixerInputs:
    """What the token mixers of one forward share, built once per forward.

    Args:
        cos, sin: RoPE tables ``[B, T, D]`` for the current tokens (attention layers).
        bias: the causal/padding bias of the attention layers.
        conv_mask: ``[B, T, 1]`` 1/0 for real/padded current tokens, ``None`` without padding
            (conv layers zero padded inputs with it so padding never enters the conv state).
    """

    cos: torch.Tensor
    sin: torch.Tensor
    bias: AttentionBias
    conv_mask: torch.Tensor | None


class Lfm2ShortConv(nn.Module):
    """Gated short convolution of LFM2: ``y = out_proj(C ⊙ conv_K(B ⊙ x))`` with
    ``[B, C, x] = in_proj(h)`` and ``conv_K`` a causal depthwise convolution of kernel ``K``.

    Inputs of the convolution at padded positions are zeroed. With a :class:`ConvState` the
    layer streams: a one-token step costs O(K · d), whatever the context length.

    Args:
        hidden_size: ``d``.
        kernel_size: ``K``.
        bias: biases on ``in_proj``, ``conv`` and ``out_proj`` (LFM2's ``conv_bias``).
    Shapes:
        x ``[B, T, d]``; conv_mask ``[B, T, 1]`` or ``None`` -> ``[B, T, d]``.
    """

    def __init__(self, hidden_size: int, kernel_size: int, bias: bool = False) -> None:
        super().__init__()
        self.in_proj = nn.Linear(hidden_size, 3 * hidden_size, bias=bias)
        self.conv = CausalDepthwiseConv1d(hidden_size, kernel_size, bias=bias)
        self.out_proj = nn.Linear(hidden_size, hidden_size, bias=bias)

    def forward(self, x: torch.Tensor, conv_mask: torch.Tensor | None, state: ConvState | None = None) -> torch.Tensor:
        b_gate, c_gate, u = self.in_proj(x).chunk(3, dim=-1)
        u = b_gate * u
        if conv_mask is not None:
            u = u * conv_mask
        y = self.conv(u.transpose(1, 2), state).transpose(1, 2)
        return self.out_proj(c_gate * y)


class Lfm2Attention(nn.Module):
    """GQA self-attention with per-head QK RMSNorm before RoPE (LFM2; QK-norm as in
    Dehghani et al. 2023, arXiv:2302.05442): ``softmax(RoPE(n_q(q)) RoPE(n_k(k))^T / sqrt(D)) v``.

    Key/value heads are shared by ``H / H_kv`` query heads without copies (``enable_gqa``); q, k and
    v come from one GEMM over the concatenated projection weights (:class:`ConcatenatedWeights`).

    Args:
        hidden_size: ``d``.
        num_heads: ``H``.
        num_kv_heads: ``H_kv`` (divides ``H``).
        head_dim: ``D``.
        eps: epsilon of the QK norms.
    Shapes:
        x ``[B, T, d]``; cos/sin ``[B, T, D]`` -> ``[B, T, d]``.
    """

    def __init__(self, hidden_size: int, num_heads: int, num_kv_heads: int, head_dim: int, eps: float) -> None:
        super().__init__()
        self.num_heads, self.num_kv_heads, self.head_dim = num_heads, num_kv_heads, head_dim
        self.q_proj = nn.Linear(hidden_size, num_heads * head_dim, bias=False)
        self.k_proj = nn.Linear(hidden_size, num_kv_heads * head_dim, bias=False)
        self.v_proj = nn.Linear(hidden_size, num_kv_heads * head_dim, bias=False)
        self.out_proj = nn.Linear(num_heads * head_dim, hidden_size, bias=False)
        self.q_layernorm = RMSNorm(head_dim, eps)
        self.k_layernorm = RMSNorm(head_dim, eps)
        self._qkv_weight = ConcatenatedWeights()

    def forward(
        self, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, bias: AttentionBias, state: KVState | None = None
    ) -> torch.Tensor:
        if fusable(self.q_proj, self.k_proj, self.v_proj):
            qkv = F.linear(x, self._qkv_weight(self.q_proj.weight, self.k_proj.weight, self.v_proj.weight))
        else:  # e.g. LoRA-wrapped projections: each its own forward
            qkv = project_each(x, self.q_proj, self.k_proj, self.v_proj)
        heads = (self.num_heads, self.num_kv_heads, self.head_dim)
        return self.out_proj(attend_projected(qkv, heads, self.q_layernorm, self.k_layernorm, cos, sin, bias, state))


class Lfm2MLP(nn.Module):
    """SwiGLU (Shazeer 2020, arXiv:2002.05202) with LFM2's names: ``w2(silu(w1 x) ⊙ w3 x)``;
    ``w1 x`` and ``w3 x`` come from one GEMM over ``[w1; w3]`` (:class:`ConcatenatedWeights`).

    Args:
        hidden_size: ``d``.
        intermediate_size: the (already auto-adjusted) inner width.
    Shapes:
        x ``[B, T, d]`` -> ``[B, T, d]``.
    """

    def __init__(self, hidden_size: int, intermediate_size: int) -> None:
        super().__init__()
        self.w1 = nn.Linear(hidden_size, intermediate_size, bias=False)
        self.w3 = nn.Linear(hidden_size, intermediate_size, bias=False)
        self.w2 = nn.Linear(intermediate_size, hidden_size, bias=False)
        self._w13 = ConcatenatedWeights()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if fusable(self.w1, self.w3):
            gate, up = F.linear(x, self._w13(self.w1.weight, self.w3.weight)).chunk(2, dim=-1)
        else:  # e.g. LoRA-wrapped projections: each its own forward
            gate, up = project_each(x, self.w1, self.w3).chunk(2, dim=-1)
        return self.w2(F.silu(gate) * up)


class Lfm2DecoderLayer(GradientCheckpointingLayer, ABC):
    """Pre-norm block: ``h = x + mix(operator_norm(x))``, ``y = h + feed_forward(ffn_norm(h))``.

    Subclasses choose the token mixer (``conv`` or ``self_attn``) and its cache state; which
    subclass a layer is comes from ``config.layer_order`` (see :data:`LAYER_CLASSES`).
    """

    def __init__(self, config: Lfm2SmallConfig) -> None:
        super().__init__()
        self.operator_norm = RMSNorm(config.hidden_size, config.rms_norm_eps)
        self.ffn_norm = RMSNorm(config.hidden_size, config.rms_norm_eps)
        self.feed_forward = Lfm2MLP(config.hidden_size, config.effective_intermediate_size)

    @abstractmethod
    def mix(self, x: torch.Tensor, inputs: MixerInputs, state: LayerState | None) -> torch.Tensor:
        """The token mixer on the normalised input ``[B, T, d]``, updating ``state`` when given."""

    def forward(self, x: torch.Tensor, inputs: MixerInputs, state: LayerState | None = None) -> torch.Tensor:
        x = x + self.mix(self.operator_norm(x), inputs, state)
        return x + self.feed_forward(self.ffn_norm(x))


class Lfm2ConvDecoderLayer(Lfm2DecoderLayer):
    """A block whose mixer is the gated short convolution; its cache state is a :class:`ConvState`."""

    state_class = ConvState

    def __init__(self, config: Lfm2SmallConfig) -> None:
        super().__init__(config)
        self.conv = Lfm2ShortConv(config.hidden_size, config.conv_kernel_size, config.conv_bias)

    def mix(self, x: torch.Tensor, inputs: MixerInputs, state: ConvState | None) -> torch.Tensor:
        return self.conv(x, inputs.conv_mask, state)


class Lfm2AttentionDecoderLayer(Lfm2DecoderLayer):
    """A block whose mixer is GQA attention with QK-norm; its cache state is a :class:`KVState`."""

    state_class = KVState

    def __init__(self, config: Lfm2SmallConfig) -> None:
        super().__init__(config)
        self.self_attn = Lfm2Attention(
            config.hidden_size, config.num_attention_heads, config.num_key_value_heads, config.head_dim, config.rms_norm_eps
        )

    def mix(self, x: torch.Tensor, inputs: MixerInputs, state: KVState | None) -> torch.Tensor:
        return self.self_attn(x, inputs.cos, inputs.sin, inputs.bias, state)


LAYER_CLASSES: dict[str, type[Lfm2DecoderLayer]] = {"conv": Lfm2ConvDecoderLayer, "attn": Lfm2AttentionDecoderLayer}


class Lfm2SmallPreTrainedModel(SLMPreTrainedModel):
    config_class = Lfm2SmallConfig
    _no_split_modules = ["Lfm2ConvDecoderLayer", "Lfm2AttentionDecoderLayer"]


class Lfm2SmallBackbone(SLMBaseModel, Lfm2SmallPreTrainedModel):
    """The LFM2 stack without token embeddings: decoder layers, RoPE and ``embedding_norm``.

    For the seed's default config it holds exactly 6,627,712 parameters. Encoders with their own
    input embedding (the transaction encoder) feed it ``inputs_embeds``.

    Shapes:
        inputs_embeds ``[B, T, d]`` -> ``last_hidden_state [B, T, d]`` (after ``embedding_norm``).
    """

    def __init__(self, config: Lfm2SmallConfig) -> None:
        super().__init__(config)
        self.layers = nn.ModuleList(LAYER_CLASSES[kind](config) for kind in config.layer_order)
        self.rotary_emb = RotaryEmbedding(config.head_dim, config.rope_theta, 1.0, config.max_position_embeddings)
        self.embedding_norm = RMSNorm(config.hidden_size, config.rms_norm_eps)
        self.post_init()

    def new_cache(self, batch_size: int | None = None) -> ModelCache:
        """One state per layer: the last ``K-1`` conv inputs for conv layers, K/V for attention."""
        return ModelCache([layer.state_class() for layer in self.layers])

    def embed(self, input_ids: torch.Tensor) -> torch.Tensor:
        raise ValueError(f"{type(self).__name__} has no token embeddings; pass inputs_embeds (or use Lfm2SmallModel)")

    def layer_loop(self, inputs: ForwardInputs) -> torch.Tensor:
        t, mask, x = inputs.length, inputs.attention_mask, inputs.embeds
        cos, sin = self.rotary_emb(inputs.position_ids)
        conv_mask = mask[:, -t:, None].to(x.dtype) if has_padding(mask) else None
        bias = inputs.collect_weights(causal_bias(mask, t, inputs.past + t, x.device))
        mixer_inputs = MixerInputs(cos, sin, bias, conv_mask)
        for i, layer in enumerate(self.layers):
            x = layer(x, mixer_inputs, inputs.state(i))
            inputs.record(x)
        return self.embedding_norm(x)

    def forward(
        self,
        inputs_embeds: torch.Tensor | None = None,
        attention_mask: torch.Tensor | None = None,
        position_ids: torch.Tensor | None = None,
        cache: ModelCache | None = None,
        use_cache: bool | None = None,
        past_key_values: ModelCache | None = None,
        output_hidden_states: bool | None = None,
        **kwargs,
    ) -> BaseModelOutputWithPast:
        """Run the stack (the shared frame, :meth:`SLMBaseModel.forward`, with ``inputs_embeds`` first).

        Args:
            inputs_embeds: ``[B, T, d]`` floating point.
            attention_mask: ``[B, past + T]``, 1 = real token, 0 = padding (left padding).
            position_ids: ``[B, T]``; by default counted over real tokens only.
            cache: a :class:`ModelCache` from a previous call (or :meth:`new_cache`).
            use_cache: build/return a cache (default ``config.use_cache``).
        """
        return SLMBaseModel.forward(
            self, inputs_embeds=inputs_embeds, attention_mask=attention_mask, position_ids=position_ids, cache=cache,
            use_cache=use_cache, past_key_values=past_key_values, output_hidden_states=output_hidden_states, **kwargs,
        )


class Lfm2SmallModel(Lfm2SmallBackbone):
    """:class:`Lfm2SmallBackbone` with a token embedding table (``embed_tokens``); its forward is
    the shared frame's (``input_ids`` first, as every transformers base model)."""

    def __init__(self, config: Lfm2SmallConfig) -> None:
        super().__init__(config)
        self.embed_tokens = nn.Embedding(config.vocab_size, config.hidden_size)
        self.post_init()

    embed = SLMBaseModel.embed
    forward = SLMBaseModel.forward


class Lfm2SmallForCausalLM(SLMForCausalLM, Lfm2SmallPreTrainedModel):
    """LFM2Small with an LM head (tied to ``embed_tokens`` by default, as in LFM2)."""

    base_model_class = Lfm2SmallModel
    decode_plan_builder = staticmethod(lfm2_decode_plan)


def audit_parameters(model: Lfm2SmallForCausalLM | Lfm2SmallBackbone) -> dict[str, int]:
    """Parameter budget by component, shared (tied) tensors counted once.

    ``Backbone`` is the seed's own figure (decoder layers + ``embedding_norm``): 6,627,712 for
    the default config.
    """
    inner = model.model if isinstance(model, Lfm2SmallForCausalLM) else model
    conv = sum(p.numel() for layer in inner.layers if isinstance(layer, Lfm2ConvDecoderLayer) for p in layer.parameters())
    attn = sum(p.numel() for layer in inner.layers if isinstance(layer, Lfm2AttentionDecoderLayer) for p in layer.parameters())
    final_norm = inner.embedding_norm.weight.numel()
    if isinstance(model, Lfm2SmallForCausalLM):
        rows = model.embedding_rows()
    else:  # a bare stack: its own table, if it has one
        rows = {"Embedding table": inner.embed_tokens.weight.numel()} if isinstance(inner, Lfm2SmallModel) else {}
    rows.update(
        {
            "Conv blocks": conv,
            "Attention blocks": attn,
            "Final norm (embedding_norm)": final_norm,
            "Backbone (blocks + embedding_norm)": conv + attn + final_norm,
            "Total": sum(p.numel() for p in model.parameters()),
        }
    )
    return rows
