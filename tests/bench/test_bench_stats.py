"""Bootstrap intervals over examples: seeded, deterministic, containing the estimate, ~1/sqrt(n) wide."""

from __future__ import annotations

import numpy as np
import pytest

from slmlab.bench.stats import bootstrap_ci, metrics_from_counts, seed_summary


def counts(n: int, seed: int = 0):
    rng = np.random.default_rng(seed)
    scored = rng.integers(1, 5, size=n)
    correct = rng.binomial(scored, 0.7)
    return correct, scored


def test_metrics_from_counts_by_hand():
    m = metrics_from_counts(np.array([1, 2, 0]), np.array([1, 4, 2]))
    assert m == pytest.approx({"acc": (1 + 0.5 + 0) / 3, "token_acc": 3 / 7, "exact": 1 / 3})
    with pytest.raises(ValueError, match="at least one scored position"):
        metrics_from_counts(np.array([1]), np.array([0]))


def test_bootstrap_is_seeded_and_contains_the_estimate():
    c, s = counts(400)
    a, b = bootstrap_ci(c, s, seed=3), bootstrap_ci(c, s, seed=3)
    assert a == b and a != bootstrap_ci(c, s, seed=4)
    estimate = metrics_from_counts(c, s)
    for name, (lo, hi) in a.items():
        assert lo <= estimate[name] <= hi and lo < hi


def test_interval_width_shrinks_as_one_over_sqrt_n():
    widths = {}
    for n in (400, 6400):
        c, s = counts(n, seed=1)
        lo, hi = bootstrap_ci(c, s)["acc"]
        widths[n] = hi - lo
    ratio = widths[400] / widths[6400]  # sqrt(16) = 4
    assert 3.2 < ratio < 4.8


def test_seed_summary():
    assert seed_summary([0.5, 1.0, 0.75]) == {"mean": 0.75, "min": 0.5, "max": 1.0, "n": 3, "values": [0.5, 1.0, 0.75]}
