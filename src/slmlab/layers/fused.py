"""Fused projections that keep the state_dict layout.

Several ``nn.Linear`` layers reading the same input (``w1``/``w3`` of SwiGLU, ``q/k/v`` of
attention) run as one GEMM over their concatenated weights: one larger matrix product instead of
several small ones, and one dispatch instead of several per decode step. The parameters stay
separate, so checkpoints keep transformers' names and shapes.
"""

from __future__ import annotations

import torch


class ConcatenatedWeights:
    """The row-wise concatenation ``[W_1; W_2; ...]`` of some weights, rebuilt only when needed.

    With autograd active (training), the concatenation is rebuilt on every call so gradients
    flow to each weight; the copy is the size of the weights, small next to the activations of a
    training batch. Without autograd (``no_grad``/``inference_mode``: evaluation, decoding) it is
    cached and rebuilt only when a weight changes: the cache key holds every weight's version
    counter (bumped by in-place updates: optimiser steps, ``load_state_dict``), storage pointer,
    dtype and device. The cache is a plain attribute, not a buffer: it is never saved.
    """

    def __init__(self) -> None:
        self._key: tuple | None = None
        self._value: torch.Tensor | None = None

    def __call__(self, *weights: torch.Tensor) -> torch.Tensor:
        if torch.is_grad_enabled() and any(w.requires_grad for w in weights):
            return torch.cat(weights)
        key = tuple((w._version, w.data_ptr(), w.dtype, w.device) for w in weights)
        if key != self._key:
            self._value = torch.cat([w.detach() for w in weights])
            self._key = key
        return self._value

    def __deepcopy__(self, memo) -> "ConcatenatedWeights":
        return ConcatenatedWeights()  # a copy rebuilds its own cache from its own weights

    def __getstate__(self) -> dict:
        return {"_key": None, "_value": None}
