"""Wide & deep: the per-row logistic regression on the one-hot tokens of a transaction's own fields, as a
baseline (``token_lr``, the floor every sequence recipe is reported beside) and as the wide half of a
fraud head (``fraud_wide: tokens``; Cheng et al., "Wide & Deep Learning for Recommender Systems",
arXiv:1606.07792).

:func:`fit_row_logistic` fits the regression on the fields up to the score field (what the fraud head
has read of the row when it scores it; no history, no ``response_code``), ``C`` chosen by validation
PR-AUC over a grid that grows tenfold past its top while the top wins. :class:`WideFraudHead` adds
``sum_f w_f[id_f] + b`` over those fields to any fraud head's logit, with the deep head's output layer
at zero at construction (so the deep head adds nothing until it learns to);
:meth:`WideFraudHead.load_logistic` copies a fitted regression into ``w`` and ``b``. A fine-tune
therefore starts from exactly the per-row floor's scores, and what it learns from the history is added
to them. (A first version scaled the deep head by a learned gate starting at 0, as ReZero; at the
fine-tuning learning rate, 1e-3, the gate opened by about 1e-3 a step and the deep head stayed out for
the whole run: on the large bank its validation PR-AUC sat at 0.25 from step 40 to 160 while the plain
head climbed to 0.39.)
"""

from __future__ import annotations

import time
from dataclasses import dataclass

import numpy as np
import torch
from torch import nn

WIDE_CHOICES = ("none", "tokens")
ROW_LR_C = (0.03, 0.3, 3.0)  # inverse L2 strengths tried first; the one with the best validation PR-AUC is kept
ROW_LR_C_MAX = 3000.0  # while the largest C tried wins, the grid grows tenfold past it, up to this
ROW_LR_MAX_ITER = 1000


@dataclass
class RowLogistic:
    """A fitted per-row logistic regression: the one-hot encoder of the ``k`` leading fields, the model,
    and ``info`` (every ``C`` tried with its validation PR-AUC and whether the solver converged)."""

    onehot: object
    model: object
    info: dict

    def scores(self, ids: np.ndarray) -> np.ndarray:
        """Fraud probabilities of rows ``ids [N, >= k]`` (token ids; only the leading ``k`` fields are read)."""
        return self.model.predict_proba(self.onehot.transform(np.asarray(ids)[:, :self.n_fields]))[:, 1]

    @property
    def n_fields(self) -> int:
        return len(self.onehot.categories_)

    def weights(self, vocab_sizes) -> tuple[list[np.ndarray], float]:
        """Per field ``f`` a ``[vocab_sizes[f]]`` weight vector (0 for ids the fit never saw: the one-hot
        encoder ignores them) and the intercept: the logit of a row is ``sum_f w_f[id_f] + b``."""
        coef = self.model.coef_.ravel()
        out, at = [], 0
        for f, cats in enumerate(self.onehot.categories_):
            w = np.zeros(int(vocab_sizes[f]), np.float64)
            w[np.asarray(cats, np.int64)] = coef[at:at + len(cats)]
            out.append(w)
            at += len(cats)
        return out, float(self.model.intercept_[0])


