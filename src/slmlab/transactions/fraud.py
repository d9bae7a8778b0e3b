"""The per-transaction fraud head and the fine-tuning model around the encoder.

The head reads the backbone state at ``p = t*F + score_index`` (``auth_method``): by then the model
has seen every field of transaction ``t`` except its own ``response_code`` (the issuer's decision,
which in real-time scoring comes after the score) and all earlier transactions. MLP
``Linear(D, D/2) -> SiLU -> Dropout -> Linear(D/2, 1)``; loss BCE with
``pos_weight = min(30, sqrt(neg / pos))``, or the focal loss (the same weighted BCE scaled by
``(1 - p_t) ** gamma``, so confidently right transactions contribute little; Lin et al., "Focal Loss
for Dense Object Detection", arXiv:1708.02002). ``freeze_backbone`` (linear-probe mode) freezes the
embedding and the backbone at construction. The config's ``fraud_head_inputs`` chooses the head once:
``state`` (this MLP on the state), ``surprisal`` or ``both`` (:class:`SurprisalFraudHead`: the
pretrained heads' surprisal of each field before the score field, alone or with the state).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import nn
from transformers.utils import ModelOutput

from .model import TransactionEncoder, TxnEncoderConfig, TxnHeadModel, txn_mask_from
from .surprisal import HEAD_INPUTS, SurprisalFraudHead

IGNORE = -100


def pos_weight_from_counts(neg: int, pos: int, cap: float = 30.0) -> float:
    """``min(cap, sqrt(neg / pos))`` (1 when there are no positives)."""
    return 1.0 if pos <= 0 else float(min(cap, math.sqrt(max(neg, 1) / pos)))


class WeightedBCE(nn.Module):
    """Per-transaction BCE with a positive weight: ``[B, T]`` logits and 0/1 targets -> ``[B, T]``."""

    def __init__(self, pos_weight: float) -> None:
        super().__init__()
        self.pos_weight = float(pos_weight)

    def forward(self, logits: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
        pw = torch.tensor(self.pos_weight, dtype=torch.float32, device=logits.device)
        return F.binary_cross_entropy_with_logits(logits.float(), target.float(), pos_weight=pw, reduction="none")


class FocalLoss(WeightedBCE):
    """Focal loss: the weighted BCE times ``(1 - p_t) ** gamma``, ``p_t`` the probability given to
    the true class (``gamma = 0`` is :class:`WeightedBCE`)."""

    def __init__(self, pos_weight: float, gamma: float = 2.0) -> None:
        super().__init__(pos_weight)
        self.gamma = float(gamma)

    def forward(self, logits: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
        z, y = logits.float(), target.float()
        log_pt = -F.binary_cross_entropy_with_logits(z, y, reduction="none")  # log p_t, stable
        return super().forward(logits, target) * (1 - log_pt.exp()).pow(self.gamma)


def fraud_loss_from_config(config) -> nn.Module:
    """The config's fraud loss: ``bce`` -> :class:`WeightedBCE`, ``focal`` -> :class:`FocalLoss`."""
    if config.fraud_loss == "focal":
        return FocalLoss(config.pos_weight, config.focal_gamma)
    return WeightedBCE(config.pos_weight)


class TransactionFraudHead(nn.Module):
    """MLP on the score-position state of each transaction.

    Args:
        hidden_size: ``D``; inner: MLP width (default ``D // 2``); dropout: after the SiLU.
        score_index: feature position whose state is read; num_features: ``F``.
    """

    def __init__(self, hidden_size: int, score_index: int, num_features: int, inner: int | None = None,
                 dropout: float = 0.1) -> None:
        super().__init__()
        self.score_index, self.num_features = score_index, num_features
        inner = inner or hidden_size // 2
        self.mlp = nn.Sequential(nn.Linear(hidden_size, inner), nn.SiLU(), nn.Dropout(dropout), nn.Linear(inner, 1))

    def forward(self, hidden: torch.Tensor, ids: torch.Tensor | None = None,
                txn_mask: torch.Tensor | None = None) -> torch.Tensor:
        """``[B, T*F, D]`` -> logits ``[B, T]`` (``ids`` and ``txn_mask`` are not needed)."""
        return self.mlp(hidden[:, self.score_index::self.num_features]).squeeze(-1)


@dataclass
class FraudOutput(ModelOutput):
    loss: torch.Tensor | None = None
    logits: torch.Tensor | None = None


def fraud_head_from_config(config, encoder: TransactionEncoder) -> nn.Module:
    """The config's fraud head: ``fraud_head_inputs`` ``state`` (default) -> :class:`TransactionFraudHead`,
    ``surprisal`` / ``both`` -> :class:`SurprisalFraudHead` (``fraud_hidden`` 0: logistic, default 16)."""
    inputs = getattr(config, "fraud_head_inputs", "state")
    if inputs not in HEAD_INPUTS:
        raise ValueError(f"fraud_head_inputs must be one of {HEAD_INPUTS}, got {inputs!r}")
    d, nf = config.backbone_config().hidden_size, len(encoder.feature_names)
    if inputs == "state":
        return TransactionFraudHead(d, encoder.score_index, nf, config.fraud_hidden, config.fraud_dropout)
    inner = 16 if config.fraud_hidden is None else config.fraud_hidden
    return SurprisalFraudHead(encoder.lm_heads, encoder.embedding.vocab_sizes, d, encoder.score_index, nf, inputs,
                              inner, config.fraud_dropout)


class TransactionFraudModel(TxnHeadModel):
    """:class:`TransactionEncoder` (as ``encoder``) + :class:`TransactionFraudHead`.

    ``forward(input_ids [B,T,F], attention_mask, labels [B,T] in {0, 1, -100})`` -> logits ``[B, T]``.
    """

    def __init__(self, config: TxnEncoderConfig) -> None:
        super().__init__(config)
        self.encoder = TransactionEncoder(config)
        self.fraud_head = fraud_head_from_config(config, self.encoder)
        self.loss_fn = fraud_loss_from_config(config)
        self._finish_init()

    def forward(self, input_ids: torch.Tensor, attention_mask: torch.Tensor | None = None,
                labels: torch.Tensor | None = None, **kwargs) -> FraudOutput:
        txn_mask = txn_mask_from(input_ids, attention_mask)
        logits = self.fraud_head(self.encoder.backbone_forward(input_ids, txn_mask), input_ids, txn_mask)
        loss = None
        if labels is not None:
            valid = (labels != IGNORE) & txn_mask
            per_txn = self.loss_fn(logits, labels.clamp(min=0))
            loss = (per_txn * valid).sum() / valid.sum().clamp(min=1)
        return FraudOutput(loss=loss, logits=logits)
