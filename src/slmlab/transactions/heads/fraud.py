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
pretrained heads' surprisal of each field before the score field, alone or with the state); a config
naming ``tabular_features`` chooses the joint-fusion head instead (:class:`~.joint.JointFraudHead`: the
state together with the transaction's rolling features, trained end to end).

Training data (:func:`training_windows`): windows ending in train with the labels known by the end of
train (optionally only a seeded share of the customers labelled), rebalanced by
:func:`~slmlab.transactions.data.windows.balance_windows`; one positive up-weighting
(:func:`positive_upweighting`: fraud-window repetition, or ``pos_weight`` counted over the rows of the
kept windows, never both). Validation: :func:`fraud_eval` (PR-AUC on the labels known by the start of test).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn
from transformers.utils import ModelOutput

from ..data.bank import Bank, label_customers, labelled_split, windows_of_customers
from ..data.features import tabular_table
from ..data.windows import WindowOptions, Windows, balance_windows
from ..model import TransactionEncoder, TxnEncoderConfig, TxnHeadConfig, TxnHeadModel, txn_mask_from
from .joint import JointFraudHead, fit_normaliser
from .surprisal import HEAD_INPUTS, SurprisalFraudHead
from .wide import WIDE_CHOICES, WideFraudHead, fit_row_logistic

IGNORE = -100
FRAUD_LOSSES = ("bce", "focal")
TABULAR_CHOICES = ("none", "rolling")


class TransactionFraudConfig(TxnHeadConfig):
    """Config of :class:`TransactionFraudModel`: the encoder's fields plus the fraud head's.

    Args:
        fraud_hidden: hidden width of the fraud MLP (default ``D // 2``; surprisal inputs: 16, 0 = a
            logistic head).
        fraud_dropout: dropout of the fraud MLP.
        pos_weight: BCE positive weight (set from the training labels).
        fraud_loss: ``bce`` (weighted binary cross-entropy) or ``focal`` (the same, scaled by
            ``(1 - p_t) ** focal_gamma``; Lin et al., "Focal Loss for Dense Object Detection",
            arXiv:1708.02002).
        focal_gamma: the focusing exponent of the focal loss (``>= 0``; 0 is plain weighted BCE).
        fraud_head_inputs: ``state``, ``surprisal`` or ``both`` (see the module docstring).
        fraud_tabular: ``none`` or ``rolling``: fine-tuning fuses the rolling features (joint fusion); it
            fills the three fields below from the training rows.
        fraud_wide: ``none`` or ``tokens``: wide & deep (:class:`~.wide.WideFraudHead`): a linear term on
            the one-hot tokens of the transaction's own fields is added to the head's logit, and
            fine-tuning starts it from the per-row logistic regression (``token_lr``) fitted on the
            training rows, with the deep head's output layer at 0 at the start.
        tabular_features, tabular_center, tabular_scale: the fused features' names and normaliser
            (:class:`~.joint.JointFraudHead`); None = no fusion.
        freeze_backbone, **kwargs: :class:`~slmlab.transactions.model.TxnHeadConfig`'s.
    """

    model_type = "slmlab_txn_fraud"
    HEAD_FIELDS = ("fraud_hidden", "fraud_dropout", "pos_weight", "fraud_loss", "focal_gamma", "fraud_head_inputs",
                   "fraud_tabular", "tabular_features", "tabular_center", "tabular_scale", "fraud_wide")

    fraud_hidden: int | None = None
    fraud_dropout: float = 0.1
    pos_weight: float = 1.0
    fraud_loss: str = "bce"
    focal_gamma: float = 2.0
    fraud_head_inputs: str = "state"
    fraud_tabular: str = "none"
    tabular_features: list[str] | None = None
    tabular_center: list[float] | None = None
    tabular_scale: list[float] | None = None
    fraud_wide: str = "none"

    def __post_init__(self, **kwargs):
        given = {name: getattr(self, name) for name in self.HEAD_FIELDS}
        self.fraud_dropout = float(self.fraud_dropout)
        self.pos_weight = float(self.pos_weight)
        self.fraud_loss = str(self.fraud_loss)
        self.focal_gamma = float(self.focal_gamma)
        self.fraud_head_inputs = str(self.fraud_head_inputs)
        self.fraud_tabular = str(self.fraud_tabular)
        self.fraud_wide = str(self.fraud_wide)
        if self.tabular_features is not None:
            self.tabular_features = [str(n) for n in self.tabular_features]
        if self.tabular_center is not None:
            self.tabular_center = [float(v) for v in self.tabular_center]
        if self.tabular_scale is not None:
            self.tabular_scale = [float(v) for v in self.tabular_scale]
        super().__post_init__(**kwargs)
        self._check(given)

    def to_dict(self) -> dict:
        """transformers' dict of the config, without ``fraud_wide`` at its default ``none`` (a field added after
        configs were saved: a config without wide & deep saves the JSON it saved before)."""
        out = super().to_dict()
        if out.get("fraud_wide") == "none":
            out.pop("fraud_wide")
        return out

    def _check(self, given: dict) -> None:
        """The head's checks, on the normalised fields; a message shows the value as ``given``."""
        if self.fraud_tabular not in TABULAR_CHOICES:
            raise ValueError(f"fraud_tabular must be one of {TABULAR_CHOICES}, got {given['fraud_tabular']!r}")
        if self.tabular_features is not None:
            k = len(self.tabular_features)
            if self.fraud_head_inputs != "state":
                raise ValueError("joint fusion (tabular features) reads the state; use fraud_head_inputs='state'")
            if len(self.tabular_center or ()) != k or len(self.tabular_scale or ()) != k:
                raise ValueError(f"tabular_center and tabular_scale need one value per tabular feature ({k})")
        if self.fraud_wide not in WIDE_CHOICES:
            raise ValueError(f"fraud_wide must be one of {WIDE_CHOICES}, got {given['fraud_wide']!r}")
        if self.fraud_loss not in FRAUD_LOSSES:
            raise ValueError(f"fraud_loss must be 'bce' or 'focal', got {given['fraud_loss']!r}")
        if not self.focal_gamma >= 0:
            raise ValueError(f"focal_gamma must be >= 0, got {given['focal_gamma']!r}")
        if self.fraud_head_inputs not in HEAD_INPUTS:
            raise ValueError(f"fraud_head_inputs must be one of {HEAD_INPUTS}, got {given['fraud_head_inputs']!r}")


def pos_weight_from_counts(neg: int, pos: int, cap: float = 30.0) -> float:
    """``min(cap, sqrt(neg / pos))`` (1 when there are no positives)."""
    return 1.0 if pos <= 0 else float(min(cap, math.sqrt(max(neg, 1) / pos)))


def positive_upweighting(fraud_share: float, neg: int, pos: int) -> dict:
    """One positive up-weighting, never two: with ``fraud_share > 0`` the fraud windows are repeated
    (:func:`~slmlab.transactions.data.windows.balance_windows`) and ``pos_weight`` is 1; without it,
    ``pos_weight = min(30, sqrt(neg / pos))`` over the labels the loss sees. Returns the config values."""
    if fraud_share > 0:
        return {"pos_weight": 1.0}
    return {"pos_weight": pos_weight_from_counts(neg, pos)}


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
                txn_mask: torch.Tensor | None = None, tabular: torch.Tensor | None = None) -> torch.Tensor:
        """``[B, T*F, D]`` -> logits ``[B, T]`` (``ids``, ``txn_mask`` and ``tabular`` are not needed)."""
        return self.mlp(hidden[:, self.score_index::self.num_features]).squeeze(-1)


