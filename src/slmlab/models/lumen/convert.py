"""Checkpoints of the seed's ``SAGE_Lumen_3M`` module, onto :class:`LumenForCausalLM` names."""

from __future__ import annotations

import torch


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


def config_to_transformers(config, **overrides):
    """:class:`LumenConfig` -> ``transformers.LlamaConfig`` describing the same model (same state_dict
    names, same maths). Llama always has an MLP: an attention-only Lumen (``intermediate_dim=0``) has
    no Llama twin and is refused."""
    from transformers import LlamaConfig

    if int(config.intermediate_dim) <= 0:
        raise ValueError("an attention-only Lumen (intermediate_dim=0) has no transformers Llama equivalent")
    kwargs = dict(
        vocab_size=config.vocab_size,
        hidden_size=config.hidden_dim,
        intermediate_size=config.intermediate_dim,
        num_hidden_layers=config.num_layers,
        num_attention_heads=config.num_heads,
        num_key_value_heads=config.num_kv_heads,
        head_dim=config.head_dim,
        max_position_embeddings=config.max_seq_len,
        rms_norm_eps=config.rms_norm_eps,
        rope_parameters={"rope_type": "default", "rope_theta": config.rope_theta},
        hidden_act="silu",
        attention_bias=False,
        mlp_bias=False,
        initializer_range=config.initializer_range,
        tie_word_embeddings=config.tie_word_embeddings,
    )
    return LlamaConfig(**{**kwargs, **overrides})
