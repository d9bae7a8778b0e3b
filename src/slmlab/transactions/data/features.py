"""Per-transaction tabular features of a bank: raw fields and per-customer rolling features, every
rolling feature computed from strictly earlier transactions of the same customer (the current row never
enters its own window), and leak-free merchant risk.

Rolling windows are computed exactly with one ``searchsorted`` over ``(customer, time)`` keys and
prefix sums (no Python loop over rows): for row ``i`` the window ``[t_i - w, t_i)`` of its customer
holds rows ``lo..i-1``. Merchant risk (after the Fraud Detection Handbook of Le Borgne et al.) is the
merchant's fraud count and fraud rate over 1 / 7 / 30 days, ending ``delay`` (7) days before the
transaction and counting only frauds whose label was available by then.

The gradient-boosting baselines (:mod:`slmlab.transactions.evaluation.baseline`) read :func:`build_features`;
the joint-fusion fraud head reads its numeric columns through :func:`tabular_table`.
"""

from __future__ import annotations

import numpy as np

from .._deps import pd
from .schema import haversine_km

WINDOWS_S = {"1h": 3600, "24h": 86400, "7d": 7 * 86400, "30d": 30 * 86400}
RISK_WINDOWS_S = {"1d": 86400, "7d": 7 * 86400, "30d": 30 * 86400}
RISK_DELAY_S = 7 * 86400
RAW_CATEGORICAL = ("entry_mode", "auth_method", "txn_type", "merchant_country", "currency", "mcc")


def window_start(key_cust: np.ndarray, secs: np.ndarray, w: float) -> np.ndarray:
    """Per row ``i``: ``lo_i``, the first of the customer's rows with time ``>= t_i - w``; the window of
    ``i`` is rows ``lo_i .. i-1`` (earlier rows in the frame's order, never ``i`` itself). Raises
    ``ValueError`` unless the rows are sorted by (customer, time)."""
    key = key_cust * 1e10 + secs
    if len(key) > 1 and (np.diff(key) < 0).any():
        raise ValueError("rolling features need the rows sorted by customer and time (as Bank.df is)")
    return np.searchsorted(key, key - w, side="left")


def window_stats(key_cust: np.ndarray, secs: np.ndarray, values: list[np.ndarray], w: float) -> list[np.ndarray]:
    """Per row: the count and the sums of ``values`` over the customer's earlier rows within ``w`` s
    (the window of :func:`window_start`)."""
    lo = window_start(key_cust, secs, w)
    idx = np.arange(len(lo))
    out = [(idx - lo).astype(np.float64)]
    for v in values:
        c = np.r_[0.0, np.cumsum(v)]
        out.append(c[idx] - c[lo])
    return out


def window_distinct(key_cust: np.ndarray, secs: np.ndarray, codes: np.ndarray, w: float) -> np.ndarray:
    """Per row: the number of distinct ``codes`` (e.g. merchants) among the customer's earlier rows within
    ``w`` s (the window of :func:`window_start`), exactly and without a loop over rows.

    Row ``j`` counts for row ``i`` when it is the first row of its code in ``i``'s window:
    ``lo_i <= j < i`` and ``prev_j < lo_i`` (``prev_j``: the customer's previous row with the same code,
    -1 if none). ``lo`` does not decrease, so those ``i`` form one range per ``j`` (a difference array).
    """
    n = len(secs)
    lo = window_start(key_cust, secs, w)
    idx = np.arange(n)
    prev = pd.Series(idx).groupby([key_cust, codes]).shift(1).fillna(-1).to_numpy().astype(np.int64)
    first = np.maximum(idx + 1, np.searchsorted(lo, prev, side="right"))
    last = np.searchsorted(lo, idx, side="right")  # one past the last i with lo_i <= j
    ok = first < last
    diff = np.zeros(n + 1)
    np.add.at(diff, first[ok], 1.0)
    np.add.at(diff, last[ok], -1.0)
    return np.cumsum(diff)[:n]


