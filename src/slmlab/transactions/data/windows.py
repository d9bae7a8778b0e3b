"""Windows of ``T`` transactions over each customer's history, newest transaction at ``t = T - 1``.

Windows end at the customer's newest transaction and step back by ``stride``; a history shorter than
a window is left-padded with all-PAD rows. With ``stride = T // 2`` every transaction is the newest
``stride`` rows of exactly one window (the oldest window: of its whole tail), which is what the
streaming scorer relies on (``score_from``).

:meth:`Windows.batches` is the one loop over a stack of windows in order (evaluation, scoring,
embedding); :class:`TransactionWindows` is the shuffled stream the harness's ``Trainer`` reads, its
labels made by the head being trained (a :data:`LabelFn`); :func:`balance_windows` is the
training-window selection of the fraud heads.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from dataclasses import dataclass

import numpy as np
import torch

from ...data.sources import DataSource
from .schema import PAD

# A head's batch labels from a batch of windows: ``(ids [B, T, F], txn_mask [B, T], row labels [B, T]
# int64, -1 = unknown) -> labels`` (the ``labels`` the model's ``forward`` takes).
LabelFn = Callable[[torch.Tensor, torch.Tensor, torch.Tensor], torch.Tensor]


@dataclass
class WindowBatch:
    """One batch of :meth:`Windows.batches`: windows ``start .. start + len - 1`` of the stack.

    Attributes:
        ids: int64 ``[b, T, F]`` on the batch's device (``[b, 2, T, F]`` for pair windows).
        txn_mask: bool ``[b, T]`` on the device.
        labels: int64 ``[b, T]`` on the device (-1 on padded rows or unknown labels).
        host: the same windows as numpy arrays (views into the stack), for ``rows`` and ``score_from``.
        start: index of the batch's first window in the stack.
    """

    ids: torch.Tensor
    txn_mask: torch.Tensor
    labels: torch.Tensor
    host: Windows
    start: int
    tabular: torch.Tensor | None = None

    def __len__(self) -> int:
        return len(self.ids)

    def inputs(self) -> dict[str, torch.Tensor]:
        """The model's inputs: ``input_ids``, ``attention_mask`` (and ``tabular``, float ``[b, T, K]``,
        when the windows carry row features: the joint-fusion head reads them)."""
        out = {"input_ids": self.ids, "attention_mask": self.txn_mask}
        if self.tabular is not None:
            out["tabular"] = self.tabular
        return out

    @property
    def rows(self) -> np.ndarray:
        """int64 ``[b, T]``: row index into the customer-grouped table (-1 = padding)."""
        return self.host.rows

    @property
    def scored(self) -> np.ndarray:
        """Bool ``[b, T]``: the positions this batch scores in streaming inference (real rows at
        ``t >= score_from``; see :class:`Windows`)."""
        return self.host.scored


@dataclass
class Windows:
    """A stack of windows.

    Attributes:
        ids: int64 ``[B, T, F]`` (padded rows all PAD).
        txn_mask: bool ``[B, T]`` (True = real transaction).
        labels: int8 ``[B, T]`` (-1 on padded rows or when no labels were given).
        rows: int64 ``[B, T]``: the row index into the customer-grouped table (-1 = padding).
        score_from: int64 ``[B]``: positions ``t >= score_from`` are the ones this window scores in
            streaming inference (each transaction exactly once).

        row_features: float32 ``[N_rows, K]`` or None: one row per row of the customer-grouped table
            (what ``rows`` indexes), shared by every window rather than stacked per window; batches
            gather it into ``tabular`` (:func:`gather_rows`).

    Pair windows (two windows per entry, :func:`~slmlab.transactions.heads.customer.window_pairs`)
    carry a pair axis after the first: ``ids [B, 2, T, F]`` and so on.
    """

    ids: np.ndarray
    txn_mask: np.ndarray
    labels: np.ndarray
    rows: np.ndarray
    score_from: np.ndarray
    row_features: np.ndarray | None = None

    PER_WINDOW = ("ids", "txn_mask", "labels", "rows", "score_from")

    def __len__(self) -> int:
        return len(self.ids)

    def take(self, idx: np.ndarray) -> Windows:
        """The windows at ``idx`` (an index array, repeats allowed; or a boolean mask), in that order."""
        return Windows(*(getattr(self, name)[idx] for name in self.PER_WINDOW), row_features=self.row_features)

    @property
    def scored(self) -> np.ndarray:
        """Bool ``[B, T]``: the positions each window scores (real rows at ``t >= score_from``): every row
        of the windows' period exactly once, never a row before it (:func:`build_windows` ``min_end``)."""
        pos = np.arange(self.txn_mask.shape[-1])
        return (pos[None, :] >= self.score_from[:, None]) & self.txn_mask

    def scored_labels(self, fill: int = -1) -> Windows:
        """The same windows with the labels of the real positions they do not score set to ``fill``.

        A validation window reads up to ``T - 1`` earlier rows as context, and on a bank most of them lie
        before the validation period: in the training period, whose labels fine-tuning read. Counting
        them made a fine-tune's validation PR-AUC partly in-sample (on the 2,000-customer `large` subset,
        202 of a validation sample's 330 fraud positions were such rows). With this, each row of the
        windows' period counts once, at the position streaming scoring gives it. ``fill``: -1 (unknown,
        for per-row labels) or 0 (neutral for a window label that is "any fraud among its rows")."""
        labels = np.where(self.scored | ~self.txn_mask, self.labels, np.int8(fill)).astype(np.int8)
        return Windows(self.ids, self.txn_mask, labels, self.rows, self.score_from, row_features=self.row_features)

    def with_row_features(self, table: np.ndarray | None) -> Windows:
        """The same windows carrying ``table`` (``[N_rows, K]``, see the class) as their row features."""
        return Windows(*(getattr(self, name) for name in self.PER_WINDOW), row_features=table)

    def batches(self, batch_size: int, device: torch.device | str = "cpu") -> Iterator[WindowBatch]:
        """Every window exactly once, in order, ``batch_size`` at a time (the last batch may be
        smaller); ``ids``, ``txn_mask`` and ``labels`` as tensors on ``device``."""
        if int(batch_size) < 1:
            raise ValueError(f"batch_size must be >= 1, got {batch_size!r}")
        for s in range(0, len(self), int(batch_size)):
            host = self.take(slice(s, s + int(batch_size)))
            ids = torch.from_numpy(host.ids).to(device)
            mask = torch.from_numpy(host.txn_mask).to(device)
            labels = torch.from_numpy(host.labels.astype(np.int64)).to(device)
            tab = None if self.row_features is None else gather_rows(self.row_features, host.rows).to(device)
            yield WindowBatch(ids, mask, labels, host, s, tab)

    def num_batches(self, batch_size: int) -> int:
        """How many batches :meth:`batches` yields."""
        return -(-len(self) // int(batch_size))


def gather_rows(table: np.ndarray, rows: np.ndarray) -> torch.Tensor:
    """float32 ``[..., K]``: ``table[rows]`` with zeros where ``rows`` is -1 (padding)."""
    out = table[np.maximum(rows, 0)]
    out[rows < 0] = 0.0
    return torch.from_numpy(np.ascontiguousarray(out, dtype=np.float32))


def build_windows(encoded: dict[str, np.ndarray], T: int = 64, stride: int = 32,
                  labels: dict[str, np.ndarray] | None = None, row_offsets: dict[str, int] | None = None,
                  min_end: dict[str, int] | None = None, max_end: dict[str, int] | None = None,
                  end_offsets: dict[str, int] | None = None) -> Windows:
    """Windows over every customer of ``encoded`` (``customer -> int[n, F]``).

    Args:
        T: transactions per window; stride: step between window ends (``<= T``).
        labels: ``customer -> int[n]`` aligned with ``encoded`` (else all -1).
        row_offsets: ``customer -> first row`` in the grouped table (for ``rows``); default consecutive.
        min_end / max_end: per customer, keep only windows whose end lies in ``(min_end, max_end]``
            (e.g. the training period); the oldest kept window then scores from its first row after
            ``min_end`` (from its first real row when there is no ``min_end``): the earlier rows are its
            context only.
        end_offsets: per customer, step the window ends back from ``max_end - offset`` instead of
            ``max_end`` (the window ending at ``max_end`` is kept too, so every row stays the newest of
            one window). Pretraining draws them at random (:meth:`Bank.windows` ``jitter_seed``): when
            every customer's windows end at the same cut, a position in the window stands for nearly
            the same calendar days for every customer, and the encoder learns the calendar from the
            position (measured: day-of-month CE 0.08 on training windows, 5.3 on validation ones).
    """
    if not 0 < stride <= T:
        raise ValueError(f"stride must be in [1, T={T}], got {stride}")
    ids_out, mask_out, lab_out, row_out, score_out = [], [], [], [], []
    offset = 0
    for cust, ids in encoded.items():
        n, F = ids.shape
        start_row = row_offsets[cust] if row_offsets is not None else offset
        offset += n
        lab = labels[cust] if labels is not None else np.full(n, -1, np.int8)
        lo = min_end.get(cust, 0) if min_end else 0
        hi = max_end.get(cust, n) if max_end else n
        off = int(end_offsets.get(cust, 0)) if end_offsets else 0
        ends = [e for e in range(hi - off, lo, -stride)][::-1] if hi > lo else []
        if off and hi > lo and (not ends or ends[-1] != hi):
            ends.append(hi)
        for k, e in enumerate(ends):
            s = max(0, e - T)
            pad = T - (e - s)
            w = np.full((T, F), PAD, np.int64)
            w[pad:] = ids[s:e]
            m = np.zeros(T, bool)
            m[pad:] = True
            lw = np.full(T, -1, np.int8)
            lw[pad:] = lab[s:e]
            r = np.full(T, -1, np.int64)
            r[pad:] = np.arange(start_row + s, start_row + e)
            ids_out.append(w)
            mask_out.append(m)
            lab_out.append(lw)
            row_out.append(r)
            first = k == 0
            prev_end = ends[k - 1] if k else lo
            score_out.append(pad if first and lo == 0 else T - (e - prev_end))
    if not ids_out:
        F = next(iter(encoded.values())).shape[1] if encoded else 0
        return Windows(np.zeros((0, T, F), np.int64), np.zeros((0, T), bool), np.zeros((0, T), np.int8),
                       np.zeros((0, T), np.int64), np.zeros(0, np.int64))
    return Windows(np.stack(ids_out), np.stack(mask_out), np.stack(lab_out), np.stack(row_out),
                   np.asarray(score_out, np.int64))


def fraud_positions(windows: Windows) -> int:
    """How many real positions of ``windows`` carry a fraud label (a row in two windows counts twice)."""
    return int(((windows.labels == 1) & windows.txn_mask).sum())


def sample_windows(windows: Windows, n: int | None, seed: int = 0, min_frauds: int = 0) -> Windows:
    """A seeded sample of ``n`` of ``windows``, in their order (all of them when ``n`` is None or at least
    their number): validation on a large bank reads a fixed sample instead of every window.

    ``min_frauds``: the sample grows, along the same seeded order, until its fraud positions
    (:func:`fraud_positions`) reach it, or it holds every window: the base rate stays the validation
    period's (no fraud window is picked for being one), and a step chosen on it is chosen on at least
    ``min_frauds`` frauds, or on all there are."""
    if n is None or n >= len(windows):
        return windows
    if int(n) < 1:
        raise ValueError(f"the validation sample needs at least 1 window, got {n!r}; leave it out to use every window")
    order = np.random.default_rng(seed).permutation(len(windows))
    size = int(n)
    per = ((windows.labels == 1) & windows.txn_mask).sum(1)[order]
    if min_frauds > 0 and per.sum() > 0:  # windows without fraud labels (other heads): the plain sample
        reached = np.flatnonzero(np.cumsum(per) >= min_frauds)
        size = max(size, int(reached[0]) + 1 if len(reached) else len(windows))
    return windows.take(np.sort(order[:size]))


def balance_windows(windows: Windows, keep_negative: float = 1.0, fraud_share: float = 0.0, seed: int = 0) -> Windows:
    """Training windows rebalanced for a fraud head.

    ``keep_negative`` < 1 keeps that share of the windows without a fraud label; ``fraud_share`` > 0
    then repeats every window holding a fraud label a whole number of times, so that such windows
    make up about that share of the result (fraud windows are a fraction of a percent of the data,
    so without it a batch of 32 holds about one). Ranking metrics are unaffected by either;
    calibrated probabilities would need weights, which are not applied.
    """
    if not 0 < keep_negative <= 1:
        raise ValueError(f"keep_negative must be in (0, 1], got {keep_negative!r}")
    if not 0 <= fraud_share < 1:
        raise ValueError(f"fraud_share must be in [0, 1), got {fraud_share!r}")
    has_fraud = (windows.labels == 1).any(1)
    keep = np.ones(len(windows), bool)
    if keep_negative < 1.0:
        keep = has_fraud | (np.random.default_rng(seed).random(len(windows)) < keep_negative)
    idx = np.flatnonzero(keep)
    pos, neg = idx[has_fraud[idx]], idx[~has_fraud[idx]]
    if fraud_share > 0 and len(pos):
        repeat = max(1, round(fraud_share / (1 - fraud_share) * len(neg) / len(pos)))
        idx = np.sort(np.r_[neg, np.repeat(pos, repeat)])
    return windows.take(idx)


@dataclass(frozen=True)
class WindowOptions:
    """How a head's training windows are selected (the heads that take them: see each
    :class:`~slmlab.transactions.heads.HeadSpec`'s ``data_options``).

    Attributes:
        keep_negative: share of the fraud-free training windows kept (:func:`balance_windows`).
        fraud_share: repeat fraud windows to about this share of the training windows.
        label_fraction: keep the labels of this seeded random share of the training customers.
        seed: the seed of those draws.
    """

    keep_negative: float = 1.0
    fraud_share: float = 0.0
    label_fraction: float = 1.0
    seed: int = 0


def lm_labels(ids: torch.Tensor, txn_mask: torch.Tensor, row_labels: torch.Tensor) -> torch.Tensor:
    """The :data:`LabelFn` of next-token objectives: the ids again (targets come from them)."""
    return ids.clone()


class TransactionWindows(DataSource):
    """Windows as a harness data source: the shuffled training stream and the validation split.

    Batches: ``input_ids`` int64 ``[B, T, F]``, ``attention_mask`` ``[B, T*F]`` (token level, so the
    harness counts tokens) and ``labels`` made by ``labels`` (a :data:`LabelFn`: the head's, e.g.
    ``[B, T]`` fraud labels or ``[B]`` window labels; default :func:`lm_labels`, the ids again for
    pretraining). Pair windows (``ids [N, 2, T, F]``) give ``input_ids [B, 2, T, F]`` and
    ``attention_mask [B, 2, T*F]``.

    Args:
        windows: ``split -> Windows`` (``train`` and ``validation``).
        labels: the batch labels' maker.
        name: the source's name.
    """

    is_synthetic = False
    splits = ("train", "validation")

    def __init__(self, windows: dict[str, Windows], labels: LabelFn = lm_labels, name: str = "transactions") -> None:
        for split in self.splits:
            if split not in windows or len(windows[split]) == 0:
                raise ValueError(f"no {split} windows; the bank is too small for its split (generate more days)")
        self.windows, self.make_labels, self.name = windows, labels, name
        w = windows["train"]
        self.T, self.F = w.ids.shape[-2], w.ids.shape[-1]
        self.seq_len = self.T * self.F
        self.min_vocab_size = int(w.ids.max()) + 1

    def _num_rows(self, split: str, shuffled: bool) -> int:
        return len(self.windows[split])

    def _rows(self, split, epochs, rows, sampler, shuffled) -> dict[str, torch.Tensor]:
        w = self.windows[split]
        ids = torch.from_numpy(w.ids[rows])
        mask = torch.from_numpy(w.txn_mask[rows])
        out = {"input_ids": ids, "attention_mask": mask.repeat_interleave(self.F, dim=-1).long()}
        out["labels"] = self.make_labels(ids, mask, torch.from_numpy(w.labels[rows].astype(np.int64)))
        if w.row_features is not None:
            out["tabular"] = gather_rows(w.row_features, w.rows[rows])
        return out
