"""Joint fusion: the fraud head reads the sequence state of a transaction together with that
transaction's tabular rolling features (:func:`slmlab.transactions.data.features.tabular_table`), and the
whole model (embedding, backbone, head) is trained end to end on the fraud labels.

This is the integration the nuFormer paper reports for a transaction foundation model ("nuFormer: a
transaction foundation model for financial services", arXiv:2507.23267): the sequence representation
and the engineered features meet inside one network rather than in a booster fitted afterwards (late
stacking, :mod:`slmlab.transactions.evaluation.stacking`).

Inputs: per feature ``k``, ``z_k = (slog(x_k) - center_k) / scale_k`` with ``slog(x) = sign(x) log(1 + |x|)``
(counts, sums and seconds span orders of magnitude), ``center`` / ``scale`` the mean and standard
deviation of ``slog(x_k)`` over the training rows (stored in the config, so a saved model scores another
bank the same way); a missing value (NaN: no earlier row, no coordinates) gives ``z_k = 0`` and a
missing flag ``m_k = 1``. The head is ``MLP([state ; z ; m])``: ``Linear(D + 2K, inner) -> SiLU ->
Dropout -> Linear(inner, 1)``.
"""

from __future__ import annotations

import numpy as np
import torch
from torch import nn


def signed_log(x: torch.Tensor | np.ndarray):
    """``sign(x) * log1p(|x|)`` (torch or numpy, NaN kept)."""
    if isinstance(x, np.ndarray):
        return np.sign(x) * np.log1p(np.abs(x))
    return torch.sign(x) * torch.log1p(x.abs())


def fit_normaliser(table: np.ndarray, fit_rows: np.ndarray) -> tuple[list[float], list[float]]:
    """``(center, scale)`` per column of ``table [N, K]``: mean and standard deviation of
    :func:`signed_log` over ``fit_rows`` (NaN ignored; a column without values or without spread gets
    center 0 / scale 1, so it contributes its missing flag only)."""
    x = signed_log(np.asarray(table, np.float64)[fit_rows])
    center, scale = [], []
    for k in range(x.shape[1]):
        col = x[:, k][~np.isnan(x[:, k])]
        mu = float(col.mean()) if len(col) else 0.0
        sd = float(col.std()) if len(col) > 1 else 0.0
        center.append(mu)
        scale.append(sd if sd > 1e-6 else 1.0)
    return center, scale


class TabularInput(nn.Module):
    """``[B, T, K]`` raw features -> ``[B, T, 2K]``: the normalised values (0 where missing) and the
    missing flags (see the module docstring)."""

    def __init__(self, center: list[float], scale: list[float]) -> None:
        super().__init__()
        if len(center) != len(scale):
            raise ValueError(f"tabular center and scale differ in length ({len(center)} vs {len(scale)})")
        # saved with the weights too (a load that initialises on the meta device fills only saved tensors)
        self.register_buffer("center", torch.tensor(center, dtype=torch.float32))
        self.register_buffer("scale", torch.tensor(scale, dtype=torch.float32))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = x.float()
        missing = torch.isnan(x)
        z = (signed_log(torch.nan_to_num(x, nan=0.0)) - self.center) / self.scale
        return torch.cat([torch.where(missing, torch.zeros_like(z), z), missing.float()], dim=-1)


class JointFraudHead(nn.Module):
    """The fraud MLP on ``[state at the score position ; normalised tabular features ; missing flags]``.

    Args:
        hidden_size: ``D``; score_index / num_features: as :class:`~.fraud.TransactionFraudHead`'s.
        center, scale: the normaliser of the ``K`` tabular features (:func:`fit_normaliser`).
        inner: MLP width (default ``D // 2``); dropout: after the SiLU.
    """

    def __init__(self, hidden_size: int, score_index: int, num_features: int, center: list[float],
                 scale: list[float], inner: int | None = None, dropout: float = 0.1) -> None:
        super().__init__()
        self.score_index, self.num_features = score_index, num_features
        self.tabular = TabularInput(center, scale)
        inner = inner or hidden_size // 2
        self.mlp = nn.Sequential(nn.Linear(hidden_size + 2 * len(center), inner), nn.SiLU(), nn.Dropout(dropout),
                                 nn.Linear(inner, 1))

    def forward(self, hidden: torch.Tensor, ids: torch.Tensor | None = None, txn_mask: torch.Tensor | None = None,
                tabular: torch.Tensor | None = None) -> torch.Tensor:
        """``hidden [B, T*F, D]`` and ``tabular [B, T, K]`` -> logits ``[B, T]``."""
        if tabular is None:
            raise ValueError("this fraud model fuses tabular features (joint fusion) and needs `tabular` [B, T, K];"
                             " score it through score_bank / score_transactions, which compute them from the bank")
        state = hidden[:, self.score_index::self.num_features]
        x = torch.cat([state, self.tabular(tabular).to(state.dtype)], dim=-1)
        return self.mlp(x).squeeze(-1)
