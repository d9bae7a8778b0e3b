"""Evaluation: loss / perplexity / bits per byte and task accuracy (``lm``), the parameter audit (``audit``)."""

from .lm import bits_per_byte, evaluate_batches, evaluate_source

__all__ = ["bits_per_byte", "evaluate_batches", "evaluate_source"]
