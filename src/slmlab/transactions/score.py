"""Streaming scoring: every transaction scored exactly once, with up to ``T - 1`` earlier ones.

Windows of ``T`` end at the customer's newest transaction and step back by ``T // 2``; each window
scores only its newest ``T // 2`` rows (its oldest window: all of its rows), so every transaction
gets one score and at least ``T // 2`` rows of history once the customer has that many.
"""

from __future__ import annotations

import numpy as np
import torch

from ._deps import pd
from .data import Bank
from .windows import Windows, build_windows


@torch.no_grad()
def score_windows(model, windows: Windows, batch_size: int = 64, device: torch.device | str = "cpu",
                  progress: bool = False) -> tuple[np.ndarray, np.ndarray]:
    """``(rows, scores)``: the fraud probability of each scored row of ``windows`` (each row once)."""
    model.eval()
    rows_out, scores_out = [], []
    T = windows.ids.shape[1]
    pos = np.arange(T)
    starts = range(0, len(windows), batch_size)
    if progress:
        from tqdm.auto import tqdm

        starts = tqdm(starts, desc="scoring", unit="batch")
    for s in starts:
        ids = torch.from_numpy(windows.ids[s:s + batch_size]).to(device)
        mask = torch.from_numpy(windows.txn_mask[s:s + batch_size]).to(device)
        prob = torch.sigmoid(model(input_ids=ids, attention_mask=mask).logits.float()).cpu().numpy()
        keep = (pos[None, :] >= windows.score_from[s:s + batch_size, None]) & windows.txn_mask[s:s + batch_size]
        rows_out.append(windows.rows[s:s + batch_size][keep])
        scores_out.append(prob[keep])
    if not rows_out:
        return np.zeros(0, np.int64), np.zeros(0)
    return np.concatenate(rows_out), np.concatenate(scores_out)


def score_bank(model, bank: Bank, since=None, batch_size: int = 64, device="cpu", progress: bool = False) -> np.ndarray:
    """Scores ``[N]`` for the rows of ``bank`` at or after ``since`` (NaN elsewhere)."""
    T = model.config.max_transactions
    enc = bank.encoded()
    lo = bank.count_before(since) if since is not None else None
    w = build_windows(enc, T, T // 2, row_offsets=bank.starts, min_end=lo)
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
