"""From a transaction table to training data: the temporal split with label delay, the encoded bank,
and :class:`TransactionWindows`, the ``slmlab.data.DataSource`` the harness's ``Trainer`` reads.

Split (docs/transactions.md, "Evaluation protocol"): on the data's day range ``[0, N)`` train is
``[0, 120/180 N)``, validation ``[127/180 N, 150/180 N)``, test ``[157/180 N, N)`` (for 180 days:
days 0-119, 127-149, 157-179; the gaps stand for label latency). Model inputs may use every earlier
transaction; a fraud label is used only once ``label_available_at`` is before the cut-off of the
split that uses it (train: the end of train; validation: the start of test).
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np
import torch

from ..data.sources import DataSource
from ._deps import pd
from .schema import MASK, PAD, FittedSchema, SchemaConfig, _haversine_km, home_locations
from .windows import Windows, build_windows

SPLIT_DAYS = (120 / 180, 127 / 180, 150 / 180, 157 / 180)


@dataclass
class Bank:
    """An encoded bank: rows grouped by customer in time order.

    Attributes:
        df: the sorted transactions (``row`` = position in ``ids``).
        ids: int16 ``[N, F]``.
        fitted: the schema fitted on training rows.
        cuts: ``train_end``, ``val_start``, ``val_end``, ``test_start``, ``end`` (timestamps).
        customers: profile table (or None).
        holdout: customers kept out of training (``--customer-disjoint``), possibly empty.
    """

    df: pd.DataFrame
    ids: np.ndarray
    fitted: FittedSchema
    cuts: dict
    customers: pd.DataFrame | None = None
    holdout: set = field(default_factory=set)

    @property
    def starts(self) -> dict[str, int]:
        cust = self.df["customer_id"].to_numpy()
        first = np.flatnonzero(np.r_[True, cust[1:] != cust[:-1]])
        return {str(cust[i]): int(i) for i in first}

    def encoded(self) -> dict[str, np.ndarray]:
        starts = self.starts
        ends = list(starts.values())[1:] + [len(self.df)]
        return {c: self.ids[s:e] for (c, s), e in zip(starts.items(), ends)}

    def count_before(self, when) -> dict[str, int]:
        """Per customer, how many of its transactions are strictly before ``when``."""
        before = (self.df["timestamp"] < when).to_numpy()
        counts = pd.Series(before).groupby(self.df["customer_id"].to_numpy(), sort=False).sum()
        return {str(k): int(v) for k, v in counts.items()}

    def labels(self, cutoff) -> np.ndarray:
        """int8 ``[N]``: ``is_fraud`` where known by ``cutoff`` (legit rows always), else -1."""
        if "is_fraud" not in self.df:
            return np.full(len(self.df), -1, np.int8)
        y = self.df["is_fraud"].fillna(0).to_numpy().astype(np.int8)
        if "label_available_at" in self.df and cutoff is not None:
            late = (y == 1) & ~(self.df["label_available_at"] <= cutoff).to_numpy()
            y = np.where(late, -1, y).astype(np.int8)
        return y

    def period_mask(self, start, end) -> np.ndarray:
        ts = self.df["timestamp"]
        m = np.ones(len(ts), bool)
        if start is not None:
            m &= (ts >= start).to_numpy()
        if end is not None:
            m &= (ts < end).to_numpy()
        return m

    def windows(self, T: int, stride: int, split: str, labels: np.ndarray | None = None,
                include_holdout: bool = False) -> Windows:
        """Windows whose newest transaction lies in ``split`` (``train``, ``validation``, ``test``)."""
        lo_when, hi_when = {"train": (None, self.cuts["train_end"]),
                            "validation": (self.cuts["val_start"], self.cuts["val_end"]),
                            "test": (self.cuts["test_start"], None)}[split]
        enc = self.encoded()
        if split == "train" and not include_holdout and self.holdout:
            enc = {c: v for c, v in enc.items() if c not in self.holdout}
        lo = self.count_before(lo_when) if lo_when is not None else None
        hi = self.count_before(hi_when) if hi_when is not None else None
        starts = self.starts
        lab = None
        if labels is not None:
            lab = {c: labels[starts[c]:starts[c] + len(v)] for c, v in enc.items()}
        return build_windows(enc, T, stride, labels=lab, row_offsets=starts, min_end=lo, max_end=hi)


def split_cuts(df: pd.DataFrame) -> dict:
    """The temporal split's cut timestamps over the data's whole-day range."""
    ts = pd.to_datetime(df["timestamp"], utc=True)
    t0 = ts.min().floor("D")
    n_days = max(1, int(np.ceil((ts.max() - t0) / pd.Timedelta(days=1))))
    day = [t0 + pd.Timedelta(days=round(f * n_days)) for f in SPLIT_DAYS]
    return {"start": t0, "train_end": day[0], "val_start": day[1], "val_end": day[2], "test_start": day[3],
            "end": t0 + pd.Timedelta(days=n_days), "n_days": n_days}


def prepare_bank(df: pd.DataFrame, schema: SchemaConfig | FittedSchema, customers: pd.DataFrame | None = None,
                 customer_disjoint: bool = False, seed: int = 0) -> Bank:
    """Split, fit the schema on training rows (unless already fitted) and encode every row."""
    cuts = split_cuts(df)
    holdout: set = set()
    if customer_disjoint:
        custs = np.array(sorted(df["customer_id"].astype(str).unique()))
        rng = np.random.default_rng(seed)
        holdout = set(custs[rng.random(len(custs)) < 0.2])
    if isinstance(schema, SchemaConfig):
        ts = pd.to_datetime(df["timestamp"], utc=True)
        train_rows = df[(ts < cuts["train_end"]).to_numpy() & ~df["customer_id"].astype(str).isin(holdout).to_numpy()]
        schema = schema.fit(train_rows, customers)
    sorted_df, ids = schema.encode_frame(df, customers)
    sorted_df["row"] = np.arange(len(sorted_df))
    return Bank(sorted_df, ids, schema, cuts, customers, holdout)


class TransactionWindows(DataSource):
    """Windows of a :class:`Bank` as a harness data source.

    Batches: ``input_ids`` int64 ``[B, T, F]``, ``attention_mask`` ``[B, T*F]`` (token level, so the
    harness counts tokens), ``labels``: the ids again (``mode="pretrain"`` and ``"forecast"``),
    ``[B, T]`` fraud labels with -100 on padded / unknown rows (``mode="fraud"``), ``[B]`` window
    labels (``mode="sequence"``, :func:`~slmlab.transactions.sequence.window_labels` with
    ``recent_k``), or, for ``mode="customer"``, pair windows ``[B, 2, T, F]`` (mask ``[B, 2, T*F]``)
    with unused zero labels ``[B]``.

    Args:
        windows: ``split -> Windows`` (``train`` and ``validation``; pair windows for ``customer``).
        mode: ``pretrain``, ``fraud``, ``sequence``, ``forecast`` or ``customer``.
        recent_k: window label of ``sequence``: fraud among the ``recent_k`` newest transactions only.
    """

    is_synthetic = False
    splits = ("train", "validation")

    def __init__(self, windows: dict[str, Windows], mode: str = "pretrain", name: str = "transactions",
                 recent_k: int | None = None) -> None:
        modes = ("pretrain", "fraud", "sequence", "forecast", "customer")
        if mode not in modes:
            raise ValueError(f"mode must be one of {modes}, got {mode!r}")
        for split in self.splits:
            if split not in windows or len(windows[split]) == 0:
                raise ValueError(f"no {split} windows; the bank is too small for its split (generate more days)")
        self.windows, self.mode, self.name, self.recent_k = windows, mode, name, recent_k
        self._labels = getattr(self, f"_labels_{mode}")
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
        out["labels"] = self._labels(ids, mask, torch.from_numpy(w.labels[rows].astype(np.int64)))
        return out

    def _labels_pretrain(self, ids, mask, lab):
        return ids.clone()

    _labels_forecast = _labels_pretrain

    def _labels_fraud(self, ids, mask, lab):
        return torch.where(mask & (lab >= 0), lab, torch.full_like(lab, -100))

    def _labels_sequence(self, ids, mask, lab):
        from .sequence import window_labels

        return window_labels(lab, mask, self.recent_k)

    def _labels_customer(self, ids, mask, lab):
        return torch.zeros(len(ids), dtype=torch.long)


# -- pretraining validation: per-feature CE against two unigram baselines ---------------------------
def _targets(ids: torch.Tensor, txn_mask: torch.Tensor, g: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Targets of head ``g``, their validity and the transaction index each target lies in."""
    T = ids.shape[1]
    if g == 0:
        tgt, valid, t = ids[:, 1:, 0], txn_mask[:, 1:] & txn_mask[:, :-1], torch.arange(1, T)
    else:
        tgt, valid, t = ids[:, :, g], txn_mask, torch.arange(T)
    return tgt, valid & (tgt != PAD) & (tgt != MASK), t


