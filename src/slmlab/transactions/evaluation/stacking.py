"""The stacked model: a low-capacity monotone blend of out-of-fit base scores (docs/transactions.md,
"Stacking").

Inputs are scores the report already has, each fitted on the training period only, so that on the
validation and test periods every input is out of sample: HGB-rolling (fitted on the training rows,
its iteration count chosen on validation), the fine-tuned sequence model and any joint-fusion model
(fine-tuned on training windows). The combiner is a logistic regression on the inputs' logits with
non-negative weights (a higher input score never lowers the blend: monotone, ``k + 1`` parameters),
fitted on the validation rows whose labels are known by the start of test.

The blend is checked before it is used: cross-fitted by customer (``FOLDS`` folds of validation
customers; each fold scored by a blend fitted on the others), its out-of-fold validation PR-AUC must
beat the best single input's validation PR-AUC (an input needs no fit there: its ranking is fixed).
Otherwise ``stacked`` is that best input, unchanged; ``info["choice"]`` says which was taken, and why.
"""

from __future__ import annotations

import numpy as np

from .._deps import pd
from ..data.bank import Bank
from .kinds import ModelKind, kind_of

FOLDS = 5
MIN_POSITIVES = 10  # fewer validation frauds than this: no blend is fitted (the best input is taken)
L2 = 1e-3  # ridge on the weights (not the intercept), per row of the mean log-loss
CLIP = 1e-6


def logits(p: np.ndarray) -> np.ndarray:
    """``log(p / (1 - p))`` with ``p`` clipped to ``[1e-6, 1 - 1e-6]`` (NaN stays NaN)."""
    p = np.clip(np.asarray(p, float), CLIP, 1 - CLIP)
    return np.log(p) - np.log1p(-p)


def fit_monotone_logistic(X: np.ndarray, y: np.ndarray, l2: float = L2) -> tuple[np.ndarray, float]:
    """Logistic regression ``sigmoid(X @ w + b)`` with ``w >= 0`` (L-BFGS-B on the mean log-loss plus
    ``l2 * |w|^2``). ``X [n, k]``, ``y [n]`` in {0, 1}; returns ``(w [k], b)``."""
    from scipy.optimize import minimize

    X, y = np.asarray(X, float), np.asarray(y, float)
    n, k = X.shape

    def loss(theta):
        w, b = theta[:k], theta[k]
        z = X @ w + b
        nll = np.mean(np.logaddexp(0.0, z) - y * z)
        g = (1.0 / (1.0 + np.exp(-z)) - y) / n
        return nll + l2 * w @ w, np.r_[X.T @ g + 2 * l2 * w, g.sum()]

    prior = np.clip(y.mean(), CLIP, 1 - CLIP)
    theta0 = np.r_[np.full(k, 0.5), np.log(prior / (1 - prior))]
    res = minimize(loss, theta0, jac=True, method="L-BFGS-B", bounds=[(0.0, None)] * k + [(None, None)])
    return res.x[:k], float(res.x[k])


def customer_folds(groups: np.ndarray, k: int = FOLDS, seed: int = 0) -> np.ndarray:
    """Fold ``[n]`` in ``0..k-1`` of each row, every customer (``groups``) wholly in one fold (seeded)."""
    codes, uniq = pd.factorize(np.asarray(groups))
    order = np.random.default_rng(seed).permutation(len(uniq))
    return (order % k)[codes]


def _ap(y: np.ndarray, s: np.ndarray) -> float:
    from sklearn.metrics import average_precision_score

    return float(average_precision_score(y, s)) if 0 < y.sum() < len(y) else float("nan")