@dataclass
class FraudOutput(ModelOutput):
    loss: torch.Tensor | None = None
    logits: torch.Tensor | None = None


def fraud_head_from_config(config: TransactionFraudConfig, encoder: TransactionEncoder) -> nn.Module:
    """The config's fraud head: ``fraud_head_inputs`` ``state`` (default) -> :class:`TransactionFraudHead`,
    ``surprisal`` / ``both`` -> :class:`SurprisalFraudHead` (``fraud_hidden`` 0: logistic, default 16);
    ``tabular_features`` -> :class:`~.joint.JointFraudHead`; ``fraud_wide: tokens`` wraps the head in
    :class:`~.wide.WideFraudHead`."""
    deep = _deep_fraud_head(config, encoder)
    if config.fraud_wide == "tokens":
        return WideFraudHead(deep, encoder.embedding.vocab_sizes, encoder.score_index)
    return deep


def _deep_fraud_head(config: TransactionFraudConfig, encoder: TransactionEncoder) -> nn.Module:
    inputs = config.fraud_head_inputs
    d, nf = config.backbone_config().hidden_size, len(encoder.feature_names)
    if config.tabular_features is not None:
        return JointFraudHead(d, encoder.score_index, nf, config.tabular_center, config.tabular_scale,
                              config.fraud_hidden, config.fraud_dropout)
    if inputs == "state":
        return TransactionFraudHead(d, encoder.score_index, nf, config.fraud_hidden, config.fraud_dropout)
    inner = 16 if config.fraud_hidden is None else config.fraud_hidden
    return SurprisalFraudHead(encoder.lm_heads, encoder.embedding.vocab_sizes, d, encoder.score_index, nf, inputs,
                              inner, config.fraud_dropout)