def unigram_counts(windows: Windows, vocab_sizes: list[int]) -> list[np.ndarray]:
    """Training-set counts of every feature's ids (real rows only)."""
    real = windows.ids[windows.txn_mask]
    return [np.bincount(real[:, g], minlength=v).astype(np.float64) for g, v in enumerate(vocab_sizes)]


@torch.no_grad()
def pretrain_report(model, windows: Windows, train_counts: list[np.ndarray], batch_size: int = 64,
                    device: torch.device | str = "cpu") -> dict:
    """Validation CE and accuracy per feature, with (a) the training unigram and (b) the
    customer-history unigram (add-one counts of the feature in the window's earlier rows) as baselines.

    Returns a flat dict: ``loss`` (feature-balanced CE), ``ce/<name>``, ``acc/<name>``,
    ``unigram/<name>``, ``history/<name>``.
    """
    names = model.feature_names
    nf = len(names)
    vs = [len(c) for c in train_counts]
    log_uni = [torch.log(torch.from_numpy((c + 1) / (c.sum() + len(c)))).float() for c in train_counts]
    sums = {k: np.zeros(nf) for k in ("ce", "acc", "uni", "hist", "n")}
    was_training = model.training
    model.eval()
    for s in range(0, len(windows), batch_size):
        ids = torch.from_numpy(windows.ids[s:s + batch_size]).to(device)
        mask = torch.from_numpy(windows.txn_mask[s:s + batch_size]).to(device)
        hidden = model.backbone_forward(ids, mask)
        logits = model.lm_heads.forward_targets(hidden)
        for g in range(nf):
            tgt, valid, t = _targets(ids, mask, g)
            lp = torch.log_softmax(logits[g].float(), -1)
            ce = -lp.gather(-1, tgt.long()[..., None])[..., 0]
            sums["ce"][g] += float(ce[valid].sum())
            sums["acc"][g] += float(((lp.argmax(-1) == tgt) & valid).sum())
            sums["uni"][g] += float(-log_uni[g].to(device)[tgt.long()][valid].sum())
            onehot = torch.nn.functional.one_hot(ids[:, :, g].long(), vs[g]).float() * mask[..., None]
            onehot[..., PAD] = 0
            hist = torch.cumsum(onehot, 1) - onehot  # counts over earlier rows
            hist = hist[:, t]
            p = (hist.gather(-1, tgt.long()[..., None])[..., 0] + 1) / (hist.sum(-1) + vs[g])
            sums["hist"][g] += float(-torch.log(p)[valid].sum())
            sums["n"][g] += float(valid.sum())
    model.train(was_training)
    n = np.maximum(sums["n"], 1)
    out = {"loss": float(np.mean((sums["ce"] / n)[sums["n"] > 0]))}
    for g, name in enumerate(names):
        out[f"ce/{name}"] = float(sums["ce"][g] / n[g])
        out[f"acc/{name}"] = float(sums["acc"][g] / n[g])
        out[f"unigram/{name}"] = float(sums["uni"][g] / n[g])
        out[f"history/{name}"] = float(sums["hist"][g] / n[g])
    return out


def derive_distance(bank: Bank) -> np.ndarray:
    """km between merchant and customer home per row (NaN when card-not-present or unknown)."""
    df = bank.df
    if not {"merchant_lat", "merchant_lon"} <= set(df.columns):
        return np.full(len(df), np.nan)
    home = home_locations(df, bank.customers).reindex(df["customer_id"])
    return _haversine_km(df["merchant_lat"].to_numpy(float), df["merchant_lon"].to_numpy(float),
                         home["home_lat"].to_numpy(float), home["home_lon"].to_numpy(float))