def blend(scores: dict[str, np.ndarray], y: np.ndarray, fit_rows: np.ndarray, groups: np.ndarray,
          folds: int = FOLDS, seed: int = 0, min_positives: int = MIN_POSITIVES) -> tuple[np.ndarray, dict]:
    """The stacked score ``[N]`` of the inputs ``scores`` (name -> probabilities ``[N]``) and how it was chosen.

    Args:
        y: ``[N]`` labels (read on ``fit_rows`` only, which must hold 0/1).
        fit_rows: indices (or a bool mask) of the rows the blend is fitted and checked on (validation).
        groups: ``[N]`` customer of each row (the cross-fitting folds keep a customer together).

    Returns ``(scores, info)``: the blend where its cross-fitted validation PR-AUC beats every input's,
    else the best input's scores; ``info``: ``choice`` (``"blend"`` or the input's name), ``reason``,
    ``inputs``, ``input_val_pr_auc``, ``blend_oof_pr_auc``, ``weights``, ``intercept``, ``val_rows``,
    ``val_frauds``, ``folds``. Rows where an input is NaN get NaN from the blend.
    """
    names = list(scores)
    rows = np.asarray(fit_rows)
    rows = np.flatnonzero(rows) if rows.dtype == bool else rows
    X = np.column_stack([logits(scores[n]) for n in names])
    rows = rows[~np.isnan(X[rows]).any(1)]
    yv, Xv = np.asarray(y)[rows].astype(int), X[rows]
    if not np.isin(yv, (0, 1)).all():
        raise ValueError("the stacker's fit rows need known labels (0 or 1); drop the rows labelled -1")
    single = {n: _ap(yv, Xv[:, i]) for i, n in enumerate(names)}
    best = max(names, key=lambda n: -np.inf if np.isnan(single[n]) else single[n])
    info = {"inputs": names, "input_val_pr_auc": single, "val_rows": int(len(rows)), "val_frauds": int(yv.sum()),
            "folds": folds, "blend_oof_pr_auc": float("nan"), "weights": None, "intercept": None}
    if len(names) < 2 or yv.sum() < min_positives:
        why = "one input" if len(names) < 2 else f"{int(yv.sum())} validation frauds < {min_positives}"
        return np.asarray(scores[best], float), {**info, "choice": best, "reason": f"no blend fitted: {why}"}
    fold = customer_folds(np.asarray(groups)[rows], folds, seed)
    oof = np.full(len(rows), np.nan)
    for k in range(folds):
        out = fold == k
        if not out.any():
            continue
        fit_y = yv[~out]
        if fit_y.sum() == 0 or fit_y.sum() == len(fit_y):
            continue
        w, b = fit_monotone_logistic(Xv[~out], fit_y)
        oof[out] = Xv[out] @ w + b
    ok = ~np.isnan(oof)
    info["blend_oof_pr_auc"] = oof_ap = _ap(yv[ok], oof[ok])
    w, b = fit_monotone_logistic(Xv, yv)
    info.update(weights=dict(zip(names, map(float, w))), intercept=b)
    if not np.isfinite(oof_ap):  # every validation fraud in too few customers to score a held-out fold
        return np.asarray(scores[best], float), {
            **info, "choice": best, "reason": f"no out-of-fold check of the blend: the {int(yv.sum())}"
            f" validation frauds fall in too few customers for {folds} customer folds"}
    if not oof_ap > single[best]:
        return np.asarray(scores[best], float), {
            **info, "choice": best,
            "reason": f"blend out-of-fold PR-AUC {oof_ap:.4f} <= {best}'s {single[best]:.4f} on validation"}
    return 1.0 / (1.0 + np.exp(-(X @ w + b))), {
        **info, "choice": "blend", "reason": f"blend out-of-fold PR-AUC {oof_ap:.4f} > {best}'s {single[best]:.4f}"}


def stack_inputs(all_scores: dict[str, np.ndarray], kinds: dict[str, ModelKind] | None = None) -> dict[str, np.ndarray]:
    """The stacker's inputs among a report's scores: the rows whose kind is a stack input (HGB-rolling,
    the sequence model, joint fusion; ``kinds``: the further models' kinds, :func:`~.kinds.kind_of`)."""
    return {name: scores for name, scores in all_scores.items() if kind_of(name, kinds).stack_input}


def stacked_scores(bank: Bank, all_scores: dict[str, np.ndarray], labels_at=None,
                   kinds: dict[str, ModelKind] | None = None) -> tuple[np.ndarray, dict]:
    """:func:`blend` of :func:`stack_inputs` fitted on the bank's validation period, with the labels known
    by ``labels_at`` (default the start of test, as every other validation choice of the report)."""
    inputs = stack_inputs(all_scores, kinds)
    if len(inputs) < 2:
        raise ValueError(f"the stacker needs HGB-rolling and a sequence model's scores, got {sorted(inputs)}")
    n = len(bank.df)
    bad = [k for k, v in inputs.items() if len(v) != n]
    if bad:
        raise ValueError(f"scores must have one row per bank row ({n}); {bad} do not: score the whole bank")
    y = bank.labels(bank.cuts["test_start"] if labels_at is None else labels_at)
    val = bank.period_mask(bank.cuts["val_start"], bank.cuts["val_end"]) & (y >= 0)
    return blend(inputs, y, val, bank.df["customer_id"].to_numpy())
