"""Config mapping between transformers' ``Lfm2Config`` and :class:`Lfm2SmallConfig`.

Parameter names are identical on both sides (and in the seed's ``LFM2Small`` backbone), so a
state_dict moves unchanged; only the configs need translating:

* ``norm_eps`` <-> ``rms_norm_eps``, ``conv_L_cache`` <-> ``conv_kernel_size``,
  ``num_hidden_layers`` <-> ``num_layers``;
* ``layer_types`` (``"conv"``/``"full_attention"``) <-> ``layer_order`` (``"conv"``/``"attn"``);
* ``rope_parameters["rope_theta"]`` <-> ``rope_theta`` (only default RoPE is supported).

One behavioural difference, on padded batches only: with ``conv_bias=True`` transformers zeroes
the *input* of ``in_proj`` at padded positions, so the bias products ``b_B * b_x`` still enter the
convolution; we zero the convolution input itself, so a padded row equals the row run alone.

Exports (:data:`EXPORT`):

* ``--to hf`` writes transformers' ``Lfm2ForCausalLM`` holding the same state_dict
  (:func:`transformers_twin`); a model with ``conv_bias=True`` is exported as remote code, since
  transformers computes its padded rows differently (above);
* ``--to gguf`` writes llama.cpp's ``lfm2`` architecture (:data:`GGUF`; gated short convolutions
  beside GQA with QK-norm): the final ``embedding_norm`` is llama.cpp's ``token_embd_norm``; the
  depthwise conv weight ``[d, 1, K]`` is stored as ``[d, K]`` (llama.cpp's ``{K, d}``) and kept in
  f32; attention layers get their KV head count and conv layers 0 in
  ``lfm2.attention.head_count_kv``, which is how llama.cpp tells the layer kinds apart; llama.cpp
  runs lfm2 with rotate-half RoPE, so q/k rows stay as they are. llama.cpp's lfm2 has no conv biases.
"""

from __future__ import annotations

import torch
from torch import nn

from ..export_info import ExportInfo, GGUFLayout, same_names_twin
from .configuration_lfm2 import Lfm2SmallConfig


def config_from_transformers(hf_config) -> Lfm2SmallConfig:
    """``transformers.Lfm2Config`` -> :class:`Lfm2SmallConfig` (same maths, same weights)."""
    rope = dict(getattr(hf_config, "rope_parameters", None) or {})
    rope_type = rope.get("rope_type", "default")
    if rope_type != "default":
        raise ValueError(f"only default RoPE is supported, the Lfm2 config has rope_type={rope_type!r}")
    head_dim = getattr(hf_config, "head_dim", None)
    if head_dim is not None and head_dim != hf_config.hidden_size // hf_config.num_attention_heads:
        raise ValueError(f"head_dim={head_dim} other than hidden_size/num_attention_heads is not supported")
    return Lfm2SmallConfig(
        vocab_size=hf_config.vocab_size, hidden_size=hf_config.hidden_size, intermediate_size=hf_config.intermediate_size,
        num_attention_heads=hf_config.num_attention_heads, num_key_value_heads=hf_config.num_key_value_heads,
        num_layers=hf_config.num_hidden_layers, layer_types=list(hf_config.layer_types),
        conv_kernel_size=hf_config.conv_L_cache, block_auto_adjust_ff_dim=hf_config.block_auto_adjust_ff_dim,
        block_multiple_of=hf_config.block_multiple_of, block_ffn_dim_multiplier=hf_config.block_ffn_dim_multiplier,
        rms_norm_eps=hf_config.norm_eps, rope_theta=rope.get("rope_theta", 1_000_000.0),
        max_position_embeddings=hf_config.max_position_embeddings, initializer_range=hf_config.initializer_range,
        conv_bias=hf_config.conv_bias, tie_word_embeddings=hf_config.tie_word_embeddings,
    )


def config_to_transformers(config: Lfm2SmallConfig, **overrides):
    """:class:`Lfm2SmallConfig` -> ``transformers.Lfm2Config`` describing the same model."""
    from transformers import Lfm2Config

    kwargs = dict(
        vocab_size=config.vocab_size, hidden_size=config.hidden_size, intermediate_size=config.intermediate_size,
        num_hidden_layers=config.num_layers, num_attention_heads=config.num_attention_heads,
        num_key_value_heads=config.num_key_value_heads, max_position_embeddings=config.max_position_embeddings,
        initializer_range=config.initializer_range, norm_eps=config.rms_norm_eps,
        rope_parameters={"rope_type": "default", "rope_theta": config.rope_theta},
        conv_bias=config.conv_bias, conv_L_cache=config.conv_kernel_size, block_multiple_of=config.block_multiple_of,
        block_ffn_dim_multiplier=config.block_ffn_dim_multiplier,
        block_auto_adjust_ff_dim=config.block_auto_adjust_ff_dim, layer_types=config.layer_types,
        tie_word_embeddings=config.tie_word_embeddings,
    )
    return Lfm2Config(**{**kwargs, **overrides})


def from_transformers(hf_model: nn.Module) -> nn.Module:
    """Build our :class:`Lfm2SmallForCausalLM` from a transformers ``Lfm2ForCausalLM`` (weights copied)."""
    from .modeling_lfm2 import Lfm2SmallForCausalLM

    model = Lfm2SmallForCausalLM(config_from_transformers(hf_model.config))
    with torch.no_grad():
        model.load_state_dict(hf_model.state_dict(), strict=True)
    return model.to(next(hf_model.parameters()).dtype)


def transformers_twin(model, special_ids: dict):
    """``(transformers' Lfm2ForCausalLM holding model's weights, None)``, or ``(None, why not)`` for a
    model with conv biases. Parameter names are identical on both sides."""
    config = model.config
    if config.conv_bias:
        return None, "transformers' Lfm2 computes padded rows differently when conv_bias=True"
    from transformers import Lfm2ForCausalLM

    return same_names_twin(Lfm2ForCausalLM, config_to_transformers(config, **special_ids), model)


def gguf_tensor(name: str, array, config):
    """An LFM2 tensor in llama.cpp's ``lfm2`` layout: the depthwise conv weight loses its middle axis."""
    if name.endswith("conv.conv.weight"):
        return array.reshape(array.shape[0], array.shape[-1])  # [d, 1, K] -> [d, K]
    return array


def gguf_metadata(config) -> dict:
    """llama.cpp's ``lfm2`` hyper-parameters of an LFM2 config; one with conv biases is refused."""
    if config.conv_bias:
        raise ValueError(
            "this lfm2 model has conv biases (conv_bias=True); llama.cpp's 'lfm2' architecture has none, so it"
            " cannot be exported to GGUF (use --to hf)"
        )
    # llama.cpp's lfm2 reads a conv layer as one with no KV heads
    kv_heads = [config.num_key_value_heads if kind == "attn" else 0 for kind in config.layer_order]
    return {"embedding_length": config.hidden_size, "block_count": config.num_layers,
            "feed_forward_length": config.effective_intermediate_size, "head_count": config.num_attention_heads,
            "head_count_kv": kv_heads, "rope_freq_base": float(config.rope_theta),
            "layer_norm_rms_eps": float(config.rms_norm_eps), "shortconv_l_cache": config.conv_kernel_size,
            "vocab_size": config.vocab_size}

GGUF = GGUFLayout(arch="lfm2", metadata=gguf_metadata, tensor=gguf_tensor, keep_f32=(".shortconv.conv.",))
EXPORT = ExportInfo(display_name="LFM2", hf_twin=transformers_twin, gguf=GGUF)
