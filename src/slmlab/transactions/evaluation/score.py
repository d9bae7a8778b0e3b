"""Streaming scoring: every transaction scored exactly once, with up to ``T - 1`` earlier ones.

Windows of ``T`` end at the customer's newest transaction and step back by ``T // 2``; each window
scores only its newest ``T // 2`` rows (its oldest window: all of its rows), so every transaction
gets one score and at least ``T // 2`` rows of history once the customer has that many.
"""

from __future__ import annotations

import numpy as np
import torch

from .._deps import pd
from ..data.bank import Bank
from ..data.features import tabular_table
from ..data.windows import Windows, build_windows
from ..heads.customer import CustomerEmbeddingHead, summary_states


def _progress(windows: Windows, batch_size: int, device, progress: bool, desc: str):
    """``windows.batches(batch_size, device)``, with a progress bar when ``progress``."""
    batches = windows.batches(batch_size, device)
    if not progress:
        return batches
    from tqdm.auto import tqdm

    return tqdm(batches, total=windows.num_batches(batch_size), desc=desc, unit="batch")


@torch.no_grad()
def score_windows(model, windows: Windows, batch_size: int = 64, device: torch.device | str = "cpu",
                  progress: bool = False) -> tuple[np.ndarray, np.ndarray]:
    """``(rows, scores)``: the fraud probability of each scored row of ``windows`` (each row once)."""
    model.eval()
    rows_out, scores_out = [], []
    for batch in _progress(windows, batch_size, device, progress, "scoring"):
        prob = torch.sigmoid(model(**batch.inputs()).logits.float()).cpu().numpy()
        keep = batch.scored
        rows_out.append(batch.rows[keep])
        scores_out.append(prob[keep])
    if not rows_out:
        return np.zeros(0, np.int64), np.zeros(0)
    return np.concatenate(rows_out), np.concatenate(scores_out)


