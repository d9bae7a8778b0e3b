"""Windows of ``T`` transactions over each customer's history, newest transaction at ``t = T - 1``.

Windows end at the customer's newest transaction and step back by ``stride``; a history shorter than
a window is left-padded with all-PAD rows. With ``stride = T // 2`` every transaction is the newest
``stride`` rows of exactly one window (the oldest window: of its whole tail), which is what the
streaming scorer relies on (``score_from``).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from .schema import PAD


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
    """

    ids: np.ndarray
    txn_mask: np.ndarray
    labels: np.ndarray
    rows: np.ndarray
    score_from: np.ndarray

    def __len__(self) -> int:
        return len(self.ids)


def window_ends(n: int, stride: int) -> list[int]:
    """End indices (exclusive) of one customer's windows, oldest first: ``n, n - stride, ...`` > 0."""
    return list(range(n, 0, -stride))[::-1]


def build_windows(encoded: dict[str, np.ndarray], T: int = 64, stride: int = 32,
                  labels: dict[str, np.ndarray] | None = None, row_offsets: dict[str, int] | None = None,
                  min_end: dict[str, int] | None = None, max_end: dict[str, int] | None = None) -> Windows:
    """Windows over every customer of ``encoded`` (``customer -> int[n, F]``).

    Args:
        T: transactions per window; stride: step between window ends (``<= T``).
        labels: ``customer -> int[n]`` aligned with ``encoded`` (else all -1).
        row_offsets: ``customer -> first row`` in the grouped table (for ``rows``); default consecutive.
        min_end / max_end: per customer, keep only windows whose end lies in ``(min_end, max_end]``
            (e.g. the training period); the oldest kept window then scores from its first real row.
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
        ends = [e for e in range(hi, lo, -stride)][::-1] if hi > lo else []
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
