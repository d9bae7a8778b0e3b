"""Confidence intervals over examples, and over seeds and examples: the seeded percentile bootstrap.

Each metric is a function of per-example counts (``correct`` of ``scored`` positions): ``acc`` is
the mean of ``correct/scored`` (Zoology's example accuracy), ``token_acc`` the pooled
``Σcorrect / Σscored``, ``exact`` the fraction of examples with ``correct == scored``. The 95%
interval resamples the examples with replacement ``n_resamples`` times from a fixed seed
(Efron & Tibshirani, "An Introduction to the Bootstrap", 1993), so the same results give the same
interval; its width shrinks as ``1/√n`` in the number of examples.

A claim is made over seeds (three by default): :func:`seed_example_ci` resamples the seeds, then each
drawn seed's test examples (the two-stage bootstrap of hierarchical data, Davison & Hinkley,
"Bootstrap Methods and their Application", 1997, section 3.8), so its interval holds both the
training's seed-to-seed variation and each test set's sampling noise. A result line keeps its
examples as :func:`example_counts` (``[[correct, scored, count], ...]``), which is all either
bootstrap needs.
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


def seed_summary(values: list[float]) -> dict:
    """Mean, min, max and the per-seed values (in the order given) over seeds (every claim: 3 seeds)."""
    arr = np.asarray(values, dtype=np.float64)
    return {"mean": float(arr.mean()), "min": float(arr.min()), "max": float(arr.max()), "n": int(arr.size),
            "values": [float(v) for v in arr]}


def example_counts(correct: np.ndarray, scored: np.ndarray) -> list[list[int]]:
    """The test examples as ``[[correct, scored, count], ...]`` (sorted): a few numbers per result line that
    keep every per-example metric and either bootstrap exact."""
    pairs = np.stack([np.asarray(correct, dtype=np.int64), np.asarray(scored, dtype=np.int64)], axis=1)
    unique, count = np.unique(pairs, axis=0, return_counts=True)
    return [[int(c), int(s), int(n)] for (c, s), n in zip(unique, count)]


def seed_example_draws(per_seed: list, values: list[float] | None = None, n_resamples: int = N_RESAMPLES,
                       seed: int = 0) -> np.ndarray:
    """``n_resamples`` bootstrap draws of the seeds' mean accuracy: resample the seeds, then, within each drawn
    seed, its test examples (the draws :func:`seed_example_ci` takes its percentiles of).

    Args:
        per_seed: one entry per seed: its :func:`example_counts`, or None where a seed has no examples
            (text data; old result lines), which then counts with its fixed ``values[i]``.
        values: the per-seed values for the None entries.
        n_resamples / seed: as :func:`bootstrap_ci`.
    Returns:
        float ``[n_resamples]``.
    """
    rng = np.random.default_rng(seed)
    k = len(per_seed)
    if not k:
        raise ValueError("need at least one seed")
    # draws[i][j]: seed i's accuracy in n_resamples example resamples, for the j-th seed slot of a resample
    draws = np.empty((k, k, n_resamples))
    for i, counts in enumerate(per_seed):
        if counts is None:
            if values is None or values[i] is None:
                raise ValueError(f"seed {i} has neither example counts nor a value")
            draws[i] = values[i]
            continue
        table = np.asarray(counts, dtype=np.float64).reshape(-1, 3)
        n = int(table[:, 2].sum())
        acc = table[:, 0] / table[:, 1]
        picked = rng.multinomial(n, table[:, 2] / n, size=(k, n_resamples))  # [slot, resample, category]
        draws[i] = picked @ acc / n
    which = rng.integers(0, k, size=(n_resamples, k))  # the seeds each resample draws
    return draws[which, np.arange(k)[None, :], np.arange(n_resamples)[:, None]].mean(axis=1)


def seed_example_ci(per_seed: list, values: list[float] | None = None, n_resamples: int = N_RESAMPLES,
                    seed: int = 0, level: float = LEVEL) -> list[float]:
    """Percentile interval ``[low, high]`` of the seeds' mean accuracy, resampling seeds and then, within
    each drawn seed, its test examples (:func:`seed_example_draws`; arguments as there, ``level`` as
    :func:`bootstrap_ci`)."""
    means = seed_example_draws(per_seed, values, n_resamples, seed)
    tail = (1.0 - level) / 2 * 100
    return [float(np.percentile(means, tail)), float(np.percentile(means, 100 - tail))]


def contrast_ci(arms: list[list], weights: list[float], n_resamples: int = N_RESAMPLES,
                level: float = LEVEL) -> list[float]:
    """Percentile interval of ``Σ weights[i] · mean(arm i)``, each arm (a list of per-seed
    :func:`example_counts`, independent runs) resampled on its own stream (seed ``i``) by
    :func:`seed_example_draws`. ``[[b], [a]]`` with weights ``[1, -1]`` is the interval of ``b − a``; four arms
    with ``[1, -1, -1, 1]`` that of a difference of differences (does a gain grow?)."""
    if len(arms) != len(weights) or not arms:
        raise ValueError("need one weight per arm and at least one arm")
    total = sum(w * seed_example_draws(arm, None, n_resamples, seed=i) for i, (arm, w) in enumerate(zip(arms, weights)))
    tail = (1.0 - level) / 2 * 100
    return [float(np.percentile(total, tail)), float(np.percentile(total, 100 - tail))]
