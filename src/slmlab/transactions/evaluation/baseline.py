"""The practitioner baseline: ``HistGradientBoostingClassifier`` on raw fields (B0) and on per-customer
rolling features (:mod:`slmlab.transactions.data.features`: every feature computed from strictly earlier
transactions of the same customer). Early stopping picks the number of boosting iterations by validation
PR-AUC (``staged_predict_proba``), so validation rows never enter the fit.

:func:`hgb_split` (which rows fit and select the booster) and :func:`hgb_scores` (features, fit and
scores of every bank row) are shared by the evaluation report and the stacked model.
"""

from __future__ import annotations

import hashlib
import json
import time
from pathlib import Path

import numpy as np

from .._deps import pd
from ..data.bank import Bank, derive_distance, labelled_split
from ..data.features import (  # noqa: F401  (re-exported: the features the baselines read)
    RAW_CATEGORICAL,
    RISK_DELAY_S,
    RISK_WINDOWS_S,
    WINDOWS_S,
    build_features,
    merchant_risk,
    window_distinct,
    window_start,
    window_stats,
)
from ..heads.wide import ROW_LR_C, ROW_LR_C_MAX, fit_row_logistic
from .cache import cached_scores

HGB_PARAMS = dict(learning_rate=0.05, max_iter=500, max_leaf_nodes=31, min_samples_leaf=50, l2_regularization=1.0,
                  random_state=0, early_stopping=False)


def fit_hgb(X: pd.DataFrame, y: np.ndarray, X_val: pd.DataFrame, y_val: np.ndarray, class_weight=None):
    """Fit HGB (the spec's hyper-parameters) and keep the iteration count with the best validation
    PR-AUC (checked every 10 iterations and at the last; the first of equal bests; stop after 3 checks
    without a gain). Without a validation positive there is nothing to rank, and every iteration is kept
    (``hgb_scores`` says so). Returns ``(model, n_iter)``."""
    from sklearn.ensemble import HistGradientBoostingClassifier
    from sklearn.metrics import average_precision_score

    model = HistGradientBoostingClassifier(**HGB_PARAMS, categorical_features="from_dtype", class_weight=class_weight)
    model.fit(X, y)
    best, best_it, since = -1.0, model.n_iter_, 0
    if y_val.sum() > 0:
        for it, proba in enumerate(model.staged_predict_proba(X_val), start=1):
            if it % 10 and it != model.n_iter_:
                continue
            ap = average_precision_score(y_val, proba[:, 1])
            if ap > best:
                best, best_it, since = ap, it, 0
            else:
                since += 10
                if since >= 30:
                    break
    return model, best_it


def predict_at(model, X: pd.DataFrame, n_iter: int) -> np.ndarray:
    """Scores of the first ``n_iter`` boosting iterations."""
    last = None
    for it, stage in enumerate(model.staged_predict_proba(X), start=1):
        last = stage
        if it == n_iter:
            break
    return last[:, 1]


HGB_VARIANTS = {"hgb_raw": {"rolling": False}, "hgb_rolling": {"rolling": True},
                "hgb_rolling_risk": {"rolling": True, "risk": True}}


hgb_split = labelled_split  # which rows fit and select the boosters (and token_lr)


def hgb_scores(bank: Bank, rolling: bool, risk: bool = False, extra: pd.DataFrame | None = None,
               split=hgb_split) -> tuple[np.ndarray, dict]:
    """Scores of HGB (B0 raw fields, with rolling features, and with merchant risk as well) for every
    row; fit on the rows of ``split(bank)`` (default :func:`hgb_split`: train rows with labels known by
    the end of train), iteration count chosen on its selection rows (validation). ``extra``: columns
    appended to the features (one row per bank row; the stacked model's)."""
    t0 = time.perf_counter()
    df = bank.df
    train = bank.period_mask(None, bank.cuts["train_end"])
    if bank.holdout:
        train &= ~df["customer_id"].isin(bank.holdout).to_numpy()
    X = build_features(df, derive_distance(bank), rolling=rolling, freq_rows=train, risk=risk)
    if extra is not None:
        X = pd.concat([X, extra.set_axis(X.index)], axis=1)
    t_feat = time.perf_counter() - t0
    tr_rows, y_tr, va_rows, y_va = split(bank)
    # a feature without any value in the fit rows (distance and speed of an export without coordinates, e.g.
    # TabFormer) carries nothing, and scikit-learn's binning fails on it: left out, and named in the info
    empty = [c for c in X.columns if X[c].dtype.kind == "f" and not X[c].iloc[tr_rows].notna().any()]
    X = X.drop(columns=empty)
    model, n_iter = fit_hgb(X.iloc[tr_rows], y_tr, X.iloc[va_rows], y_va)
    scores = predict_at(model, X, n_iter)
    selection = "validation PR-AUC" if (y_va == 1).any() else "all iterations (no validation positive)"
    return scores, {"features": list(X.columns), "empty_features_left_out": empty, "n_iter": int(n_iter),
                    "n_iter_selection": selection,
                    "feature_seconds": t_feat,
                    "fit_rows": int(len(tr_rows)), "fit_frauds": int((y_tr == 1).sum()),
                    "total_seconds": time.perf_counter() - t0}


def token_lr_scores(bank: Bank, split=hgb_split, grid=ROW_LR_C, c_max: float = ROW_LR_C_MAX) -> tuple[np.ndarray, dict]:
    """The per-row floor of the sequence models (``token_lr``): :func:`~..heads.wide.fit_row_logistic` on the
    one-hot tokens of each row's own fields up to the score field, fitted on the rows of ``split(bank)``
    (training period), ``C`` chosen on its validation rows (the grid grows past its top while the top
    wins). Returns ``(scores [N], info)``."""
    k = bank.fitted.schema.score_index
    ids = np.asarray(bank.ids[:, :k + 1])
    tr_rows, y_tr, va_rows, y_va = split(bank)
    fit = fit_row_logistic(ids, tr_rows, y_tr, va_rows, y_va, grid, c_max)
    return fit.scores(ids), {"features": [f"{n} (one-hot)" for n in bank.fitted.schema.names[:k + 1]], **fit.info}


def data_key(bank: Bank) -> str:
    """What the baselines read of ``bank``, hashed: its rows (every column), cuts and held-out customers
    (not its token ids: a bank tokenised with another fitted schema gives the same boosters)."""
    h = hashlib.sha256()
    h.update(pd.util.hash_pandas_object(bank.df.drop(columns=["row"], errors="ignore"), index=False).to_numpy().tobytes())
    h.update(json.dumps({k: str(v) for k, v in sorted(bank.cuts.items())}).encode())
    h.update(json.dumps(sorted(map(str, bank.holdout))).encode())
    return h.hexdigest()[:16]


def cached_hgb_scores(bank: Bank, name: str, kw: dict, cache_dir: str | Path | None,
                      key: str | None = None) -> tuple[np.ndarray, dict]:
    """:func:`hgb_scores` of the variant ``name`` (options ``kw``), through :func:`.cache.cached_scores` keyed by
    the data (:func:`data_key`), variant and hyper-parameters. The boosters of a large bank take many
    CPU-minutes, and they do not depend on the sequence model being evaluated."""
    if cache_dir is None:
        return hgb_scores(bank, **kw)
    return cached_scores(cache_dir, name, key or data_key(bank), [kw, HGB_PARAMS], len(bank.df),
                         lambda: hgb_scores(bank, **kw))
