"""Pretraining validation: per-feature cross-entropy and accuracy of the encoder's next-token heads,
each beside two unigram baselines (the training unigram and the customer-history unigram)."""

from __future__ import annotations

import numpy as np
import torch

from ..data.schema import MASK, PAD
from ..data.windows import Windows


def head_targets(ids: torch.Tensor, txn_mask: torch.Tensor, g: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Targets of head ``g``, their validity and the transaction index each target lies in."""
    T = ids.shape[1]
    if g == 0:
        tgt, valid, t = ids[:, 1:, 0], txn_mask[:, 1:] & txn_mask[:, :-1], torch.arange(1, T)
    else:
        tgt, valid, t = ids[:, :, g], txn_mask, torch.arange(T)
    return tgt, valid & (tgt != PAD) & (tgt != MASK), t


def unigram_counts(windows: Windows, vocab_sizes: list[int]) -> list[np.ndarray]:
    """Training-set counts of every feature's ids (real rows only)."""
    real = windows.ids[windows.txn_mask]
    return [np.bincount(real[:, g], minlength=v).astype(np.float64) for g, v in enumerate(vocab_sizes)]


@torch.no_grad()
def pretrain_report(model, windows: Windows, train_counts: list[np.ndarray], batch_size: int = 64,
                    device: torch.device | str = "cpu") -> dict:
    """Validation CE and accuracy per feature, with (a) the training unigram and (b) the
    customer-history unigram (add-one counts of the feature in the window's earlier rows) as baselines.
    Only the positions each window scores count (:attr:`~slmlab.transactions.data.windows.Windows.scored`):
    every row of the windows' period once, never an earlier row the window holds as context (a validation
    window's early rows lie in the training period the encoder was fitted on).

    Returns a flat dict: ``loss`` (feature-balanced CE), ``ce/<name>``, ``acc/<name>``,
    ``unigram/<name>``, ``history/<name>``.
    """
    names = model.feature_names
    nf = len(names)
    vs = [len(c) for c in train_counts]
    log_uni = [torch.log(torch.from_numpy((c + 1) / (c.sum() + len(c)))).float() for c in train_counts]
    sums = {k: np.zeros(nf) for k in ("ce", "acc", "uni", "hist", "n")}
    was_training = model.training
    model.eval()
    for batch in windows.batches(batch_size, device):
        ids, mask = batch.ids, batch.txn_mask
        scored = torch.from_numpy(batch.scored).to(mask.device)
        hidden = model.backbone_forward(ids, mask)
        logits = model.lm_heads.forward_targets(hidden)
        for g in range(nf):
            tgt, valid, t = head_targets(ids, mask, g)
            valid = valid & scored[:, t]
            lp = torch.log_softmax(logits[g].float(), -1)
            ce = -lp.gather(-1, tgt.long()[..., None])[..., 0]
            sums["ce"][g] += float(ce[valid].sum())
            sums["acc"][g] += float(((lp.argmax(-1) == tgt) & valid).sum())
            sums["uni"][g] += float(-log_uni[g].to(device)[tgt.long()][valid].sum())
            onehot = torch.nn.functional.one_hot(ids[:, :, g].long(), vs[g]).float() * mask[..., None]
            onehot[..., PAD] = 0
            hist = torch.cumsum(onehot, 1) - onehot  # counts over earlier rows
            hist = hist[:, t]
            p = (hist.gather(-1, tgt.long()[..., None])[..., 0] + 1) / (hist.sum(-1) + vs[g])
            sums["hist"][g] += float(-torch.log(p)[valid].sum())
            sums["n"][g] += float(valid.sum())
    model.train(was_training)
    n = np.maximum(sums["n"], 1)
    out = {"loss": float(np.mean((sums["ce"] / n)[sums["n"] > 0]))}
    for g, name in enumerate(names):
        out[f"ce/{name}"] = float(sums["ce"][g] / n[g])
        out[f"acc/{name}"] = float(sums["acc"][g] / n[g])
        out[f"unigram/{name}"] = float(sums["uni"][g] / n[g])
        out[f"history/{name}"] = float(sums["hist"][g] / n[g])
    return out
