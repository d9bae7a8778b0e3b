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


def test_end_offsets_shift_the_ends_and_keep_the_newest_window():
    from slmlab.transactions.data.windows import build_windows

    ids = {"a": np.arange(100 * 2).reshape(100, 2) % 7 + 2, "b": np.arange(30 * 2).reshape(30, 2) % 5 + 2}
    plain = build_windows(ids, T=16, stride=8)
    same = build_windows(ids, T=16, stride=8, end_offsets={"a": 0, "b": 0})
    np.testing.assert_array_equal(plain.rows, same.rows)
    w = build_windows(ids, T=16, stride=8, end_offsets={"a": 3})
    ends_a = sorted(int(r[-1]) + 1 for r in w.rows if r[-1] < 100)
    assert ends_a[-2:] == [97, 100]
    assert ends_a[:-1] == list(range(97 % 8 or 8, 98, 8))  # 1, 9, ..., 97: every 8 back from 100 - 3
    newest = set()
    for r, s in zip(w.rows, w.score_from):
        newest.update(int(x) for x in r[s:] if x >= 0)
    assert newest >= set(range(100))  # every row of `a` is still scored by some window
    ends_b = sorted(int(r[-1]) + 1 - 100 for r in w.rows if r[-1] >= 100)
    assert ends_b == [6, 14, 22, 30]  # `b` without an offset: as before


def test_pretraining_windows_jitter_by_customer_and_seed(bank):
    a = bank.windows(16, 8, "train", jitter_seed=0)
    b = bank.windows(16, 8, "train", jitter_seed=0)
    np.testing.assert_array_equal(a.rows, b.rows)
    plain = bank.windows(16, 8, "train")
    assert len(a) >= len(plain) and not np.array_equal(a.rows[:len(plain)], plain.rows)
    cust = bank.df["customer_id"].astype(str).to_numpy()
    last = {}
    for r in plain.rows[:, -1]:
        last[cust[r]] = max(last.get(cust[r], -1), int(r))
    for r in a.rows[:, -1]:  # the newest window of each customer still ends at its last training row
        assert r <= last[cust[r]]
    assert {cust[r] for r in a.rows[:, -1] if r == last[cust[r]]} == set(last)
    # the second-newest window ends `offset` rows before the last one (8 = a stride when the offset is 0),
    # and the offsets differ across customers
    shift = []
    for c, hi in last.items():
        ends = sorted(int(r) for r in a.rows[:, -1] if cust[r] == c and r < hi)
        if ends:
            shift.append(hi - ends[-1])
    assert all(1 <= s <= 8 for s in shift) and len(set(shift)) > 3


# -- validation counts the validation period only, each row once --------------------------------------------
def test_validation_labels_are_the_validation_rows_each_once(bank):
    """A validation window holds earlier rows as context (most of them from the training period, whose
    labels fine-tuning reads); the fraud head's validation and probe count each row of their period once
    and no earlier row."""
    from slmlab.transactions.data.windows import WindowOptions
    from slmlab.transactions.heads.fraud import training_windows

    windows, _ = training_windows(bank, 16, WindowOptions(), {})
    y_val = bank.labels(bank.cuts["test_start"])
    in_val = bank.period_mask(bank.cuts["val_start"], bank.cuts["val_end"])
    w = windows["validation"]
    counted = w.rows[w.txn_mask & (w.labels >= 0)]
    expected = np.flatnonzero(in_val & (y_val >= 0))
    np.testing.assert_array_equal(np.sort(counted), expected)  # every labelled validation row, once, nothing else
    raw = bank.windows(16, 8, "validation", labels=y_val)
    assert (raw.txn_mask & (raw.labels >= 0)).sum() > len(expected)  # what the windows hold besides
    probe = windows["probe"]
    rows = probe.rows[probe.txn_mask & (probe.labels >= 0)]
    assert len(rows) == len(np.unique(rows))  # the training probe: each row once


def test_window_head_validation_label_ignores_a_fraud_before_the_period():
    """The window head's label is "a fraud among the window's rows": in validation, among the rows it
    scores only, so a training-period fraud in a validation window's context does not make it positive."""
    import torch as _torch

    from slmlab.transactions.heads.sequence import window_labels

    ids = {"c": np.full((20, F), 5)}
    labels = {"c": np.zeros(20, np.int8)}
    labels["c"][5] = 1  # a fraud before the period (rows 8..19)
    w = build_windows(ids, T=8, stride=4, labels=labels, min_end={"c": 8})
    assert (w.labels == 1).any()  # the first window holds row 5 as context
    y = window_labels(_torch.from_numpy(w.scored_labels(fill=0).labels.astype(np.int64)), _torch.from_numpy(w.txn_mask))
    assert y.tolist() == [0] * len(w)
    assert np.sort(w.rows[w.scored]).tolist() == list(range(8, 20))  # each period row scored once


def test_pretrain_report_counts_only_the_scored_positions(bank):
    """Positions a window does not score (context) add nothing: windows whose other members score nothing
    report exactly what the one scoring window reports alone."""
    from slmlab.transactions.evaluation.pretrain import pretrain_report, unigram_counts
    from slmlab.transactions.model import TransactionEncoder, TxnEncoderConfig

    torch.manual_seed(0)
    enc = TransactionEncoder(TxnEncoderConfig.from_preset("lfm2_tiny", schema=bank.fitted)).eval()
    counts = unigram_counts(bank.windows(16, 8, "train"), list(enc.config.schema_config.vocab_sizes))
    w = bank.windows(16, 8, "validation").take(np.arange(6))
    silent = np.full(len(w), 16, np.int64)
    silent[0] = w.score_from[0]
    only_first = Windows(w.ids, w.txn_mask, w.labels, w.rows, silent)
    alone = pretrain_report(enc, w.take([0]), counts, batch_size=4)
    together = pretrain_report(enc, only_first, counts, batch_size=4)
    for key in ("loss", *[k for k in alone if k.startswith("ce/")]):
        assert together[key] == pytest.approx(alone[key], rel=1e-5, abs=1e-6), key


def test_forecast_eval_counts_only_the_scored_rows(bank):
    """The forecast head's validation: a window's context rows (before the period) add nothing, as for
    the pretraining report."""
    from slmlab.transactions.heads.forecast import NextTransactionModel, forecast_eval
    from slmlab.transactions.model import TxnEncoderConfig

    torch.manual_seed(0)
    model = NextTransactionModel(TxnEncoderConfig.from_preset("lfm2_tiny", schema=bank.fitted)).eval()
    w = bank.windows(16, 8, "validation").take(np.arange(6))
    silent = np.full(len(w), 16, np.int64)
    silent[0] = w.score_from[0]
    alone = forecast_eval(model, w.take([0]), batch_size=4)
    together = forecast_eval(model, Windows(w.ids, w.txn_mask, w.labels, w.rows, silent), batch_size=4)
    assert together.keys() == alone.keys()
    for key, value in alone.items():
        assert together[key] == pytest.approx(value, rel=1e-5, abs=1e-6), key