def warm_start(model: TransactionFraudModel, bank: Bank, options: WindowOptions) -> dict:
    """Before fine-tuning: a wide & deep head's linear term gets the per-row logistic regression fitted on
    the training rows the head may learn from (labels known by the end of train; with ``label_fraction``
    < 1 only the labelled customers'), ``C`` chosen on validation. Returns the fit's info ({} for the
    other heads, which start as initialised)."""
    if not isinstance(model.fraud_head, WideFraudHead):
        return {}
    tr_rows, y_tr, va_rows, y_va = labelled_split(bank)
    if options.label_fraction < 1:
        keep = np.isin(bank.df["customer_id"].astype(str).to_numpy()[tr_rows], list(labelled_customers(bank, options)))
        tr_rows, y_tr = tr_rows[keep], y_tr[keep]
    k = model.encoder.score_index
    fit = fit_row_logistic(np.asarray(bank.ids[:, :k + 1]), tr_rows, y_tr, va_rows, y_va)
    model.fraud_head.load_logistic(fit)
    return fit.info


class TransactionFraudModel(TxnHeadModel):
    """:class:`TransactionEncoder` (as ``encoder``) + :class:`TransactionFraudHead` (or
    :class:`SurprisalFraudHead`, by ``config.fraud_head_inputs``).

    ``forward(input_ids [B,T,F], attention_mask, labels [B,T] in {0, 1, -100}, tabular [B,T,K])`` ->
    logits ``[B, T]`` (``tabular``: the joint-fusion head's rolling features; the other heads ignore it).
    """

    config_class = TransactionFraudConfig
    extra_forward_inputs = ("tabular",)  # what the harness passes on from a batch that carries it

    def __init__(self, config: TxnEncoderConfig) -> None:
        super().__init__(config)
        config = self.config
        self.fraud_head = fraud_head_from_config(config, self.encoder)
        self.loss_fn = fraud_loss_from_config(config)
        self._finish_init()
        if isinstance(self.fraud_head, WideFraudHead):  # the weight init above drew its deep output layer
            self.fraud_head.zero_deep_output()

    def forward(self, input_ids: torch.Tensor, attention_mask: torch.Tensor | None = None,
                labels: torch.Tensor | None = None, tabular: torch.Tensor | None = None, **kwargs) -> FraudOutput:
        txn_mask = txn_mask_from(input_ids, attention_mask)
        logits = self.fraud_head(self.encoder.backbone_forward(input_ids, txn_mask), input_ids, txn_mask, tabular)
        loss = None
        if labels is not None:
            valid = (labels != IGNORE) & txn_mask
            per_txn = self.loss_fn(logits, labels.clamp(min=0))
            loss = (per_txn * valid).sum() / valid.sum().clamp(min=1)
        return FraudOutput(loss=loss, logits=logits)


def transaction_labels(ids: torch.Tensor, txn_mask: torch.Tensor, row_labels: torch.Tensor,
                       config: TransactionFraudConfig | None = None) -> torch.Tensor:
    """Batch labels ``[B, T]`` of the per-transaction fraud head: each real row's label where known,
    else :data:`IGNORE` (padded rows, labels not yet available)."""
    return torch.where(txn_mask & (row_labels >= 0), row_labels, torch.full_like(row_labels, IGNORE))


def labelled_customers(bank: Bank, options: WindowOptions) -> set[str]:
    """The training customers whose labels fine-tuning may read: a seeded ``options.label_fraction`` of those
    with a training-period row (held-out customers excluded; all of them at fraction 1)."""
    customers = bank.df["customer_id"].astype(str)[bank.period_mask(None, bank.cuts["train_end"])]
    return label_customers(set(customers) - {str(c) for c in bank.holdout}, options.label_fraction, options.seed)


