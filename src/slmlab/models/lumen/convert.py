"""Lumen in and out of slmlab: checkpoints of the seed's ``SAGE_Lumen_3M`` module onto
:class:`LumenForCausalLM` names, and the family's exports (:data:`EXPORT`).

Exports: a Lumen is a Llama decoder (RMSNorm, GQA with RoPE, SwiGLU) with Llama's own parameter
names, so

* ``--to hf`` writes transformers' ``LlamaForCausalLM`` holding the same state_dict
  (:func:`transformers_twin`); an attention-only Lumen (``intermediate_dim=0``) has no Llama twin and
  is exported as remote code;
* ``--to gguf`` writes llama.cpp's ``llama`` architecture (:data:`GGUF`): q/k rows are permuted per
  head from the rotate-half RoPE layout (transformers', ours) to the adjacent-pair layout llama.cpp's
  ``llama`` graph rotates (:func:`permute_qk`); every block needs its MLP.
"""

from __future__ import annotations

import torch

from ..export_info import ExportInfo, GGUFLayout, same_names_twin


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
        vocab_size=config.vocab_size, hidden_size=config.hidden_dim, intermediate_size=config.intermediate_dim,
        num_hidden_layers=config.num_layers, num_attention_heads=config.num_heads, num_key_value_heads=config.num_kv_heads,
        head_dim=config.head_dim, max_position_embeddings=config.max_seq_len, rms_norm_eps=config.rms_norm_eps,
        rope_parameters={"rope_type": "default", "rope_theta": config.rope_theta},
        hidden_act="silu", attention_bias=False, mlp_bias=False,
        initializer_range=config.initializer_range, tie_word_embeddings=config.tie_word_embeddings,
    )
    return LlamaConfig(**{**kwargs, **overrides})


def transformers_twin(model, special_ids: dict):
    """``(transformers' LlamaForCausalLM holding model's weights, None)``, or ``(None, why not)`` for an
    attention-only Lumen. The state_dict moves unchanged: Lumen's names are Llama's."""
    config = model.config
    if int(config.intermediate_dim) <= 0:
        return None, "an attention-only lumen (intermediate_dim=0) has no Llama equivalent"
    from transformers import LlamaForCausalLM

    return same_names_twin(LlamaForCausalLM, config_to_transformers(config, **special_ids), model)


def permute_qk(weight, n_heads: int):
    """llama.cpp's q/k row order for its ``llama`` graph: within each head, rows ``[0..D/2)`` and
    ``[D/2..D)`` (the two halves that rotate-half RoPE pairs) are interleaved to ``0, D/2, 1, D/2+1,
    ...`` (adjacent pairs). ``weight [n_heads * D, d_in]`` (a numpy array or tensor)."""
    rows = weight.shape[0]
    return weight.reshape(n_heads, 2, rows // n_heads // 2, *weight.shape[1:]).swapaxes(1, 2).reshape(weight.shape)


def gguf_tensor(name: str, array, config):
    """A Lumen tensor in llama.cpp's ``llama`` layout: q/k rows permuted (:func:`permute_qk`)."""
    if name.endswith("self_attn.q_proj.weight"):
        return permute_qk(array, config.num_heads)
    if name.endswith("self_attn.k_proj.weight"):
        return permute_qk(array, config.num_kv_heads)
    return array


def gguf_metadata(config) -> dict:
    """llama.cpp's ``llama`` hyper-parameters of a Lumen config; an attention-only one is refused."""
    if config.intermediate_dim == 0:
        raise ValueError(
            "this lumen model has no MLP sublayer (intermediate_dim=0); llama.cpp's 'llama' architecture requires"
            " one in every block, so it cannot be exported to GGUF (use --to hf)"
        )
    return {"embedding_length": config.hidden_dim, "block_count": config.num_layers,
            "feed_forward_length": config.intermediate_dim, "head_count": config.num_heads,
            "head_count_kv": config.num_kv_heads, "rope_dimension_count": config.head_dim,
            "rope_freq_base": float(config.rope_theta), "layer_norm_rms_eps": float(config.rms_norm_eps),
            "vocab_size": config.vocab_size}

GGUF = GGUFLayout(arch="llama", metadata=gguf_metadata, tensor=gguf_tensor)
EXPORT = ExportInfo(display_name="SAGE-Lumen", hf_twin=transformers_twin, gguf=GGUF)
