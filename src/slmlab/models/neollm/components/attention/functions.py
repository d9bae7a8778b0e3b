"""Attention functions: the score -> probability -> value computation, one entry per variant.

:class:`~.core.AttentionCore` does the bookkeeping (cache append, window, masks, the blocked local
path) and then calls one function chosen once at construction, the way transformers selects an
attention interface. Every entry takes the same arguments, so a softmax variant (LUCID
preconditioning, affine-scaled softmax, a key-bias prior; ``docs/neollm-attention.md#not-built-yet``)
is one new entry in :data:`ATTENTION_FUNCTIONS`, usable unchanged by the masked path (decoding,
chunks after a cache, global layers) and by the blocked local path (fresh sequences on 'L' layers).

Maths of the built entry (``docs/neollm-attention.md#attention-core``): ``o_i = Σ_j p_ij v_j`` with
``p_ij = softmax_j(q_i·k_j / √D)`` over the keys the mask allows, dropout on ``p`` while training.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import torch

from .....layers.attention import sdpa
from .....layers.masks import AttentionBias


@dataclass(frozen=True)
class AttentionCall:
    """The per-call values every attention function receives (built once per core call).

    Args:
        bias: which keys each query may read (boolean mask ``[B | 1, 1, N_q, N_k]``, or
            ``is_causal`` with no mask).
        dropout: dropout probability on the attention probabilities (0 outside training).
        scale: score scale; None means ``1/√D``.
    """

    bias: AttentionBias
    dropout: float = 0.0
    scale: float | None = None


AttentionFunction = Callable[[torch.Tensor, torch.Tensor, torch.Tensor, AttentionCall], torch.Tensor]


def softmax_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, call: AttentionCall) -> torch.Tensor:
    """Scaled dot-product softmax attention through ``F.scaled_dot_product_attention``.

    Args:
        q: ``[B, H, N_q, D]``; k, v: ``[B, H_kv, N_k, D]`` (query head ``h`` reads KV head ``h // G``).
        call: mask, dropout and scale of this call.
    Returns:
        ``[B, H, N_q, D]``.
    """
    return sdpa(q, k, v, call.bias, call.dropout, call.scale)


# Entry name -> function. New softmax variants register here and select themselves in `from_config`.
ATTENTION_FUNCTIONS: dict[str, AttentionFunction] = {"softmax": softmax_attention}


def from_config(config, layer_idx: int) -> AttentionFunction:
    """The attention function of layer ``layer_idx``: plain softmax while no variant flag is built
    (the variant flags are refused at model construction, see ``components/unbuilt.py``)."""
    return ATTENTION_FUNCTIONS["softmax"]


__all__ = ["ATTENTION_FUNCTIONS", "AttentionCall", "AttentionFunction", "from_config", "softmax_attention"]