def training_windows(bank: Bank, T: int, options: WindowOptions, config: dict) -> tuple[dict[str, Windows], dict]:
    """The per-transaction fraud head's ``train`` / ``validation`` windows (stride ``T // 2``) and the
    config values they fix (``pos_weight``).

    Train: windows ending in the training period with the labels known by its end. ``label_fraction``
    < 1 keeps the labels of a seeded random share of the training customers
    (:func:`~slmlab.transactions.data.bank.label_customers` with ``seed``) and drops the other
    customers' windows: their labels are unknown in that setting, and windows whose labels are all
    ignored would add nothing to the loss. Then ``keep_negative`` / ``fraud_share`` rebalance them.
    :func:`positive_upweighting` fixes ``pos_weight``; validation keeps all of its labels (they only
    select and report), each validation-period row counted once and no earlier row
    (:meth:`~slmlab.transactions.data.windows.Windows.scored_labels`); ``probe``: the training windows
    before any rebalancing (the train-PR-AUC probe reads a sample of them, at the base rate, each row
    once). ``config["fraud_tabular"] == "rolling"`` (joint fusion) attaches every row's rolling features
    to both splits and fixes their names and normaliser, fitted on the kept training rows."""
    y_train = bank.labels(bank.cuts["train_end"])
    y_val = bank.labels(bank.cuts["test_start"])
    train_rows = bank.period_mask(None, bank.cuts["train_end"])
    labelled = labelled_customers(bank, options)
    if options.label_fraction < 1:
        train_rows &= bank.df["customer_id"].astype(str).isin(labelled).to_numpy()
    train_w = bank.windows(T, T // 2, "train", labels=y_train)
    if options.label_fraction < 1:
        train_w = windows_of_customers(train_w, bank, labelled)
    kept = balance_windows(train_w, options.keep_negative, 0.0, options.seed)  # the rows the loss sees, once each
    real = kept.txn_mask & (kept.labels >= 0)
    fixed = positive_upweighting(options.fraud_share, int((real & (kept.labels == 0)).sum()),
                                 int((real & (kept.labels == 1)).sum()))
    windows = {"train": balance_windows(train_w, options.keep_negative, options.fraud_share, options.seed),
               "validation": bank.windows(T, T // 2, "validation", labels=y_val).scored_labels(),
               "probe": train_w.scored_labels()}
    if config.get("fraud_tabular", "none") == "rolling":
        names, table = tabular_table(bank)
        center, scale = fit_normaliser(table, np.flatnonzero(train_rows))
        fixed.update(tabular_features=names, tabular_center=center, tabular_scale=scale)
        windows = {k: w.with_row_features(table) for k, w in windows.items()}
    return windows, fixed


@torch.no_grad()
def labelled_scores(model, windows: Windows, batch_size: int, labels_of) -> tuple[np.ndarray, np.ndarray, float]:
    """Every labelled position's label and logit over ``windows`` and the mean loss over them, with
    ``labels_of(batch) -> labels`` (``IGNORE`` where unknown); the model is left in the mode it had."""
    device = next(model.parameters()).device
    was = model.training
    model.eval()
    ys, ps, loss_sum, n = [], [], 0.0, 0
    for batch in windows.batches(batch_size, device):
        lab = labels_of(batch)
        out = model(**batch.inputs(), labels=lab)
        valid = lab != IGNORE
        k = int(valid.sum())
        loss_sum += float(out.loss) * k
        n += k
        ys.append(lab[valid].cpu().numpy())
        ps.append(out.logits[valid].float().cpu().numpy())
    model.train(was)
    return np.concatenate(ys), np.concatenate(ps), loss_sum / max(n, 1)


def fraud_eval(model, windows: Windows, batch_size: int = 64) -> dict:
    """Validation loss and PR-AUC of the fraud model on ``windows`` (known labels only); ``acc``
    repeats the PR-AUC, which is what the harness's ``keep_best`` selects on (``keep_best=true``
    saves the weights with the best validation PR-AUC as ``checkpoints/best``)."""
    from sklearn.metrics import average_precision_score

    y, p, loss = labelled_scores(model, windows, batch_size,
                                 lambda b: transaction_labels(b.ids, b.txn_mask, b.labels))
    pr_auc = float(average_precision_score(y, p)) if y.sum() else math.nan
    return {"loss": loss, "pr_auc": pr_auc, "acc": pr_auc}
