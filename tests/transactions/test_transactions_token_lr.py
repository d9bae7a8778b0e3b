"""``token_lr``, the per-row floor: its C is chosen on validation, and the grid grows past its top while
the top wins, so the floor is not held down by the grid's edge."""

from __future__ import annotations

from types import SimpleNamespace

import numpy as np
import pytest

pytest.importorskip("sklearn")
from sklearn.metrics import average_precision_score  # noqa: E402

from slmlab.transactions.evaluation.baseline import token_lr_scores  # noqa: E402


def rare_signal_bank(n: int = 40_000, seed: int = 0):
    """One token feature: value 0 is common with a 5% fraud rate, values 1-3 are rare (0.3% of rows each)
    with 80%; the rest are clean. Strong L2 shrinks the rare values' weights below value 0's, so a small
    C ranks the rare, nearly-always-fraud values under the common one: larger C wins on validation."""
    rng = np.random.default_rng(seed)
    value = rng.choice(12, size=n, p=[0.4, 0.003, 0.003, 0.003, *[0.591 / 8] * 8])
    rate = np.where(value == 0, 0.05, np.where(value <= 3, 0.8, 0.001))
    y = (rng.random(n) < rate).astype(int)
    ids = np.stack([value, np.zeros(n, int)], 1)
    bank = SimpleNamespace(ids=ids, fitted=SimpleNamespace(schema=SimpleNamespace(score_index=0, names=["v", "pad"])))
    train, val = np.arange(n // 2), np.arange(n // 2, n)

    def split(_):
        return train, y[train], val, y[val]

    return bank, split, y, val


def test_the_grid_grows_while_its_top_wins_and_the_chosen_c_is_the_validation_best():
    bank, split, y, val = rare_signal_bank()
    scores, info = token_lr_scores(bank, split, grid=(1e-3,), c_max=10.0)
    by_c = {float(c): ap for c, ap in info["val_pr_auc_by_C"].items()}
    assert len(by_c) > 1 and min(by_c) == 1e-3  # it grew past the one-C grid
    assert info["C"] == max(by_c, key=by_c.get) and info["C"] > 1e-3
    assert by_c[info["C"]] > by_c[1e-3] + 0.05  # the edge held the floor down
    assert info["C"] < max(by_c) or info["C_at_grid_edge"]  # it stopped because a larger C lost (or at c_max)
    assert average_precision_score(y[val], scores[val]) == pytest.approx(by_c[info["C"]], abs=1e-12)
    assert all(info["converged_by_C"].values())


def test_c_max_bounds_the_growth_and_says_so():
    bank, split, _, _ = rare_signal_bank()
    _, info = token_lr_scores(bank, split, grid=(1e-4,), c_max=1e-4)
    assert list(info["val_pr_auc_by_C"]) == ["0.0001"] and info["C_at_grid_edge"] is True