def merchant_risk(df: pd.DataFrame, delay_s: float = RISK_DELAY_S,
                  windows_s: dict[str, float] = RISK_WINDOWS_S) -> dict[str, np.ndarray]:
    """Leak-free merchant risk per row: for a transaction at ``t`` with merchant ``m`` and each window
    ``w``, the number of transactions of ``m`` (all customers) in ``[t - delay - w, t - delay)``, the
    number of those that are frauds whose label was available by ``t - delay`` (``label_available_at``;
    the fraud's own timestamp when the column is absent), and their ratio (NaN without transactions).

    A fraud at ``s`` with label time ``a`` counts for the queries of its merchant with
    ``s < t - delay <= s + w`` and ``a <= t - delay``, so each fraud adds 1 over one contiguous range of the merchant's
    time-sorted rows (a difference array; no loop over rows). Rows without a merchant get NaN.
    """
    n = len(df)
    secs = (df["timestamp"] - df["timestamp"].min()).dt.total_seconds().to_numpy()
    known = df["merchant_id"].notna().to_numpy() if "merchant_id" in df else np.zeros(n, bool)
    merch = pd.factorize(df["merchant_id"].astype(str))[0].astype(np.float64) if "merchant_id" in df else np.zeros(n)
    order = np.lexsort((secs, merch))
    key = merch[order] * 1e10 + secs[order]
    y = df["is_fraud"].fillna(0).to_numpy().astype(bool) if "is_fraud" in df else np.zeros(n, bool)
    if "label_available_at" in df:
        avail = (df["label_available_at"] - df["timestamp"].min()).dt.total_seconds().to_numpy()
        avail = np.where(np.isnan(avail), secs, np.maximum(avail, secs))
    else:
        avail = secs
    fraud = np.flatnonzero(y & known)
    base = merch[fraud] * 1e10
    # the fraud at s enters the window [q - w, q) of query q = t - delay once q > s and q >= a
    first = np.where(avail[fraud] > secs[fraud], np.searchsorted(key, base + avail[fraud] + delay_s, side="left"),
                     np.searchsorted(key, base + secs[fraud] + delay_s, side="right"))
    q = key - delay_s
    out: dict[str, np.ndarray] = {}
    for name, w in windows_s.items():
        count = (np.searchsorted(key, q, side="left") - np.searchsorted(key, q - w, side="left")).astype(np.float64)
        last = np.searchsorted(key, base + secs[fraud] + w + delay_s, side="right")  # ... and while q - w <= s
        ok = last > first
        diff = np.zeros(n + 1)
        np.add.at(diff, first[ok], 1.0)
        np.add.at(diff, last[ok], -1.0)
        c, f = np.empty(n), np.empty(n)
        c[order], f[order] = count, np.cumsum(diff)[:n]
        out[f"merchant_txns_{name}"] = np.where(known, c, np.nan)
        out[f"merchant_frauds_{name}"] = np.where(known, f, np.nan)
        out[f"merchant_fraud_rate_{name}"] = np.where(known & (c > 0), f / np.maximum(c, 1), np.nan)
    return out


