"""Embedding-augmented boosting (``hgb_rolling_encoder``): the frozen pretrained encoder's state at each
transaction, reduced to 16 principal components, joins the rolling features of HGB-rolling
(docs/transactions.md, "Embedding-augmented boosting").

The encoder is never shown a label: one streaming pass (:func:`.score.score_states`) reads its state at
the score position of every row (it has seen the row's fields up to ``auth_method`` and up to ``T - 1``
earlier rows, never the row's own ``response_code``). The PCA is fitted on training-period rows only
and the booster is HGB-rolling's own code (:func:`.baseline.hgb_scores`: features, hyper-parameters,
training-period fit and validation iteration choice) with the 16 columns appended.

In-sample shift: the encoder was pretrained on the training windows, so its states may describe
training rows better than test rows, and the booster would learn to trust them more than it should.
:func:`encoder_shift` measures it: the encoder's next-token loss on a sample of training windows against
validation windows (the report keeps both and their gap).
"""

from __future__ import annotations

import time

import numpy as np

from .._deps import pd
from ..data.bank import Bank
from ..data.windows import sample_windows
from .baseline import HGB_PARAMS, data_key, hgb_scores
from .cache import cached_scores, weights_key
from .pretrain import pretrain_report, unigram_counts
from .score import score_states

PCA_COMPONENTS = 16


def training_period_rows(bank: Bank) -> np.ndarray:
    """Bool ``[N]``: rows of the training period, customers held out of training excluded."""
    rows = bank.period_mask(None, bank.cuts["train_end"])
    if bank.holdout:
        rows &= ~bank.df["customer_id"].isin(bank.holdout).to_numpy()
    return rows


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


def encoder_columns(states: np.ndarray, bank: Bank, n_components: int = PCA_COMPONENTS) -> pd.DataFrame:
    """The columns ``enc_pc00..`` the booster adds: ``states [N, D]`` on the PCA of the training rows."""
    pcs = pca_features(states, training_period_rows(bank), n_components)
    return pd.DataFrame({f"enc_pc{k:02d}": pcs[:, k] for k in range(pcs.shape[1])})


def hgb_encoder_scores(bank: Bank, states: np.ndarray) -> tuple[np.ndarray, dict]:
    """HGB-rolling with the encoder's state PCs appended (``states [N, D]``, one per bank row)."""
    if len(states) != len(bank.df):
        raise ValueError(f"states must have one row per bank row ({len(bank.df)}), got {len(states)};"
                         " score the whole bank with score_states")
    return hgb_scores(bank, rolling=True, extra=encoder_columns(states, bank))


def cached_encoder_scores(bank: Bank, encoder, cache_dir=None, key: str | None = None, device="cpu",
                          progress: bool = False) -> tuple[np.ndarray, dict]:
    """:func:`hgb_encoder_scores` of ``encoder``'s states on ``bank``, through
    :func:`.cache.cached_scores` keyed by the data (:func:`.baseline.data_key`), the encoder
    (:func:`.cache.weights_key`), the PCA size and the booster's hyper-parameters: the streaming pass over every
    row is the costly part (1.7 CPU-hours on a 2.8M-row bank), and it depends on neither the sequence
    model nor the labels. ``info["states_seconds"]``: that pass's time in the run that computed it."""
    def compute():
        t0 = time.perf_counter()
        states = score_states(encoder, bank, device=device, progress=progress)
        seconds = time.perf_counter() - t0
        scores, info = hgb_encoder_scores(bank, states)
        return scores, {**info, "states_seconds": seconds}

    if cache_dir is None:
        return compute()
    return cached_scores(cache_dir, "hgb_rolling_encoder", key or data_key(bank),
                         [weights_key(encoder), PCA_COMPONENTS, HGB_PARAMS], len(bank.df), compute)


def encoder_shift(encoder, bank: Bank, n_windows: int = 256, batch_size: int = 64, device="cpu",
                  seed: int = 0) -> dict:
    """The encoder's feature-balanced next-token loss on ``n_windows`` seeded training and validation
    windows: ``{"train_loss", "validation_loss", "gap"}`` (gap = validation - train; near 0: the states
    of the rows the encoder was pretrained on are not measurably better fitted than unseen ones)."""
    T = encoder.config.max_transactions
    train = bank.windows(T, T // 2, "train")
    counts = unigram_counts(train, list(encoder.config.schema_config.vocab_sizes))
    out = {}
    for split, w in (("train", train), ("validation", bank.windows(T, T // 2, "validation"))):
        out[f"{split}_loss"] = pretrain_report(encoder, sample_windows(w, n_windows, seed), counts, batch_size,
                                               device)["loss"]
    out["gap"] = out["validation_loss"] - out["train_loss"]
    out["windows"] = int(n_windows)
    return out
