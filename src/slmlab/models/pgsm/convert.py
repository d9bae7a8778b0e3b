"""Checkpoints and configs of the seed's ``PGSMSparseRoPELM``, onto :class:`PGSMForCausalLM`; and how
PGSM leaves slmlab (:data:`EXPORT`): transformers and llama.cpp implement no PGSM, so ``--to hf``
writes remote code (the model's own source beside the weights) and there is no ``--to gguf``."""

from __future__ import annotations

import torch

from ..export_info import ExportInfo
from .configuration_pgsm import PGSMConfig


def convert_seed_state_dict(state_dict: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """Map a state_dict of the seed's ``PGSMSparseRoPELM`` onto :class:`PGSMForCausalLM` names.

    The seed keeps its modules at the top level; ours nest them under ``model.`` with the same
    names. ``lm_head.weight`` keeps its name. Load the result into a model whose config has
    ``rope_layout="seed"`` (see :func:`config_from_seed`) to reproduce the seed's logits.
    """
    out = {}
    for name, tensor in state_dict.items():
        if name.startswith("retriever.rope."):
            continue  # the seed's non-persistent RoPE tables, should they have been saved
        out[name if name == "lm_head.weight" else "model." + name] = tensor
    return out


def config_from_seed(seed_config: dict, **overrides) -> PGSMConfig:
    """A :class:`PGSMConfig` from the seed config's ``to_dict()``, with the seed's RoPE layout."""
    return PGSMConfig(**{**seed_config, "rope_layout": "seed", **overrides})


EXPORT = ExportInfo(
    display_name="PGSM",
    hf_reason="transformers has no attention-free causal-conv backbone with sparse RoPE retrieval (PGSM)",
)