def build_features(df: pd.DataFrame, distance_home: np.ndarray | None = None, rolling: bool = True,
                   freq_rows: np.ndarray | None = None, risk: bool = False) -> pd.DataFrame:
    """Feature table for every row of ``df`` (sorted by customer and time, as ``Bank.df``).

    Args:
        df: the sorted transactions.
        distance_home: km from home per row (NaN when card-not-present).
        rolling: add velocity, declines, deviation, novelty and travel-speed features (else B0).
        freq_rows: rows whose merchant/device frequencies define the frequency encoding (train rows).
        risk: add the merchant-risk features of :func:`merchant_risk` (labels with a 7-day delay).
    """
    n = len(df)
    ts = df["timestamp"]
    local = ts + pd.to_timedelta(df.get("tz_offset_min", pd.Series(0, index=df.index)).fillna(0), unit="min")
    amount = df["amount"].to_numpy(float)
    feats = {
        "amount": amount, "log_amount": np.log1p(np.abs(amount)), "hour": local.dt.hour.to_numpy(),
        "weekday": local.dt.day_of_week.to_numpy(),
        "distance_home": distance_home if distance_home is not None else np.full(n, np.nan),
    }
    for col in RAW_CATEGORICAL:
        if col in df:
            feats[col] = df[col].astype(str).astype("category")
    freq_src = df if freq_rows is None else df.iloc[np.flatnonzero(freq_rows)]
    for col in ("merchant_id", "device_id"):
        if col in df:
            counts = freq_src[col].value_counts()
            feats[f"{col}_freq"] = df[col].map(counts).fillna(0).to_numpy(float)
    if rolling:
        cust = pd.factorize(df["customer_id"])[0].astype(np.float64)
        secs = ((ts - ts.min()).dt.total_seconds()).to_numpy()
        declined = (df.get("response_code", pd.Series("approved", index=df.index)).astype(str) != "approved")
        declined = declined.to_numpy(float)
        amt = np.abs(amount)
        for name, w in WINDOWS_S.items():
            cnt, s, s2, dec = window_stats(cust, secs, [amt, amt ** 2, declined], w)
            feats[f"count_{name}"], feats[f"sum_{name}"] = cnt, s
            if name in ("1h", "24h"):
                feats[f"declines_{name}"] = dec
            if name == "30d":  # NaN without earlier rows (z: fewer than 2); the ratio is inf over a $0 mean
                mean = np.where(cnt > 0, s / np.maximum(cnt, 1), np.nan)
                var = np.where(cnt > 1, s2 / np.maximum(cnt, 1) - mean ** 2, np.nan)
                with np.errstate(divide="ignore", invalid="ignore"):
                    feats["amount_over_30d_mean"] = amt / mean
                feats["amount_z_30d"] = (amt - mean) / np.sqrt(np.maximum(var, 1e-6))
        prev = pd.Series(secs).groupby(cust).shift(1).to_numpy()
        feats["secs_since_prev"] = secs - prev
        for col in ("merchant_id", "mcc", "merchant_country", "device_id"):
            if col in df:
                known = df[col].notna().to_numpy()
                first = (df.groupby(["customer_id", col], sort=False, dropna=True).cumcount() == 0).to_numpy()
                feats[f"new_{col}"] = np.where(known, first, np.nan).astype(float)
        if "merchant_id" in df:
            # distinct merchants among the earlier rows of the previous 24 h
            mcodes = pd.factorize(df["merchant_id"].astype(str))[0]
            feats["distinct_merchants_24h"] = window_distinct(cust, secs, mcodes, 86400)
        if {"merchant_lat", "merchant_lon"} <= set(df.columns):
            lat, lon = df["merchant_lat"].to_numpy(float), df["merchant_lon"].to_numpy(float)
            present = ~np.isnan(lat)
            prev_lat = pd.Series(np.where(present, lat, np.nan)).groupby(cust).transform(lambda s: s.ffill().shift(1))
            prev_lon = pd.Series(np.where(present, lon, np.nan)).groupby(cust).transform(lambda s: s.ffill().shift(1))
            prev_t = pd.Series(np.where(present, secs, np.nan)).groupby(cust).transform(lambda s: s.ffill().shift(1))
            km = haversine_km(lat, lon, prev_lat.to_numpy(), prev_lon.to_numpy())
            hours = np.maximum((secs - prev_t.to_numpy()) / 3600, 1 / 60)
            feats["card_present_speed_kmh"] = np.where(present, km / hours, np.nan)
    if risk:
        feats.update(merchant_risk(df))
    return pd.DataFrame(feats)


def tabular_columns(features: pd.DataFrame) -> list[str]:
    """The columns of :func:`build_features` the joint-fusion head reads: the numeric ones, less the
    merchant / device frequency encodings (counted over one bank's training rows, so they would mean
    something else on another bank); categorical fields reach the sequence model as tokens already."""
    return [c for c in features.columns if features[c].dtype.kind in "fiub" and not c.endswith("_freq")]


def tabular_table(bank, names: list[str] | None = None) -> tuple[list[str], np.ndarray]:
    """``(names, float32 [N, K])``: the rolling features of every row of ``bank`` (a
    :class:`~slmlab.transactions.data.bank.Bank`, rows in its order), columns ``names`` (default
    :func:`tabular_columns`); infinities become NaN (the model reads NaN as missing). Raises
    ``ValueError`` naming a requested column this bank cannot give (e.g. coordinates of a real export)."""
    from .bank import derive_distance

    X = build_features(bank.df, derive_distance(bank), rolling=True)
    names = tabular_columns(X) if names is None else list(names)
    missing = [c for c in names if c not in X.columns]
    if missing:
        raise ValueError(f"the bank cannot give the tabular feature(s) {missing} the model was trained with; score it"
                         " with a model fine-tuned on data with the same columns")
    table = X[names].to_numpy(np.float64)
    table[~np.isfinite(table)] = np.nan
    return names, table.astype(np.float32)
