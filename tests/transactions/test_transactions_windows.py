"""``Windows.batches``: the one loop over a stack of windows (evaluation, scoring, embedding)."""

from __future__ import annotations

import numpy as np
import pytest
import torch

pytest.importorskip("pandas")
pytest.importorskip("sklearn")

from slmlab.transactions.data.windows import WindowBatch, Windows, build_windows  # noqa: E402
from slmlab.transactions.evaluation.score import score_windows  # noqa: E402
from slmlab.transactions.heads.fraud import TransactionFraudConfig, TransactionFraudModel, fraud_eval  # noqa: E402

F = 15


def stack(n_customers=5, T=6, stride=3, seed=0) -> Windows:
    """Windows over random histories of different lengths, with labels (some unknown)."""
    rng = np.random.default_rng(seed)
    encoded, labels = {}, {}
    for c in range(n_customers):
        n = int(rng.integers(1, 20))
        encoded[f"c{c}"] = rng.integers(4, 9, (n, F))
        labels[f"c{c}"] = rng.choice([-1, 0, 1], n, p=[0.2, 0.7, 0.1]).astype(np.int8)
    return build_windows(encoded, T, stride, labels=labels)


@pytest.mark.parametrize("batch_size", [1, 4, 7, 1000])
def test_batches_yield_every_window_once_in_order_with_the_right_shapes(batch_size):
    w = stack()
    n, T = len(w), w.ids.shape[1]
    assert n > 7 and n % 4 and n % 7  # a last partial batch for the small sizes
    batches = list(w.batches(batch_size))
    assert len(batches) == w.num_batches(batch_size) == -(-n // batch_size)
    sizes = [len(b) for b in batches]
    assert sizes[:-1] == [batch_size] * (len(batches) - 1) and sizes[-1] == n - batch_size * (len(batches) - 1)
    assert [b.start for b in batches] == list(range(0, n, batch_size))
    for b in batches:
        assert isinstance(b, WindowBatch)
        assert b.ids.shape == (len(b), T, F) and b.ids.dtype == torch.int64 and b.ids.device.type == "cpu"
        assert b.txn_mask.shape == (len(b), T) and b.txn_mask.dtype == torch.bool
        assert b.labels.shape == (len(b), T) and b.labels.dtype == torch.int64
        assert b.rows.shape == (len(b), T) and isinstance(b.rows, np.ndarray)
        want = (np.arange(T)[None] >= b.host.score_from[:, None]) & b.host.txn_mask
        np.testing.assert_array_equal(b.scored, want)
    np.testing.assert_array_equal(torch.cat([b.ids for b in batches]).numpy(), w.ids)
    np.testing.assert_array_equal(torch.cat([b.txn_mask for b in batches]).numpy(), w.txn_mask)
    np.testing.assert_array_equal(torch.cat([b.labels for b in batches]).numpy(), w.labels.astype(np.int64))
    np.testing.assert_array_equal(np.concatenate([b.rows for b in batches]), w.rows)
    np.testing.assert_array_equal(np.concatenate([b.host.score_from for b in batches]), w.score_from)


def test_batches_on_a_device_pair_windows_empty_stacks_and_bad_sizes():
    w = stack()
    device = "cuda" if torch.cuda.is_available() else "meta"
    for b in w.batches(4, device):
        assert b.ids.device.type == b.txn_mask.device.type == b.labels.device.type == device
        assert isinstance(b.rows, np.ndarray)  # host arrays stay on the host
    pairs = w.take(np.arange(6).reshape(3, 2))  # a pair axis, as the customer head's windows
    got = list(pairs.batches(2))
    assert [tuple(b.ids.shape) for b in got] == [(2, 2, 6, F), (1, 2, 6, F)]
    np.testing.assert_array_equal(got[1].ids[0, 1].numpy(), w.ids[5])
    empty = build_windows({}, 6, 3)
    assert len(empty) == 0 and list(empty.batches(4)) == []
    with pytest.raises(ValueError, match="batch_size must be >= 1"):
        next(w.batches(0))


def test_the_loops_built_on_batches_do_not_depend_on_the_batch_size():
    torch.manual_seed(0)
    w = stack(n_customers=4, T=6, stride=3)
    model = TransactionFraudModel(TransactionFraudConfig.from_preset("lfm2_tiny")).eval()
    rows1, s1 = score_windows(model, w, batch_size=1)
    rows5, s5 = score_windows(model, w, batch_size=5)
    np.testing.assert_array_equal(rows1, rows5)
    np.testing.assert_allclose(s1, s5, rtol=1e-5, atol=1e-6)
    assert sorted(rows1.tolist()) == sorted(set(w.rows[w.txn_mask].tolist()))  # each real row scored once
    a, b = fraud_eval(model, w, batch_size=1), fraud_eval(model, w, batch_size=64)
    assert a["loss"] == pytest.approx(b["loss"], rel=1e-5) and a["pr_auc"] == pytest.approx(b["pr_auc"], rel=1e-6)
