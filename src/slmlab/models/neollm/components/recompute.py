"""Per-call state of a checkpointed region (``docs/neollm-attention.md#affine-scaled-softmax``).

Non-reentrant ``torch.utils.checkpoint`` runs a layer's forward twice: once in the forward pass and
again in backward, to rebuild the activations. A module with a side effect in training (affine
attention's ``alpha_ma`` EMA) must apply it once and must see, in the recomputation, the state the
first pass saw. :func:`checkpoint_contexts` is the ``context_fn`` NeoLLM hands the checkpoint: each
checkpointed call gets one :class:`CheckpointRun`, active (per thread) while its forward runs and
again while it is recomputed. A module calls :func:`current_run` and, inside a run, keeps what its
first pass used with :meth:`CheckpointRun.keep` and gets it back in the recomputation, where
:attr:`CheckpointRun.recomputing` is True and it skips the side effect.
"""

from __future__ import annotations

import contextlib
import threading
from collections.abc import Callable, Iterator

import torch

_local = threading.local()


class CheckpointRun:
    """One checkpointed call: the values its modules kept in the first pass, in call order."""

    def __init__(self) -> None:
        self.recomputing = False
        self._kept: dict[int, list[torch.Tensor]] = {}
        self._cursor: dict[int, int] = {}

    def keep(self, module: torch.nn.Module, value: torch.Tensor) -> torch.Tensor:
        """First pass: store ``value`` for ``module`` and return it. Recomputation: return what the
        first pass stored at the same call (``value`` is ignored)."""
        key = id(module)
        if not self.recomputing:
            self._kept.setdefault(key, []).append(value)
            return value
        i = self._cursor.get(key, 0)
        self._cursor[key] = i + 1
        return self._kept[key][i]

    @contextlib.contextmanager
    def active(self, recomputing: bool) -> Iterator[None]:
        stack = _stack()
        self.recomputing = recomputing
        self._cursor = {}  # a second backward (retain_graph) recomputes from the start again
        stack.append(self)
        try:
            yield
        finally:
            stack.pop()


def _stack() -> list[CheckpointRun]:
    if not hasattr(_local, "stack"):
        _local.stack = []
    return _local.stack


def current_run() -> CheckpointRun | None:
    """The innermost checkpointed call running in this thread, or None outside any."""
    stack = _stack()
    return stack[-1] if stack else None


def checkpoint_contexts(inner: Callable | None = None):
    """A ``context_fn`` for non-reentrant ``torch.utils.checkpoint``: ``(forward, recompute)``
    contexts sharing one :class:`CheckpointRun`, composed with the user's ``inner`` context_fn."""

    def context_fn():
        run = CheckpointRun()
        fwd, rec = run.active(False), run.active(True)
        if inner is None:
            return fwd, rec
        inner_fwd, inner_rec = inner()
        return _both(fwd, inner_fwd), _both(rec, inner_rec)

    return context_fn


@contextlib.contextmanager
def _both(a, b) -> Iterator[None]:
    with a, b:
        yield


__all__ = ["CheckpointRun", "checkpoint_contexts", "current_run"]
