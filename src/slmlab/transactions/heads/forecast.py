"""Next-transaction forecast: ``p(mcc, amount bucket, delta_t bucket of t+1 | history up to t)``.

The per-feature LM head for mcc of ``t+1`` is conditioned on the earlier fields of ``t+1``
(delta_t ... merchant); this head gives the marginal forecast from the summary state of ``t``
(``p = t*F + F - 1``, all of ``t`` and its history seen). One linear map per target feature, vocabulary
= that feature's vocabulary. Targets are the ids of row ``t+1``; pairs where ``t`` or ``t+1`` is
padding (and PAD/MASK targets) are ignored, and the newest row of a window has no target. Loss: the
sum of the three mean cross-entropies.

Metrics (:func:`forecast_metrics`): top-1 / top-5 accuracy and log-loss per target, and the mean
absolute bucket error of the amount forecast, each beside the customer-history unigram baseline: for
the target at row ``t+1``, add-one smoothed counts of the feature over the window's real rows
``0..t`` (``(c + 1) / (n + V)``; ranking ties broken by the lower id, PAD/MASK never ranked). The
amount's point forecast is the median bucket of each predicted distribution (PAD/MASK left out), the
minimiser of the expected absolute error: amount buckets are quantile bins, so the target is close
to uniform over ~60 buckets and the argmax of a spread-out forecast often sits at an extreme.

Training data (:func:`training_windows`): every window ending in train / validation (no labels needed).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import nn
from transformers.utils import ModelOutput

from ..data.bank import Bank
from ..data.schema import MASK, PAD
from ..data.windows import WindowOptions, Windows
from ..model import TxnEncoderConfig, TxnHeadConfig, TxnHeadModel, txn_mask_from
from .customer import summary_states

FORECAST_FEATURES = ("mcc", "amount", "delta_t")
AMOUNT = "amount"


class NextTransactionConfig(TxnHeadConfig):
    """Config of :class:`NextTransactionModel`: the encoder's fields (the forecast head has no options
    of its own; its targets are :data:`FORECAST_FEATURES`)."""

    model_type = "slmlab_txn_forecast"
    HEAD_FIELDS = ()


def forecast_targets(ids: torch.Tensor, txn_mask: torch.Tensor, feature_index: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Targets ``[B, T]`` (feature ``feature_index`` of row ``t+1``; 0 at ``t = T-1``) and validity ``[B, T]``."""
    tgt = torch.zeros_like(ids[..., feature_index])
    tgt[:, :-1] = ids[:, 1:, feature_index]
    valid = torch.zeros_like(txn_mask, dtype=torch.bool)
    valid[:, :-1] = txn_mask[:, :-1].bool() & txn_mask[:, 1:].bool()
    return tgt, valid & (tgt != PAD) & (tgt != MASK)


class NextTransactionHead(nn.Module):
    """One linear map per target feature on the summary states.

    Args:
        hidden_size: ``D``.
        vocab_sizes: ``feature name -> V`` of the targets (in order).
        num_features: ``F``.
    """

    def __init__(self, hidden_size: int, vocab_sizes: dict[str, int], num_features: int = 15) -> None:
        super().__init__()
        self.num_features = num_features
        self.heads = nn.ModuleDict({name: nn.Linear(hidden_size, v) for name, v in vocab_sizes.items()})

    def forward(self, hidden: torch.Tensor) -> dict[str, torch.Tensor]:
        """``[B, T*F, D]`` -> ``name -> [B, T, V]`` logits for row ``t+1``."""
        states = summary_states(hidden, self.num_features)
        return {name: head(states) for name, head in self.heads.items()}


@dataclass
class ForecastOutput(ModelOutput):
    loss: torch.Tensor | None = None
    logits: dict | None = None


