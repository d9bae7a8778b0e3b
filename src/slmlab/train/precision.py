"""The one autocast choice, shared by the trainer and the evaluator (``slmlab eval``).

``precision``: ``auto`` = bf16 autocast on CUDA, fp32 elsewhere; ``bf16`` = bf16 autocast on any
device (the weights stay fp32: autocast, not a cast); ``fp32`` = no autocast.
"""

from __future__ import annotations

from collections.abc import Callable
from contextlib import AbstractContextManager

import torch

PRECISIONS = ("auto", "fp32", "bf16")


def uses_bf16(device: torch.device | str, precision: str = "auto") -> bool:
    """Whether ``precision`` on ``device`` means bf16 autocast."""
    if precision not in PRECISIONS:
        raise ValueError(f"precision must be one of {PRECISIONS}, got {precision!r}")
    return precision == "bf16" or (precision == "auto" and torch.device(device).type == "cuda")


def autocast_factory(device: torch.device | str, precision: str = "auto") -> Callable[[], AbstractContextManager] | None:
    """A zero-argument factory of the autocast context for ``device``, or None for fp32.

    The factory (not a context) is what :func:`slmlab.evaluate.evaluate_batches` and the trainer's
    forward take: a fresh context per forward.
    """
    if not uses_bf16(device, precision):
        return None
    device_type = torch.device(device).type
    return lambda: torch.autocast(device_type, dtype=torch.bfloat16)
