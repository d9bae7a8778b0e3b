"""Evaluation: loss / perplexity / bits per byte and task accuracy (``lm``),
lm-evaluation-harness tasks (``harness``: the LM adapter, ``tasks``: the runner; both import lm-eval,
so neither is imported here)."""

from .lm import bits_per_byte, evaluate_batches, evaluate_source

__all__ = ["bits_per_byte", "evaluate_batches", "evaluate_source"]