def bank_windows(model, bank: Bank, since=None) -> Windows:
    """The streaming windows of ``bank`` for ``model`` (``T`` from its config; rows at or after ``since``
    scored), carrying the rows' tabular features when ``model`` fuses them (joint fusion: the names its
    config holds, computed from the bank)."""
    T = model.config.max_transactions
    lo = bank.count_before(since) if since is not None else None
    w = build_windows(bank.encoded(), T, T // 2, row_offsets=bank.starts, min_end=lo)
    names = getattr(model.config, "tabular_features", None)
    return w if names is None else w.with_row_features(tabular_table(bank, names)[1])


def score_bank(model, bank: Bank, since=None, batch_size: int = 64, device="cpu", progress: bool = False) -> np.ndarray:
    """Scores ``[N]`` for the rows of ``bank`` at or after ``since`` (NaN elsewhere)."""
    w = bank_windows(model, bank, since)
    rows, scores = score_windows(model, w, batch_size, device, progress)
    out = np.full(len(bank.df), np.nan)
    out[rows] = scores
    return out


def score_transactions(model, df: pd.DataFrame, customers: pd.DataFrame | None = None, since=None,
                       batch_size: int = 64, device="cpu") -> pd.DataFrame:
    """``DataFrame[transaction_id, score]`` for every transaction of ``df`` (at or after ``since``),
    tokenised with the schema fitted into ``model``'s config."""
    fitted = model.config.fitted_schema
    if fitted is None:
        raise ValueError("the model's config holds no fitted schema; pretrain or fine-tune it on a bank first")
    sorted_df, ids = fitted.encode_frame(df, customers)
    bank = Bank(sorted_df, ids, fitted, {})
    scores = score_bank(model, bank, since, batch_size, device)
    keep = ~np.isnan(scores)
    return pd.DataFrame({"transaction_id": sorted_df["transaction_id"].to_numpy()[keep], "score": scores[keep]})


@torch.no_grad()
def score_states(encoder, bank: Bank, batch_size: int = 64, device="cpu", progress: bool = False,
                 since=None) -> np.ndarray:
    """The encoder's state ``[N, D]`` (float32) at the score position of every row (at or after ``since``;
    NaN elsewhere), streaming: one backbone pass per window, each row read once. ``encoder``: a
    :class:`~slmlab.transactions.model.TransactionEncoder` (no head, no label ever shown)."""
    encoder.eval()
    w = bank_windows(encoder, bank, since)
    F, k = w.ids.shape[2], encoder.score_index
    rows_out, states_out = [], []
    for batch in _progress(w, batch_size, device, progress, "encoder states"):
        hidden = encoder.backbone_forward(batch.ids, batch.txn_mask)[:, k::F]
        rows_out.append(batch.rows[batch.scored])
        states_out.append(hidden[torch.as_tensor(batch.scored, device=hidden.device)].float().cpu().numpy())
    out = np.full((len(bank.df), encoder.config.backbone_config().hidden_size), np.nan, np.float32)
    if rows_out:
        out[np.concatenate(rows_out)] = np.concatenate(states_out)
    return out


# -- one pass for the stacked model: fraud score and the customer embedding before each transaction --------
def prefix_mean(states: torch.Tensor, txn_mask: torch.Tensor) -> torch.Tensor:
    """Exclusive masked prefix mean: row ``t`` of the result is the mean of ``states[:, t']`` over the real
    rows ``t' < t`` (zero where there is none).

    Args:
        states: ``[B, T, D]``; txn_mask: bool ``[B, T]``.
    Returns:
        ``[B, T, D]``.
    """
    m = txn_mask.to(states.dtype)[..., None]
    x = states * m
    total = torch.cumsum(x, 1) - x
    count = torch.cumsum(m, 1) - m
    return total / count.clamp(min=1.0)


class PrefixEmbedding(torch.nn.Module):
    """The customer embedding of each transaction from the transactions before it in its window.

    The summary state of a transaction (the state at its last field, ``response_code``) has read the
    whole transaction, including the issuer's decision, so the embedding of ``t`` averages the summary
    states of the earlier real rows only (:func:`prefix_mean`), then projects and L2-normalises. The
    projection is chosen once here: a model holding a trained ``CustomerEmbeddingHead`` (as
    ``customer_head``) uses its ``Linear(D, dim)``; any other model the identity (``dim = D``, the masked
    mean itself, as :func:`slmlab.transactions.heads.customer.embed_windows` does without a trained head).
    """

    def __init__(self, model) -> None:
        super().__init__()
        head = getattr(model, "customer_head", None)
        self.proj = head.proj if isinstance(head, CustomerEmbeddingHead) else torch.nn.Identity()

    def forward(self, hidden: torch.Tensor, txn_mask: torch.Tensor, num_features: int) -> torch.Tensor:
        """``hidden [B, T*F, D]``, ``txn_mask [B, T]`` -> unit vectors ``[B, T, dim]`` (zero vectors for a
        window's first real row under the identity projection)."""
        pooled = prefix_mean(summary_states(hidden, num_features), txn_mask)
        return torch.nn.functional.normalize(self.proj(pooled), dim=-1)


@torch.no_grad()
def score_embed_windows(model, windows: Windows, batch_size: int = 64, device: torch.device | str = "cpu",
                        progress: bool = False) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """``(rows, scores, embeddings [n, dim])`` of each scored row of ``windows`` (each row once), from one
    backbone pass per window: the fraud probability of ``model`` (a ``TransactionFraudModel``: ``encoder``
    and ``fraud_head``) and the :class:`PrefixEmbedding` of the row. The scores equal
    :func:`score_windows`'s."""
    model.eval()
    embed = PrefixEmbedding(model)
    F = windows.ids.shape[2]
    rows_out, scores_out, emb_out = [], [], []
    for batch in _progress(windows, batch_size, device, progress, "scoring + embedding"):
        ids, mask = batch.ids, batch.txn_mask
        hidden = model.encoder.backbone_forward(ids, mask)
        prob = torch.sigmoid(model.fraud_head(hidden, ids, mask, batch.tabular).float()).cpu().numpy()
        emb = embed(hidden, mask, F).float().cpu().numpy()
        keep = batch.scored
        rows_out.append(batch.rows[keep])
        scores_out.append(prob[keep])
        emb_out.append(emb[keep])
    if not rows_out:
        return np.zeros(0, np.int64), np.zeros(0), np.zeros((0, 0), np.float32)
    return np.concatenate(rows_out), np.concatenate(scores_out), np.concatenate(emb_out)


def score_embed_bank(model, bank: Bank, batch_size: int = 64, device="cpu", progress: bool = False,
                     since=None) -> tuple[np.ndarray, np.ndarray]:
    """Scores ``[N]`` and prefix embeddings ``[N, dim]`` (float32) for every row of ``bank`` (or those at
    or after ``since``; NaN elsewhere), streaming."""
    w = bank_windows(model, bank, since)
    rows, scores, emb = score_embed_windows(model, w, batch_size, device, progress)
    out_s = np.full(len(bank.df), np.nan)
    out_e = np.full((len(bank.df), emb.shape[1]), np.nan, np.float32)
    out_s[rows], out_e[rows] = scores, emb
    return out_s, out_e
