"""The stacked model: gradient boosting on the rolling features plus the sequence model's streaming fraud
score plus 16 principal components of a customer embedding (docs/transactions.md, "Stacking, few
labels, and when the sequence model counts as useful").

Inputs per transaction ``t`` (one backbone pass per streaming window, :func:`score.score_embed_bank`):

- ``seq_score``: the fine-tuned fraud model's probability for ``t``, scored in streaming mode (the same
  number the sequence model reports for ``t``).
- ``cust_pc00..15``: the customer embedding before ``t`` (the L2-normalised masked mean of the summary
  states of the transactions before ``t`` in its streaming window; ``t``'s own summary state holds its
  response code, the issuer's decision, and is excluded), projected on 16 principal components. The
  PCA (scikit-learn) is fitted on the training-period rows only, so test rows never shape the
  projection.

The booster is the HGB-rolling baseline's own code (:func:`baseline.hgb_scores`: the same features,
hyper-parameters and validation-PR-AUC iteration choice) with these 17 columns appended. Where the
booster is fitted is a table entry, chosen once:

- ``train`` (``stacked``): the baseline's training rows, selection on validation. Caveat: the fraud
  head was fine-tuned on these same windows, so their ``seq_score`` is in-sample and more confident
  than it will be on test; the booster may over-trust it.
- ``validation`` (``stacked_val``): the honest alternative. The score is out of sample on the
  validation period (the head never trained there), so the booster is fitted on its first half (by
  time) and its iteration count chosen on the second half. It sees fewer labels (the validation period
  is a fifth of the training period's length).
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np

from .._deps import pd
from ..data.bank import Bank
from .baseline import hgb_scores, hgb_split

PCA_COMPONENTS = 16


def pca_features(emb: np.ndarray, fit_rows: np.ndarray, n_components: int = PCA_COMPONENTS,
                 seed: int = 0) -> np.ndarray:
    """Project ``emb [N, d]`` on the first ``n_components`` principal components of ``emb[fit_rows]``.

    Rows with a NaN embedding (not scored) project to NaN. Raises ``ValueError`` when there are fewer fit
    rows or embedding dimensions than components.
    """
    from sklearn.decomposition import PCA

    fit = np.asarray(fit_rows)
    fit = np.flatnonzero(fit) if fit.dtype == bool else fit
    fit = fit[~np.isnan(emb[fit]).any(1)]
    if len(fit) < n_components or emb.shape[1] < n_components:
        raise ValueError(f"PCA needs at least {n_components} fitted rows and dimensions, got {len(fit)} rows of"
                         f" {emb.shape[1]}; use a larger bank or fewer components")
    pca = PCA(n_components=n_components, random_state=seed).fit(emb[fit])
    out = np.full((len(emb), n_components), np.nan, np.float64)
    ok = ~np.isnan(emb).any(1)
    out[ok] = pca.transform(emb[ok])
    return out


def stack_columns(scores: np.ndarray, pcs: np.ndarray) -> pd.DataFrame:
    """The 1 + 16 columns the stacked booster adds: ``seq_score`` and ``cust_pc00``... (float)."""
    cols = {"seq_score": np.asarray(scores, float)}
    cols.update({f"cust_pc{k:02d}": pcs[:, k] for k in range(pcs.shape[1])})
    return pd.DataFrame(cols)


def training_period_rows(bank: Bank) -> np.ndarray:
    """Bool ``[N]``: rows of the training period, customers held out of training excluded."""
    rows = bank.period_mask(None, bank.cuts["train_end"])
    if bank.holdout:
        rows &= ~bank.df["customer_id"].isin(bank.holdout).to_numpy()
    return rows


def validation_time_split(bank: Bank, fit_share: float = 0.5):
    """Fit rows: the first ``fit_share`` of the validation period's days; selection rows: the rest; labels
    known by the start of the test period (as the baseline's selection labels). Same return shape as
    :func:`baseline.hgb_split`: ``(fit_rows, y_fit, select_rows, y_select)``."""
    start, end = bank.cuts["val_start"], bank.cuts["val_end"]
    mid = start + (end - start) * fit_share
    y = bank.labels(bank.cuts["test_start"])
    fit = np.flatnonzero(bank.period_mask(start, mid) & (y >= 0))
    sel = np.flatnonzero(bank.period_mask(mid, end) & (y >= 0))
    return fit, y[fit], sel, y[sel]


STACK_FITS: dict[str, Callable] = {"stacked": hgb_split, "stacked_val": validation_time_split}


def stacked_scores(bank: Bank, seq_scores: np.ndarray, emb: np.ndarray,
                   fits: dict[str, Callable] = STACK_FITS) -> tuple[dict[str, np.ndarray], dict]:
    """Scores ``[N]`` of each stacked variant in ``fits`` (name -> split function) and their fit info.

    Args:
        bank: the evaluated bank.
        seq_scores: ``[N]`` streaming fraud scores of every row (:func:`score.score_embed_bank`).
        emb: ``[N, d]`` customer embeddings before each row (same function).
    """
    if len(seq_scores) != len(bank.df) or len(emb) != len(bank.df):
        raise ValueError(f"scores and embeddings must have one row per bank row ({len(bank.df)}), got"
                         f" {len(seq_scores)} and {len(emb)}; score the whole bank with score_embed_bank")
    # the PCA is fitted where the boosters are: the training period, or (validation fits only: the
    # training period was not scored) the validation rows they are fitted on
    pca_rows = training_period_rows(bank) if "stacked" in fits else np.unique(np.concatenate(
        [split(bank)[0] for split in fits.values()]))
    cols = stack_columns(seq_scores, pca_features(emb, pca_rows))
    scores, info = {}, {}
    for name, split in fits.items():
        scores[name], info[name] = hgb_scores(bank, rolling=True, extra=cols, split=split)
    return scores, info
