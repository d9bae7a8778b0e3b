"""Fused projections that keep the state_dict layout.

Several ``nn.Linear`` layers reading the same input (gate/up of SwiGLU, q/k/v of attention) run as
one GEMM over their concatenated weights: one larger matrix product and one dispatch instead of
several per step. The parameters stay separate, so checkpoints keep transformers' names and shapes.

The concatenation is cached only inside :func:`frozen_weights` (the decode loops enter it: weights
cannot change during one generation). Outside it, it is rebuilt on every call. A cache keyed on the
weights' version counters alone would go stale: fused optimisers and ``param.data`` writes update
weights without bumping them (a fused CPU AdamW left in-training evaluations on old weights).

Only plain ``nn.Linear`` layers are fused (:func:`fusable`): a projection wrapped by something with its
own forward (a LoRA adapter from ``peft``, a quantized layer) runs through that forward, each on its own.
"""

from __future__ import annotations

import contextlib
import contextvars
import itertools
from collections.abc import Iterator

import torch
from torch import nn

_EPOCHS = itertools.count(1)
_FROZEN_EPOCH: contextvars.ContextVar[int | None] = contextvars.ContextVar("slmlab_frozen_weights", default=None)


@contextlib.contextmanager
def frozen_weights() -> Iterator[None]:
    """Promise that no weight changes inside the block, so concatenated weights may be cached.

    Each entry starts a new epoch: caches built in an earlier block are never reused.
    """
    token = _FROZEN_EPOCH.set(next(_EPOCHS))
    try:
        yield
    finally:
        _FROZEN_EPOCH.reset(token)


def frozen_epoch() -> int | None:
    """The current :func:`frozen_weights` block's number, or ``None`` outside every block.

    Anything cached under the promise is keyed by it, so a later block never reuses it."""
    return _FROZEN_EPOCH.get()


class ConcatenatedWeights:
    """The row-wise concatenation ``[W_1; W_2; ...]`` of some weights.

    Rebuilt on every call (gradients flow to each weight under autograd), except inside
    :func:`frozen_weights` without autograd, where it is built once per block. The cache is a plain
    attribute, never saved.
    """

    def __init__(self) -> None:
        self._key: tuple | None = None
        self._value: torch.Tensor | None = None

    def __call__(self, *weights: torch.Tensor) -> torch.Tensor:
        if torch.compiler.is_compiling():
            # A captured graph concatenates in the graph: no Python-side cache to consult (a
            # ContextVar read is a graph break) and no traced tensor kept past the trace.
            return torch.cat(weights)
        epoch = _FROZEN_EPOCH.get()
        if epoch is None or (torch.is_grad_enabled() and any(w.requires_grad for w in weights)):
            return torch.cat(weights)
        key = (epoch,) + tuple((w.data_ptr(), w.dtype, w.device) for w in weights)
        if key != self._key:
            self._value = torch.cat([w.detach() for w in weights])
            self._key = key
        return self._value

    def __deepcopy__(self, memo) -> ConcatenatedWeights:
        return ConcatenatedWeights()  # a copy rebuilds its own cache from its own weights

    def __getstate__(self) -> dict:
        return {"_key": None, "_value": None}


def fusable(*layers: nn.Module) -> bool:
    """Whether ``layers`` are all plain ``nn.Linear`` (exact type), so their concatenated weights compute
    what their forwards compute; a wrapper (``peft``'s LoRA layer, a quantized or multiplied linear)
    must run its own forward instead."""
    return all(type(layer) is nn.Linear for layer in layers)


def project_each(x: torch.Tensor, *layers: nn.Module) -> torch.Tensor:
    """``[layer_1(x) | layer_2(x) | ...]`` along the last dimension, each through its own forward (the
    unfused path of :func:`fusable`)."""
    return torch.cat([layer(x) for layer in layers], dim=-1)