class NextTransactionModel(TxnHeadModel):
    """:class:`TransactionEncoder` (as ``encoder``) + :class:`NextTransactionHead` for
    mcc / amount / delta_t. ``forward(input_ids [B,T,F], attention_mask, labels)``: ``labels`` are the
    ids again (any value turns the loss on; targets come from ``input_ids``)."""

    config_class = NextTransactionConfig

    def __init__(self, config: TxnEncoderConfig) -> None:
        super().__init__(config)
        config = self.config
        schema = config.schema_config
        self.target_index = {name: schema.index(name) for name in FORECAST_FEATURES}
        vocab = {name: schema.vocab_sizes[i] for name, i in self.target_index.items()}
        self.forecast_head = NextTransactionHead(config.backbone_config().hidden_size, vocab, schema.num_features)
        self._finish_init()

    def forward(self, input_ids: torch.Tensor, attention_mask: torch.Tensor | None = None,
                labels: torch.Tensor | None = None, **kwargs) -> ForecastOutput:
        txn_mask = txn_mask_from(input_ids, attention_mask)
        logits = self.forecast_head(self.encoder.backbone_forward(input_ids, txn_mask))
        loss = None
        if labels is not None:
            loss = logits[FORECAST_FEATURES[0]].sum() * 0.0
            for name, lg in logits.items():
                tgt, valid = forecast_targets(input_ids, txn_mask, self.target_index[name])
                ce = F.cross_entropy(lg.reshape(-1, lg.shape[-1]).float(), tgt.reshape(-1).long(), reduction="none")
                loss = loss + (ce * valid.reshape(-1)).sum() / valid.sum().clamp(min=1)
        return ForecastOutput(loss=loss, logits=logits)


def _history_counts(ids: torch.Tensor, txn_mask: torch.Tensor, f: int, vocab: int) -> torch.Tensor:
    """``[B, T, V]``: counts of feature ``f`` over the real rows ``0..t`` (the history of row ``t+1``)."""
    onehot = F.one_hot(ids[..., f].long(), vocab).float() * txn_mask[..., None].float()
    onehot[..., PAD] = 0
    return onehot.cumsum(1)


def forecast_sums(logits: dict[str, torch.Tensor], ids: torch.Tensor, txn_mask: torch.Tensor,
                  target_index: dict[str, int], counted: torch.Tensor | None = None) -> dict[str, float]:
    """Sums behind :func:`forecast_metrics` for one batch (they add over batches).

    Args:
        logits: ``name -> [B, T, V]`` forecasts of row ``t+1`` (from the state of row ``t``).
        ids: ``[B, T, F]``; txn_mask: ``[B, T]``; target_index: ``name -> feature index``.
        counted: bool ``[B, T]``, the rows whose forecast counts (the forecast *of* row ``t``, made at
            ``t - 1``); None: every real row.
    """
    out: dict[str, float] = {}
    for name, lg in logits.items():
        lg = lg.detach().float()
        V = lg.shape[-1]
        tgt, valid = forecast_targets(ids, txn_mask, target_index[name])
        if counted is not None:
            valid[:, :-1] &= counted[:, 1:].to(valid.device)
        tgt = tgt.long()
        counts = _history_counts(ids, txn_mask, target_index[name], V)
        hist_logp = torch.log((counts + 1) / (counts.sum(-1, keepdim=True) + V))
        rank_score = counts - torch.arange(V, device=lg.device) / V  # ties: lower id first
        rank_score[..., [PAD, MASK]] = float("-inf")
        for prefix, logp, score in (("", torch.log_softmax(lg, -1), lg), ("history/", hist_logp, rank_score)):
            top5 = score.topk(min(5, V), -1).indices
            hit1 = top5[..., 0] == tgt
            hit5 = (top5 == tgt[..., None]).any(-1)
            nll = -logp.gather(-1, tgt[..., None])[..., 0]
            out[f"{prefix}{name}/top1"] = out.get(f"{prefix}{name}/top1", 0.0) + float((hit1 & valid).sum())
            out[f"{prefix}{name}/top5"] = out.get(f"{prefix}{name}/top5", 0.0) + float((hit5 & valid).sum())
            out[f"{prefix}{name}/logloss"] = out.get(f"{prefix}{name}/logloss", 0.0) + float(nll[valid].sum())
            if name == AMOUNT:
                weight = logp.exp().clone()
                weight[..., [PAD, MASK]] = 0
                cdf = weight.cumsum(-1)
                median = (cdf >= 0.5 * cdf[..., -1:]).float().argmax(-1)
                err = (median - tgt).abs().float()
                key = f"{prefix}{name}/abs_bucket_error"
                out[key] = out.get(key, 0.0) + float(err[valid].sum())
        out[f"n/{name}"] = out.get(f"n/{name}", 0.0) + float(valid.sum())
    return out


