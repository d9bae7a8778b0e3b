"""Customer embeddings: a pooled, L2-normalised vector per window, optionally trained with InfoNCE.

Every transaction ``t`` has a *summary state*, the backbone state at its last field
``p = t*F + F - 1`` (``response_code``): by then the causal backbone has read all of ``t`` and
everything before it. A window's embedding is the masked mean of the summary states of its real
transactions, projected ``Linear(D, dim)`` and L2-normalised:

    z = normalize(W · mean_{t valid} h[t*F + F - 1] + b)

Training (optional) uses InfoNCE (van den Oord et al., "Representation Learning with Contrastive
Predictive Coding", arXiv:1807.03748) on pairs of disjoint windows of one customer: with ``B``
customers in a batch, ``S = z1 z2^T / tau`` and the loss is the mean of the cross-entropies of
``S`` and ``S^T`` against the diagonal (the same customer is the positive, the other ``B - 1``
customers the negatives). Without a trained head, :func:`embed_windows` uses the normalised
masked mean itself (``dim = D``).

Training data (:func:`training_windows`): pairs of adjacent windows of one customer
(:func:`window_pairs`). Validation: :func:`customer_eval` (InfoNCE and pair retrieval top-1).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn
from transformers.utils import ModelOutput

from ..data.bank import Bank
from ..data.windows import WindowOptions, Windows, build_windows
from ..model import TxnEncoderConfig, TxnHeadConfig, TxnHeadModel, encoder_of, txn_mask_from


def summary_states(hidden: torch.Tensor, num_features: int) -> torch.Tensor:
    """``[B, T*F, D]`` -> the summary states ``[B, T, D]`` (positions ``t*F + F - 1``)."""
    return hidden[:, num_features - 1::num_features]


def masked_mean(x: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """Mean of ``x [B, T, D]`` over the rows where ``mask [B, T]`` is True (zero if none)."""
    m = mask.to(x.dtype)[..., None]
    return (x * m).sum(1) / m.sum(1).clamp(min=1.0)


def info_nce(z1: torch.Tensor, z2: torch.Tensor, tau: float = 0.1) -> torch.Tensor:
    """Symmetric InfoNCE of paired embeddings ``z1, z2 [B, d]`` (row ``i`` of both: one customer).

    ``mean(CE(z1 z2^T / tau, diag), CE(z2 z1^T / tau, diag))``; the inputs are expected unit norm.
    """
    if z1.shape != z2.shape or z1.dim() != 2:
        raise ValueError(f"z1 and z2 must both be [B, d], got {tuple(z1.shape)} and {tuple(z2.shape)}")
    if not tau > 0:
        raise ValueError(f"tau must be > 0, got {tau!r}")
    logits = z1.float() @ z2.float().T / tau
    target = torch.arange(len(z1), device=z1.device)
    return 0.5 * (F.cross_entropy(logits, target) + F.cross_entropy(logits.T, target))


class CustomerEmbeddingConfig(TxnHeadConfig):
    """Config of :class:`CustomerEmbeddingModel`: the encoder's fields plus the embedding head's.

    Args:
        customer_dim: embedding size.
        customer_tau: InfoNCE temperature.
        freeze_backbone, **kwargs: :class:`~slmlab.transactions.model.TxnHeadConfig`'s.
    """

    model_type = "slmlab_txn_customer"
    HEAD_FIELDS = ("customer_dim", "customer_tau")

    customer_dim: int = 128
    customer_tau: float = 0.1

    def __post_init__(self, **kwargs):
        given = {name: getattr(self, name) for name in self.HEAD_FIELDS}
        self.customer_dim = int(self.customer_dim)
        self.customer_tau = float(self.customer_tau)
        super().__post_init__(**kwargs)
        if self.customer_dim < 1:
            raise ValueError(f"customer_dim must be >= 1, got {given['customer_dim']!r}")
        if not self.customer_tau > 0:
            raise ValueError(f"customer_tau must be > 0, got {given['customer_tau']!r}")


class CustomerEmbeddingHead(nn.Module):
    """Masked mean of the summary states -> ``Linear(D, dim)`` -> L2 normalisation.

    Args:
        hidden_size: ``D``.
        dim: embedding size.
        num_features: ``F`` (the summary state of ``t`` is at ``t*F + F - 1``).
    """

    def __init__(self, hidden_size: int, dim: int = 128, num_features: int = 15) -> None:
        super().__init__()
        self.num_features = num_features
        self.proj = nn.Linear(hidden_size, dim)

    def forward(self, hidden: torch.Tensor, txn_mask: torch.Tensor) -> torch.Tensor:
        """``hidden [B, T*F, D]``, ``txn_mask [B, T]`` -> unit vectors ``[B, dim]``."""
        pooled = masked_mean(summary_states(hidden, self.num_features), txn_mask)
        return F.normalize(self.proj(pooled), dim=-1)


@dataclass
class CustomerOutput(ModelOutput):
    """``loss`` (InfoNCE, for a pair batch) and ``embeddings`` (``[B, dim]`` or ``[B, 2, dim]``)."""

    loss: torch.Tensor | None = None
    embeddings: torch.Tensor | None = None


class CustomerEmbeddingModel(TxnHeadModel):
    """:class:`TransactionEncoder` (as ``encoder``) + :class:`CustomerEmbeddingHead`.

    ``forward(input_ids)`` with ``[B, T, F]`` ids returns embeddings ``[B, dim]``; with a pair batch
    ``[B, 2, T, F]`` (two disjoint windows per customer) it returns ``[B, 2, dim]`` and the InfoNCE
    loss (config: :class:`CustomerEmbeddingConfig`).
    """

    config_class = CustomerEmbeddingConfig

    def __init__(self, config: TxnEncoderConfig) -> None:
        super().__init__(config)
        config = self.config
        d = config.backbone_config().hidden_size
        self.tau = config.customer_tau
        self.customer_head = CustomerEmbeddingHead(d, config.customer_dim, len(self.encoder.feature_names))
        self._finish_init()

    def embed(self, input_ids: torch.Tensor, attention_mask: torch.Tensor | None = None) -> torch.Tensor:
        """``[B, T, F]`` ids (mask ``[B, T]`` or ``[B, T*F]``) -> ``[B, dim]``."""
        txn_mask = txn_mask_from(input_ids, attention_mask)
        return self.customer_head(self.encoder.backbone_forward(input_ids, txn_mask), txn_mask)

    def forward(self, input_ids: torch.Tensor, attention_mask: torch.Tensor | None = None,
                labels: torch.Tensor | None = None, **kwargs) -> CustomerOutput:
        """Args:
            input_ids: ``[B, T, F]`` (embeddings only) or ``[B, 2, T, F]`` (a pair batch: the loss).
            attention_mask: ``[B, T]`` / ``[B, T*F]``, or ``[B, 2, T]`` / ``[B, 2, T*F]`` for pairs.
            labels: unused (the pairing is the label).
        """
        if input_ids.dim() == 3:
            return CustomerOutput(embeddings=self.embed(input_ids, attention_mask))
        if input_ids.dim() != 4 or input_ids.shape[1] != 2:
            raise ValueError(f"input_ids must be [B, T, F] or a pair batch [B, 2, T, F], got {tuple(input_ids.shape)}")
        B = input_ids.shape[0]
        mask = None if attention_mask is None else attention_mask.reshape(B * 2, -1)
        z = self.embed(input_ids.reshape(B * 2, *input_ids.shape[2:]), mask).view(B, 2, -1)
        return CustomerOutput(loss=info_nce(z[:, 0], z[:, 1], self.tau), embeddings=z)


@torch.no_grad()
def embed_windows(model, ids: torch.Tensor, txn_mask: torch.Tensor | None = None) -> torch.Tensor:
    """Customer embeddings of windows ``ids [B, T, F]`` (``txn_mask [B, T]``, default: non-PAD rows).

    A model with a trained customer head (:class:`CustomerEmbeddingModel`) uses it (``[B, dim]``);
    any other transaction model (an encoder, a fraud model) gives the L2-normalised masked mean of
    its summary states (``[B, D]``).
    """
    was = model.training
    model.eval()
    try:
        head = getattr(model, "customer_head", None)
        enc = encoder_of(model)
        mask = txn_mask_from(ids, txn_mask)
        hidden = enc.backbone_forward(ids, mask)
        if isinstance(head, CustomerEmbeddingHead):
            return head(hidden, mask)
        return F.normalize(masked_mean(summary_states(hidden, ids.shape[-1]), mask), dim=-1)
    finally:
        model.train(was)


def window_pairs(bank: Bank, T: int, split: str) -> Windows:
    """Pairs of disjoint, adjacent windows of one customer: a :class:`~slmlab.transactions.data.windows.Windows`
    whose arrays have a pair axis (``ids [N, 2, T, F]``, older window first).

    ``train``: the customer's history up to the end of train (held-out customers excluded) cut into
    back-to-back windows of ``T`` from the newest transaction, paired without reuse (each window in at
    most one pair). ``validation``: per customer, the newest two windows ending at the end of
    validation, kept when the newer one holds a validation transaction.
    """
    cuts = bank.cuts
    if split not in ("train", "validation"):
        raise ValueError(f"split must be 'train' or 'validation', got {split!r}")
    enc = bank.encoded()
    if split == "train":
        enc = {c: v for c, v in enc.items() if c not in bank.holdout}
        hi, lo = bank.count_before(cuts["train_end"]), None
    else:
        hi, lo = bank.count_before(cuts["val_end"]), bank.count_before(cuts["val_start"])
    starts = bank.starts
    w = build_windows(enc, T, T, row_offsets=starts, max_end=hi)
    cust = bank.df["customer_id"].astype(str).to_numpy()[w.rows[:, -1]] if len(w) else np.zeros(0, str)
    pairs = []
    i = len(w) - 1
    while i > 0:  # newest first; each window in at most one pair
        if cust[i] == cust[i - 1]:
            newest = i + 1 == len(w) or cust[i + 1] != cust[i]
            if split == "train":
                pairs.append((i - 1, i))
            elif newest and w.rows[i, -1] - starts[cust[i]] + 1 > lo.get(cust[i], 0):
                pairs.append((i - 1, i))
            i -= 2
        else:
            i -= 1
    return w.take(np.asarray(sorted(pairs), np.int64).reshape(-1, 2))


def pair_labels(ids: torch.Tensor, txn_mask: torch.Tensor, row_labels: torch.Tensor,
                config: CustomerEmbeddingConfig | None = None) -> torch.Tensor:
    """Batch labels of the customer head: unused zeros ``[B]`` (the pairing is the label)."""
    return torch.zeros(len(ids), dtype=torch.long)


def training_windows(bank: Bank, T: int, options: WindowOptions, config: dict) -> tuple[dict[str, Windows], dict]:
    """The customer head's ``train`` / ``validation`` pair windows (:func:`window_pairs`)."""
    return {split: window_pairs(bank, T, split) for split in ("train", "validation")}, {}


@torch.no_grad()
def customer_eval(model, pairs: Windows, batch_size: int = 64) -> dict:
    """InfoNCE over validation pairs (in batches of ``batch_size``, as in training) and retrieval
    top-1 over all of them: the share of first windows whose nearest second window (cosine) is the
    same customer's. ``acc`` repeats the retrieval top-1."""
    device = next(model.parameters()).device
    z1, z2 = [], []
    for batch in pairs.batches(batch_size, device):
        z1.append(embed_windows(model, batch.ids[:, 0], batch.txn_mask[:, 0]))
        z2.append(embed_windows(model, batch.ids[:, 1], batch.txn_mask[:, 1]))
    tau = float(getattr(model.config, "customer_tau", 0.1))
    losses = [float(info_nce(a, b, tau)) * len(a) for a, b in zip(z1, z2)]
    a, b = torch.cat(z1), torch.cat(z2)
    top1 = float(((a @ b.T).argmax(1) == torch.arange(len(a), device=device)).float().mean())
    return {"loss": sum(losses) / max(len(a), 1), "retrieval_top1": top1, "acc": top1, "pairs": len(a),
            "chance": 1.0 / max(len(a), 1)}
