"""Window-level fraud: one score per window from its summary states.

Pooling over the summary states ``s_t = h[t*F + F - 1]`` of the real transactions: one learned
query ``q`` gives attention weights ``a_t = softmax_t(q . s_t / sqrt(D))`` (padded rows excluded),
and the attention-pooled vector is concatenated with the masked mean:
``u = [sum_t a_t s_t ; mean_t s_t]`` (``2D``) -> ``Linear(2D, D/2) -> SiLU -> Dropout(0.1) ->
Linear(D/2, 1)`` -> one logit per window. The label is 1 when any transaction of the window is a
known fraud (TabFormer's convention), or with ``recent_k`` any of its ``recent_k`` newest real
transactions; loss: BCE with the fraud model's positive weight.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch
from torch import nn
from transformers.utils import ModelOutput

from .customer import masked_mean, summary_states
from .fraud import IGNORE, WeightedBCE
from .model import TransactionEncoder, TxnEncoderConfig, TxnHeadModel, txn_mask_from


def window_labels(labels: torch.Tensor, txn_mask: torch.Tensor, recent_k: int | None = None) -> torch.Tensor:
    """Window labels ``[B]`` from transaction labels ``[B, T]`` (1 fraud, 0 legit, -1 unknown).

    1 if a real transaction of the window (or of its ``recent_k`` newest real transactions) is a
    known fraud; otherwise -100 (ignored) if one of those has an unknown label, else 0.
    """
    labels, txn_mask = torch.as_tensor(labels), torch.as_tensor(txn_mask).bool()
    if labels.shape != txn_mask.shape or labels.dim() != 2:
        raise ValueError(f"labels and txn_mask must both be [B, T], got {tuple(labels.shape)} and {tuple(txn_mask.shape)}")
    if recent_k is not None and recent_k < 1:
        raise ValueError(f"recent_k must be >= 1 or None, got {recent_k!r}")
    counted = txn_mask
    if recent_k is not None:
        from_end = txn_mask.flip(1).long().cumsum(1).flip(1)  # 1 = the newest real transaction
        counted = txn_mask & (from_end <= recent_k)
    fraud = ((labels == 1) & counted).any(1)
    unknown = ((labels < 0) & counted).any(1)
    out = torch.zeros(labels.shape[0], dtype=torch.long, device=labels.device)
    out[unknown] = IGNORE
    out[fraud] = 1
    return out


class SequenceFraudHead(nn.Module):
    """Learned-query attention pooling + masked mean over the summary states -> MLP -> logit.

    Args:
        hidden_size: ``D``; num_features: ``F``; inner: MLP width (default ``D // 2``);
        dropout: after the SiLU.
    """

    def __init__(self, hidden_size: int, num_features: int = 15, inner: int | None = None,
                 dropout: float = 0.1) -> None:
        super().__init__()
        self.num_features = num_features
        self.query = nn.Parameter(torch.zeros(hidden_size))
        inner = inner or hidden_size // 2
        self.mlp = nn.Sequential(nn.Linear(2 * hidden_size, inner), nn.SiLU(), nn.Dropout(dropout),
                                 nn.Linear(inner, 1))

    def forward(self, hidden: torch.Tensor, txn_mask: torch.Tensor) -> torch.Tensor:
        """``hidden [B, T*F, D]``, ``txn_mask [B, T]`` -> logits ``[B]``."""
        states = summary_states(hidden, self.num_features)
        scores = (states @ self.query) / math.sqrt(states.shape[-1])
        weights = torch.softmax(scores.masked_fill(~txn_mask.bool(), float("-inf")), -1).nan_to_num(0.0)
        pooled = (weights[..., None] * states).sum(1)
        return self.mlp(torch.cat([pooled, masked_mean(states, txn_mask)], -1)).squeeze(-1)


@dataclass
class SequenceOutput(ModelOutput):
    loss: torch.Tensor | None = None
    logits: torch.Tensor | None = None


class SequenceFraudModel(TxnHeadModel):
    """:class:`TransactionEncoder` (as ``encoder``) + :class:`SequenceFraudHead`.

    ``forward(input_ids [B,T,F], attention_mask, labels [B] in {0, 1, -100})`` -> logits ``[B]``;
    the loss is the BCE (``config.pos_weight``) over windows with a label.
    """

    def __init__(self, config: TxnEncoderConfig) -> None:
        super().__init__(config)
        self.encoder = TransactionEncoder(config)
        d = config.backbone_config().hidden_size
        self.sequence_head = SequenceFraudHead(d, len(self.encoder.feature_names), config.fraud_hidden,
                                               config.fraud_dropout)
        self.loss_fn = WeightedBCE(config.pos_weight)
        self._finish_init()

    def forward(self, input_ids: torch.Tensor, attention_mask: torch.Tensor | None = None,
                labels: torch.Tensor | None = None, **kwargs) -> SequenceOutput:
        txn_mask = txn_mask_from(input_ids, attention_mask)
        logits = self.sequence_head(self.encoder.backbone_forward(input_ids, txn_mask), txn_mask)
        loss = None
        if labels is not None:
            valid = labels != IGNORE
            per = self.loss_fn(logits, labels.clamp(min=0))
            loss = (per * valid).sum() / valid.sum().clamp(min=1)
        return SequenceOutput(loss=loss, logits=logits)


@torch.no_grad()
def sequence_eval(model: SequenceFraudModel, windows, recent_k: int | None = None, batch_size: int = 64) -> dict:
    """Validation loss and window-level PR-AUC of ``model`` over ``windows`` (windows with a label);
    ``acc`` repeats the PR-AUC (what the harness's ``keep_best`` selects on)."""
    import numpy as np
    from sklearn.metrics import average_precision_score

    device = next(model.parameters()).device
    was = model.training
    model.eval()
    ys, ps, loss_sum, n = [], [], 0.0, 0
    for s in range(0, len(windows), batch_size):
        ids = torch.from_numpy(windows.ids[s:s + batch_size]).to(device)
        mask = torch.from_numpy(windows.txn_mask[s:s + batch_size]).to(device)
        lab = window_labels(torch.from_numpy(windows.labels[s:s + batch_size].astype(np.int64)), mask.cpu(),
                            recent_k).to(device)
        out = model(input_ids=ids, attention_mask=mask, labels=lab)
        valid = lab != IGNORE
        k = int(valid.sum())
        loss_sum += float(out.loss) * k
        n += k
        ys.append(lab[valid].cpu().numpy())
        ps.append(out.logits[valid].float().cpu().numpy())
    model.train(was)
    y, p = np.concatenate(ys), np.concatenate(ps)
    pr_auc = float(average_precision_score(y, p)) if y.sum() else math.nan
    return {"loss": loss_sum / max(n, 1), "pr_auc": pr_auc, "acc": pr_auc, "windows": n,
            "positive_rate": float(y.mean()) if len(y) else math.nan}
