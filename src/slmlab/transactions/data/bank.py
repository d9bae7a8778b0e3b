"""A bank: its tables on disk (:func:`export`, :func:`load_bank`) and the encoded :class:`Bank` the
models read, with the temporal split and its label delay (:func:`prepare_bank`).

Split (docs/transactions.md, "Evaluation protocol"): on the data's day range ``[0, N)`` train is
``[0, 120/180 N)``, validation ``[127/180 N, 150/180 N)``, test ``[157/180 N, N)`` (for 180 days:
days 0-119, 127-149, 157-179; the gaps stand for label latency). Model inputs may use every earlier
transaction; a fraud label is used only once ``label_available_at`` is before the cut-off of the
split that uses it (train: the end of train; validation: the start of test).
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from ...outputs import dumps_finite
from .._deps import pd
from .schema import FittedSchema, SchemaConfig, haversine_km, home_locations
from .synth import PATTERNS, SynthConfig, SynthData
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
                include_holdout: bool = False, jitter_seed: int | None = None) -> Windows:
        """Windows whose newest transaction lies in ``split`` (``train``, ``validation``, ``test``).

        ``jitter_seed``: each customer's window ends step back from the split's end less a seeded random
        offset in ``[0, stride)`` (:func:`~.windows.build_windows` ``end_offsets``), so that a window
        position does not stand for the same calendar days for every customer."""
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
        offsets = None
        if jitter_seed is not None:
            draws = np.random.default_rng(jitter_seed).integers(0, stride, len(enc))
            offsets = dict(zip(enc, draws.tolist()))
        return build_windows(enc, T, stride, labels=lab, row_offsets=starts, min_end=lo, max_end=hi,
                             end_offsets=offsets)


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


def labelled_split(bank: Bank) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """``(fit_rows, y_fit, select_rows, y_select)``: training-period rows (held-out customers excluded)
    with labels known by the end of train, and validation rows with labels known by the start of test."""
    train = bank.period_mask(None, bank.cuts["train_end"])
    if bank.holdout:
        train &= ~bank.df["customer_id"].isin(bank.holdout).to_numpy()
    y_tr = bank.labels(bank.cuts["train_end"])
    y_va = bank.labels(bank.cuts["test_start"])
    val = bank.period_mask(bank.cuts["val_start"], bank.cuts["val_end"])
    tr_rows = np.flatnonzero(train & (y_tr >= 0))
    va_rows = np.flatnonzero(val & (y_va >= 0))
    return tr_rows, y_tr[tr_rows], va_rows, y_va[va_rows]


def derive_distance(bank: Bank) -> np.ndarray:
    """km between merchant and customer home per row (NaN when card-not-present or unknown)."""
    df = bank.df
    if not {"merchant_lat", "merchant_lon"} <= set(df.columns):
        return np.full(len(df), np.nan)
    home = home_locations(df, bank.customers).reindex(df["customer_id"])
    return haversine_km(df["merchant_lat"].to_numpy(float), df["merchant_lon"].to_numpy(float),
                         home["home_lat"].to_numpy(float), home["home_lon"].to_numpy(float))

def label_customers(customers, fraction: float, seed: int = 0) -> set[str]:
    """A seeded random ``max(1, round(fraction * n))`` of the ``n`` distinct ``customers`` (drawn from
    their sorted list, so the choice depends only on the set, the fraction and the seed)."""
    if not 0 < fraction <= 1:
        raise ValueError(f"label fraction must be in (0, 1], got {fraction!r}; pass e.g. 0.1 for 10% of the"
                         " training customers")
    uniq = np.array(sorted({str(c) for c in customers}))
    k = max(1, round(fraction * len(uniq))) if len(uniq) else 0
    return set(uniq[np.random.default_rng(seed).choice(len(uniq), k, replace=False)])


def windows_of_customers(windows: Windows, bank: Bank, keep: set[str]) -> Windows:
    """The windows whose customer (the one of its newest row) is in ``keep``."""
    cust = bank.df["customer_id"].astype(str).to_numpy()[windows.rows[:, -1]]
    return windows.take(np.flatnonzero(np.isin(cust, list(keep))))


def parse_customer_slice(text: str) -> slice:
    """``START:STOP`` (either may be empty, non-negative integers) as a :class:`slice` of the sorted
    customer ids; e.g. ``:6500`` the first 6,500 customers, ``6500:`` the rest."""
    start, sep, stop = str(text).partition(":")
    try:
        if not sep:
            raise ValueError
        bounds = [int(v) if v.strip() else None for v in (start, stop)]
    except ValueError:
        raise ValueError(f"customers must be START:STOP over the sorted customer ids (e.g. :6500 or 6500:),"
                         f" got {text!r}") from None
    if any(v is not None and v < 0 for v in bounds):
        raise ValueError(f"customers START:STOP takes non-negative positions, got {text!r}")
    return slice(*bounds)


def subset_customers(data: SynthData, customers: slice) -> SynthData:
    """The bank of the customers at positions ``customers`` of the sorted customer ids: their
    transactions, profiles and fraud cases, every merchant kept. Raises ``ValueError`` when the slice
    selects no customer."""
    ids = np.array(sorted(data.transactions["customer_id"].astype(str).unique()))
    keep = set(ids[customers].tolist())
    if not keep:
        raise ValueError(f"customers {customers.start or ''}:{customers.stop or ''} selects none of the bank's"
                         f" {len(ids):,} customers; choose positions below {len(ids):,}")

    def rows(df: pd.DataFrame | None) -> pd.DataFrame | None:
        if df is None or "customer_id" not in df:
            return df
        return df[df["customer_id"].astype(str).isin(keep).to_numpy()].reset_index(drop=True)

    return SynthData(rows(data.transactions), rows(data.customers), data.merchants, rows(data.fraud_cases))


# -- export and load ---------------------------------------------------------------------------------
LABEL_COLS = ("is_fraud", "fraud_type", "fraud_case_id", "label_available_at")


def _csv(df: pd.DataFrame, path: Path) -> None:
    out = df.copy()
    for col in out.columns:
        if isinstance(out[col].dtype, pd.DatetimeTZDtype):
            out[col] = out[col].dt.strftime("%Y-%m-%dT%H:%M:%SZ")
    if "amount" in out:
        out["amount"] = out["amount"].map(lambda v: f"{v:.2f}")
    out.to_csv(path, index=False, lineterminator="\n")


def export(data: SynthData, out: str | Path, fmt: str = "parquet", labels_separate: bool = False,
           cfg: SynthConfig | None = None) -> dict:
    """Write the bank (``transactions``, ``customers``, ``merchants``, ``fraud_cases``, optional
    ``labels.csv``) and ``manifest.json`` (config, row counts, fraud rate per pattern, SHA-256s)."""
    if fmt not in ("parquet", "csv"):
        raise ValueError(f"format must be 'parquet' or 'csv', got {fmt!r}")
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    tables = {"transactions": data.transactions, "customers": data.customers, "merchants": data.merchants,
              "fraud_cases": data.fraud_cases}
    if labels_separate:
        tables["transactions"] = data.transactions.drop(columns=list(LABEL_COLS))
    files = {}
    for name, df in tables.items():
        path = out / f"{name}.{fmt}"
        if fmt == "csv":
            _csv(df, path)
        else:
            df.to_parquet(path, index=False)
        files[path.name] = path
    if labels_separate:
        path = out / "labels.csv"
        _csv(data.transactions[["transaction_id", *LABEL_COLS]], path)
        files[path.name] = path
    tx = data.transactions
    from ... import __version__

    manifest = {
        "config": cfg.to_dict() if cfg is not None else None, "package_version": __version__,
        "rows": {k: len(v) for k, v in tables.items()},
        "fraud_rate": float(tx["is_fraud"].mean()) if len(tx) else 0.0,
        "fraud_rate_by_pattern": {p: float((tx["fraud_type"] == p).mean()) for p in PATTERNS},
        "sha256": {name: hashlib.sha256(p.read_bytes()).hexdigest() for name, p in files.items()},
    }
    (out / "manifest.json").write_text(dumps_finite(manifest, indent=1))
    return manifest


def load_bank(folder: str | Path) -> SynthData:
    """Read a folder written by :func:`export` (Parquet or CSV; labels merged back when separate)."""
    folder = Path(folder)

    def read(name: str, required: bool = True):
        for ext in ("parquet", "csv"):
            p = folder / f"{name}.{ext}"
            if p.is_file():
                try:
                    df = pd.read_parquet(p) if ext == "parquet" else pd.read_csv(p, keep_default_na=True, dtype={
                        "transaction_id": str, "customer_id": str, "merchant_id": str, "device_id": str, "card_id": str})
                except pd.errors.EmptyDataError:
                    df = pd.DataFrame()
                if required and df.empty:
                    raise ValueError(f"{p} holds no {name} (0 rows); point --data at a bank with data (write one with"
                                     " `slmlab transactions generate --out DIR`)")
                for col, dt in (("tz_offset_min", np.int16), ("is_fraud", np.int8)):
                    if col in df:
                        df[col] = df[col].astype(dt)
                for col in ("timestamp", "label_available_at", "start", "end", "compromised_from", "compromised_to"):
                    if col in df:
                        df[col] = pd.to_datetime(df[col], utc=True).astype("datetime64[us, UTC]")
                return df
        if required:
            raise FileNotFoundError(f"{folder} has no {name}.parquet or {name}.csv; generate one with"
                                    " `slmlab transactions generate --out DIR`")
        return None

    tx = read("transactions")
    labels = folder / "labels.csv"
    if labels.is_file() and "is_fraud" not in tx:
        lab = pd.read_csv(labels, dtype={"transaction_id": str})
        lab["label_available_at"] = pd.to_datetime(lab["label_available_at"], utc=True).astype("datetime64[us, UTC]")
        lab["is_fraud"] = lab["is_fraud"].astype(np.int8)
        tx = tx.merge(lab, on="transaction_id", how="left")
    return SynthData(tx, read("customers", False), read("merchants", False), read("fraud_cases", False))
