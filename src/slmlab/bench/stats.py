"""Confidence intervals over examples: the seeded percentile bootstrap.

Each metric is a function of per-example counts (``correct`` of ``scored`` positions): ``acc`` is
the mean of ``correct/scored`` (Zoology's example accuracy), ``token_acc`` the pooled
``Σcorrect / Σscored``, ``exact`` the fraction of examples with ``correct == scored``. The 95%
interval resamples the examples with replacement ``n_resamples`` times from a fixed seed
(Efron & Tibshirani, "An Introduction to the Bootstrap", 1993), so the same results give the same
interval; its width shrinks as ``1/√n`` in the number of examples.
"""

from __future__ import annotations

import numpy as np

N_RESAMPLES = 1000
LEVEL = 0.95


def metrics_from_counts(correct: np.ndarray, scored: np.ndarray) -> dict[str, float]:
    """``acc``, ``token_acc`` and ``exact`` of per-example counts (1-D arrays of equal length)."""
    correct, scored = np.asarray(correct, dtype=np.float64), np.asarray(scored, dtype=np.float64)
    if correct.shape != scored.shape or correct.ndim != 1 or not correct.size or (scored <= 0).any():
        raise ValueError("need equal-length 1-D per-example counts with at least one scored position each")
    return {
        "acc": float(np.mean(correct / scored)),
        "token_acc": float(correct.sum() / scored.sum()),
        "exact": float(np.mean(correct == scored)),
    }


def bootstrap_ci(
    correct: np.ndarray, scored: np.ndarray, n_resamples: int = N_RESAMPLES, seed: int = 0, level: float = LEVEL
) -> dict[str, list[float]]:
    """Percentile intervals ``{metric: [low, high]}`` for :func:`metrics_from_counts`.

    Args:
        correct, scored: per-example counts ``[n]``.
        n_resamples: bootstrap resamples (1,000 by default).
        seed: the resampling stream (``np.random.default_rng(seed)``).
        level: coverage (0.95).
    """
    correct, scored = np.asarray(correct, dtype=np.float64), np.asarray(scored, dtype=np.float64)
    metrics_from_counts(correct, scored)  # validates
    n = correct.size
    idx = np.random.default_rng(seed).integers(0, n, size=(n_resamples, n))
    c, s = correct[idx], scored[idx]
    samples = {
        "acc": (c / s).mean(axis=1),
        "token_acc": c.sum(axis=1) / s.sum(axis=1),
        "exact": (c == s).mean(axis=1),
    }
    tail = (1.0 - level) / 2 * 100
    return {k: [float(np.percentile(v, tail)), float(np.percentile(v, 100 - tail))] for k, v in samples.items()}


def seed_summary(values: list[float]) -> dict[str, float]:
    """Mean, min and max over seeds (the form every claim takes: 3 seeds)."""
    arr = np.asarray(values, dtype=np.float64)
    return {"mean": float(arr.mean()), "min": float(arr.min()), "max": float(arr.max()), "n": int(arr.size)}
