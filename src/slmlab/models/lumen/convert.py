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
