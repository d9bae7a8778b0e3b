"""Window-level fraud: one score per window from its summary states.

Pooling over the summary states ``s_t = h[t*F + F - 1]`` of the real transactions: one learned
query ``q`` gives attention weights ``a_t = softmax_t(q . s_t / sqrt(D))`` (padded rows excluded),
and the attention-pooled vector is concatenated with the masked mean:
``u = [sum_t a_t s_t ; mean_t s_t]`` (``2D``) -> ``Linear(2D, D/2) -> SiLU -> Dropout(0.1) ->
Linear(D/2, 1)`` -> one logit per window. The label is 1 when any transaction of the window is a
known fraud (TabFormer's convention), or with ``recent_k`` any of its ``recent_k`` newest real
transactions; loss: BCE with the fraud model's positive weight.

Training data (:func:`training_windows`): windows ending in train with the labels known by its end,
rebalanced like the per-transaction head's; ``pos_weight`` from the window labels. Validation:
:func:`sequence_eval` (window-level PR-AUC).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np
import torch
from torch import nn
from transformers.utils import ModelOutput

from ..data.bank import Bank
from ..data.windows import WindowOptions, Windows, balance_windows
from ..model import TxnEncoderConfig, TxnHeadConfig, TxnHeadModel, txn_mask_from
from .customer import masked_mean, summary_states
from .fraud import IGNORE, WeightedBCE, labelled_scores, positive_upweighting


def check_recent_k(recent_k: int | None) -> None:
    if recent_k is not None and recent_k < 1:
        raise ValueError(f"recent_k must be >= 1 or None, got {recent_k!r}")


class SequenceFraudConfig(TxnHeadConfig):
    """Config of :class:`SequenceFraudModel`: the encoder's fields plus the window head's.

    Args:
        fraud_hidden: hidden width of the MLP (default ``D // 2``).
        fraud_dropout: dropout of the MLP.
        pos_weight: BCE positive weight (set from the training windows' labels).
        sequence_recent_k: a window's label counts fraud among its ``recent_k`` newest transactions
            only (None: any of its transactions).
        freeze_backbone, **kwargs: :class:`~slmlab.transactions.model.TxnHeadConfig`'s.
    """

    model_type = "slmlab_txn_sequence"
    HEAD_FIELDS = ("fraud_hidden", "fraud_dropout", "pos_weight", "sequence_recent_k")

    fraud_hidden: int | None = None
    fraud_dropout: float = 0.1
    pos_weight: float = 1.0
    sequence_recent_k: int | None = None

    def __post_init__(self, **kwargs):
        self.fraud_dropout = float(self.fraud_dropout)
        self.pos_weight = float(self.pos_weight)
        super().__post_init__(**kwargs)
        check_recent_k(self.sequence_recent_k)


def window_labels(labels: torch.Tensor, txn_mask: torch.Tensor, recent_k: int | None = None) -> torch.Tensor:
    """Window labels ``[B]`` from transaction labels ``[B, T]`` (1 fraud, 0 legit, -1 unknown).

    1 if a real transaction of the window (or of its ``recent_k`` newest real transactions) is a
    known fraud; otherwise -100 (ignored) if one of those has an unknown label, else 0.
    """
    labels, txn_mask = torch.as_tensor(labels), torch.as_tensor(txn_mask).bool()
    if labels.shape != txn_mask.shape or labels.dim() != 2:
        raise ValueError(f"labels and txn_mask must both be [B, T], got {tuple(labels.shape)} and {tuple(txn_mask.shape)}")
    check_recent_k(recent_k)
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

    config_class = SequenceFraudConfig

    def __init__(self, config: TxnEncoderConfig) -> None:
        super().__init__(config)
        config = self.config
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


def sequence_labels(ids: torch.Tensor, txn_mask: torch.Tensor, row_labels: torch.Tensor,
                    config: SequenceFraudConfig) -> torch.Tensor:
    """Batch labels ``[B]`` of the window head: :func:`window_labels` with the config's ``recent_k``."""
    return window_labels(row_labels, txn_mask, config.sequence_recent_k)


def training_windows(bank: Bank, T: int, options: WindowOptions, config: dict) -> tuple[dict[str, Windows], dict]:
    """The window head's ``train`` / ``validation`` windows (stride ``T // 2``) and the config values
    they fix: one positive up-weighting (:func:`~.fraud.positive_upweighting`: ``pos_weight`` from the
    labels of the windows ``keep_negative`` keeps, by ``config["sequence_recent_k"]``, or 1 when
    ``fraud_share`` repeats the fraud windows); ``probe``: the training windows before rebalancing. A
    validation (and probe) window's label reads only the rows it scores (the others neutral, 0:
    :meth:`~slmlab.transactions.data.windows.Windows.scored_labels`): never a row before the validation
    period, and each row's fraud in one window."""
    recent_k = config.get("sequence_recent_k")
    check_recent_k(recent_k)
    train_w = bank.windows(T, T // 2, "train", labels=bank.labels(bank.cuts["train_end"]))
    kept = balance_windows(train_w, options.keep_negative, 0.0, options.seed)
    y = window_labels(torch.from_numpy(kept.labels.astype(np.int64)), torch.from_numpy(kept.txn_mask), recent_k)
    fixed = positive_upweighting(options.fraud_share, int((y == 0).sum()), int((y == 1).sum()))
    windows = {"train": balance_windows(train_w, options.keep_negative, options.fraud_share, options.seed),
               "validation": bank.windows(T, T // 2, "validation",
                                          labels=bank.labels(bank.cuts["test_start"])).scored_labels(fill=0),
               "probe": train_w.scored_labels(fill=0)}
    return windows, fixed


def sequence_eval(model: SequenceFraudModel, windows: Windows, batch_size: int = 64) -> dict:
    """Validation loss and window-level PR-AUC of ``model`` over ``windows`` (windows with a label, by
    the model's ``sequence_recent_k``); ``acc`` repeats the PR-AUC (what the harness's ``keep_best``
    selects on)."""
    from sklearn.metrics import average_precision_score

    recent_k = model.config.sequence_recent_k
    y, p, loss = labelled_scores(model, windows, batch_size, lambda b: window_labels(b.labels, b.txn_mask, recent_k))
    pr_auc = float(average_precision_score(y, p)) if y.sum() else math.nan
    return {"loss": loss, "pr_auc": pr_auc, "acc": pr_auc, "windows": len(y),
            "positive_rate": float(y.mean()) if len(y) else math.nan}