def fit_row_logistic(ids: np.ndarray, train_rows, y_train, val_rows, y_val, grid=ROW_LR_C,
                     c_max: float = ROW_LR_C_MAX) -> RowLogistic:
    """Fit the logistic regression on the one-hot tokens of ``ids [N, k]`` (every row's leading fields;
    the encoder sees every row, the model the ``train_rows``), ``C`` in ``grid`` chosen by the PR-AUC of
    ``val_rows``; while the largest ``C`` tried wins, ``C x 10`` is tried too, up to ``c_max``
    (``info["C_at_grid_edge"]``: ``c_max`` itself won). Without a validation positive the first ``C``."""
    from sklearn.linear_model import LogisticRegression
    from sklearn.metrics import average_precision_score
    from sklearn.preprocessing import OneHotEncoder

    t0 = time.perf_counter()
    onehot = OneHotEncoder(handle_unknown="ignore")
    X = onehot.fit_transform(np.asarray(ids))
    fits = {}

    def fit(c: float) -> None:
        model = LogisticRegression(C=c, max_iter=ROW_LR_MAX_ITER).fit(X[train_rows], y_train)
        ap = float(average_precision_score(y_val, model.predict_proba(X[val_rows])[:, 1])) if y_val.sum() else float("nan")
        fits[c] = (ap, model, bool(np.all(model.n_iter_ < ROW_LR_MAX_ITER)))

    def chosen() -> float:
        return max(fits, key=lambda c: -1.0 if np.isnan(fits[c][0]) else fits[c][0])

    for c in grid:
        fit(c)
    while y_val.sum() and chosen() == max(fits) and max(fits) * 10 <= c_max:
        fit(max(fits) * 10)
    best = chosen()
    info = {"C": float(best), "C_selection": "validation PR-AUC" if y_val.sum() else
            "the first of the grid (no validation positive)", "C_at_grid_edge": bool(best == max(fits) and best * 10 > c_max),
            "val_pr_auc_by_C": {str(c): fits[c][0] for c in fits}, "converged_by_C": {str(c): fits[c][2] for c in fits},
            "fit_rows": int(len(train_rows)), "fit_frauds": int((np.asarray(y_train) == 1).sum()),
            "total_seconds": time.perf_counter() - t0}
    return RowLogistic(onehot, fits[best][1], info)


def output_layer(deep: nn.Module) -> nn.Linear:
    """The fraud head's output layer: the last ``nn.Linear`` to one unit it registers (every fraud head ends
    in one: the MLP's last layer, or the logistic head itself)."""
    layers = [m for m in deep.modules() if isinstance(m, nn.Linear) and m.out_features == 1]
    if not layers:
        raise TypeError(f"{type(deep).__name__} has no Linear(..., 1) output layer for the wide & deep head to start at 0")
    return layers[-1]


class WideFraudHead(nn.Module):
    """``deep`` (any fraud head: ``(hidden, ids, txn_mask, tabular) -> [B, T]``) plus a linear term on the
    tokens of each transaction's fields ``0..score_index``:
    ``logit = deep(...) + sum_f wide[f](id_f) + bias``, with ``wide``, ``bias`` and the deep head's output
    layer (:func:`output_layer`) at 0 at construction: the model starts from a constant, or, after
    :meth:`load_logistic`, from a fitted per-row regression; the output layer's weights get gradient at
    the first step, the rest of the deep head and the encoder from the second."""

    def __init__(self, deep: nn.Module, vocab_sizes, score_index: int) -> None:
        super().__init__()
        self.deep = deep
        self.zero_deep_output()
        self.wide = nn.ModuleList(nn.Embedding(int(v), 1) for v in list(vocab_sizes)[:score_index + 1])
        for table in self.wide:
            nn.init.zeros_(table.weight)
        self.bias = nn.Parameter(torch.zeros(()))

    @torch.no_grad()
    def zero_deep_output(self) -> None:
        """Set the deep head's output layer to 0 (the model's weight init runs after the head is built, so
        the model calls this again after it)."""
        out = output_layer(self.deep)
        out.weight.zero_()
        out.bias.zero_()

    def forward(self, hidden: torch.Tensor, ids: torch.Tensor, txn_mask: torch.Tensor | None = None,
                tabular: torch.Tensor | None = None) -> torch.Tensor:
        """``ids [B, T, F]`` -> logits ``[B, T]``."""
        linear = sum(table(ids[..., f]).squeeze(-1) for f, table in enumerate(self.wide))
        return self.deep(hidden, ids, txn_mask, tabular) + linear + self.bias

    @torch.no_grad()
    def load_logistic(self, fit: RowLogistic) -> None:
        """Copy the fitted regression's weights into the wide term (fields beyond the fit's keep 0)."""
        if fit.n_fields != len(self.wide):
            raise ValueError(f"the regression reads {fit.n_fields} fields, the wide term {len(self.wide)}; fit it on"
                             " the fields up to the score field")
        weights, intercept = fit.weights([table.num_embeddings for table in self.wide])
        for table, w in zip(self.wide, weights):
            table.weight.copy_(torch.as_tensor(w, dtype=table.weight.dtype).unsqueeze(-1))
        self.bias.fill_(intercept)
