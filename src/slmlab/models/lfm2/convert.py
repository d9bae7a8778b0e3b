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
"""

from __future__ import annotations

import torch
from torch import nn

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
        vocab_size=hf_config.vocab_size,
        hidden_size=hf_config.hidden_size,
        intermediate_size=hf_config.intermediate_size,
        num_attention_heads=hf_config.num_attention_heads,
        num_key_value_heads=hf_config.num_key_value_heads,
        num_layers=hf_config.num_hidden_layers,
        layer_types=list(hf_config.layer_types),
        conv_kernel_size=hf_config.conv_L_cache,
        block_auto_adjust_ff_dim=hf_config.block_auto_adjust_ff_dim,
        block_multiple_of=hf_config.block_multiple_of,
        block_ffn_dim_multiplier=hf_config.block_ffn_dim_multiplier,
        rms_norm_eps=hf_config.norm_eps,
        rope_theta=rope.get("rope_theta", 1_000_000.0),
        max_position_embeddings=hf_config.max_position_embeddings,
        initializer_range=hf_config.initializer_range,
        conv_bias=hf_config.conv_bias,
        tie_word_embeddings=hf_config.tie_word_embeddings,
    )


def config_to_transformers(config: Lfm2SmallConfig, **overrides):
    """:class:`Lfm2SmallConfig` -> ``transformers.Lfm2Config`` describing the same model."""
    from transformers import Lfm2Config

    kwargs = dict(
        vocab_size=config.vocab_size,
        hidden_size=config.hidden_size,
        intermediate_size=config.intermediate_size,
        num_hidden_layers=config.num_layers,
        num_attention_heads=config.num_attention_heads,
        num_key_value_heads=config.num_key_value_heads,
        max_position_embeddings=config.max_position_embeddings,
        initializer_range=config.initializer_range,
        norm_eps=config.rms_norm_eps,
        rope_parameters={"rope_type": "default", "rope_theta": config.rope_theta},
        conv_bias=config.conv_bias,
        conv_L_cache=config.conv_kernel_size,
        block_multiple_of=config.block_multiple_of,
        block_ffn_dim_multiplier=config.block_ffn_dim_multiplier,
        block_auto_adjust_ff_dim=config.block_auto_adjust_ff_dim,
        layer_types=config.layer_types,
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