def add_sums(a: dict[str, float], b: dict[str, float]) -> dict[str, float]:
    """Element-wise sum of two :func:`forecast_sums` results."""
    return {k: a.get(k, 0.0) + b.get(k, 0.0) for k in {*a, *b}}


def finish_forecast_metrics(sums: dict[str, float]) -> dict[str, float]:
    """Means from summed counts: ``<name>/top1|top5|logloss``, ``amount/abs_bucket_error``, the same
    under ``history/``, ``n/<name>``; ``loss`` = the sum of the three log-losses and ``acc`` = the
    mean top-1 of the model (what the harness's ``keep_best`` selects on)."""
    out: dict[str, float] = {}
    names = [k[2:] for k in sums if k.startswith("n/")]
    for key, value in sums.items():
        if key.startswith("n/"):
            out[key] = value
            continue
        name = key.split("/")[-2]
        out[key] = value / max(sums[f"n/{name}"], 1.0)
    out["loss"] = sum(out[f"{n}/logloss"] for n in names)
    out["acc"] = sum(out[f"{n}/top1"] for n in names) / max(len(names), 1)
    return out


def forecast_metrics(logits: dict[str, torch.Tensor], ids: torch.Tensor, txn_mask: torch.Tensor,
                     target_index: dict[str, int]) -> dict[str, float]:
    """Top-1 / top-5 accuracy, log-loss and the amount's mean absolute bucket error of ``logits``,
    each beside the customer-history unigram (``history/...``); see :func:`forecast_sums`."""
    return finish_forecast_metrics(forecast_sums(logits, ids, txn_mask, target_index))


def training_windows(bank: Bank, T: int, options: WindowOptions, config: dict) -> tuple[dict[str, Windows], dict]:
    """The forecast head's ``train`` / ``validation`` windows (stride ``T // 2``, no labels needed)."""
    return {split: bank.windows(T, T // 2, split) for split in ("train", "validation")}, {}


@torch.no_grad()
def forecast_eval(model: NextTransactionModel, windows: Windows, batch_size: int = 64) -> dict[str, float]:
    """:func:`forecast_metrics` of ``model`` over ``windows`` (a :class:`~slmlab.transactions.data.windows.Windows`),
    counting the forecast of each row the windows score (:attr:`~slmlab.transactions.data.windows.Windows.scored`):
    never a row before the validation period that a validation window holds as context."""
    device = next(model.parameters()).device
    was = model.training
    model.eval()
    sums: dict[str, float] = {}
    for batch in windows.batches(batch_size, device):
        out = model(input_ids=batch.ids, attention_mask=batch.txn_mask)
        scored = torch.from_numpy(batch.scored)  # each row of the windows' period once, no earlier row
        sums = add_sums(sums, forecast_sums(out.logits, batch.ids, batch.txn_mask, model.target_index, scored))
    model.train(was)
    return finish_forecast_metrics(sums)


def forecast_labels(ids: torch.Tensor, txn_mask: torch.Tensor, row_labels: torch.Tensor,
                    config: NextTransactionConfig | None = None) -> torch.Tensor:
    """Batch labels of the forecast head: the ids again (targets come from them; see the model)."""
    return ids.clone()
