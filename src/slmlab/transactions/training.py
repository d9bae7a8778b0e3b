"""The two training stages through the harness's ``Trainer``: next-token pretraining of the encoder and
fine-tuning of the fraud model (progress bar, checkpoints, exact resume and the non-finite stop are
the harness's)."""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch

from ..train.config import load_config
from ..train.trainer import Trainer
from .data import Bank, TransactionWindows, pretrain_report, unigram_counts
from .fraud import TransactionFraudModel, pos_weight_from_counts
from .model import TransactionEncoder, TxnEncoderConfig
from .windows import Windows

PRETRAIN_DEFAULTS = {"batch_size": 32, "max_steps": 200, "eval_every": 0, "checkpoint_every": 0, "log_every": 10,
                     "tensorboard": False, "optim": {"lr": 1e-3, "weight_decay": 0.1}, "schedule": {"warmup": 0.1}}
FINETUNE_DEFAULTS = {"batch_size": 32, "max_steps": 200, "eval_every": 0, "checkpoint_every": 0, "log_every": 10,
                     "tensorboard": False, "optim": {"lr": 1e-3, "lr_scales": {"encoder.": 0.1}},
                     "schedule": {"warmup": 0.1}}


def _run_config(defaults: dict, out_dir: str | Path, overrides: list[str], files: list[str] = ()):
    base = {**defaults, "out_dir": str(out_dir), "model": "transactions", "data": "transactions"}
    return load_config(list(files), list(overrides), base=base)


def pretrain(bank: Bank, preset: str, out_dir: str | Path, overrides: list[str] = (), resume: bool = False,
             model: TransactionEncoder | None = None, files: list[str] = (),
             max_transactions: int | None = None) -> Trainer:
    """Pretrain an encoder of ``preset`` on the bank's training windows (stride ``T // 2``);
    validation reports per-feature CE against the training and customer-history unigrams.
    ``max_transactions`` sets the window length ``T`` (default: the preset's); fine-tuning and
    scoring read ``T`` back from the saved encoder config."""
    cfg = _run_config(PRETRAIN_DEFAULTS, out_dir, overrides, files)
    torch.manual_seed(cfg.seed)
    length = {} if max_transactions is None else {"max_transactions": max_transactions}
    model = model or TransactionEncoder(TxnEncoderConfig.from_preset(preset, schema=bank.fitted, **length))
    T = model.config.max_transactions
    windows = {"train": bank.windows(T, T // 2, "train"), "validation": bank.windows(T, T // 2, "validation")}
    source = TransactionWindows(windows, "pretrain")
    counts = unigram_counts(windows["train"], list(model.config.schema_config.vocab_sizes))
    bs = cfg.eval_batch_size or cfg.batch_size

    def evaluator(m, split):
        return pretrain_report(m, windows[split], counts, bs, next(m.parameters()).device)

    trainer = Trainer(cfg, model, source, evaluator=evaluator)
    if resume and trainer.last_checkpoint() is not None:
        trainer.resume(trainer.last_checkpoint())
    bank.fitted.save(Path(out_dir))
    trainer.train()
    return trainer


def fraud_eval(model, windows, batch_size: int = 64) -> dict:
    """Validation loss and PR-AUC of the fraud model on ``windows`` (known labels only); ``acc``
    repeats the PR-AUC, which is what the harness's ``keep_best`` selects on (``keep_best=true``
    saves the weights with the best validation PR-AUC as ``checkpoints/best``)."""
    from sklearn.metrics import average_precision_score

    device = next(model.parameters()).device
    was = model.training
    model.eval()
    ys, ps, losses, n = [], [], 0.0, 0
    with torch.no_grad():
        for s in range(0, len(windows), batch_size):
            ids = torch.from_numpy(windows.ids[s:s + batch_size]).to(device)
            mask = torch.from_numpy(windows.txn_mask[s:s + batch_size]).to(device)
            lab = torch.from_numpy(windows.labels[s:s + batch_size].astype(np.int64)).to(device)
            lab = torch.where(mask & (lab >= 0), lab, torch.full_like(lab, -100))
            out = model(input_ids=ids, attention_mask=mask, labels=lab)
            valid = lab >= 0
            k = int(valid.sum())
            losses += float(out.loss) * k
            n += k
            ys.append(lab[valid].cpu().numpy())
            ps.append(out.logits[valid].float().cpu().numpy())
    model.train(was)
    y, p = np.concatenate(ys), np.concatenate(ps)
    pr_auc = float(average_precision_score(y, p)) if y.sum() else math.nan
    return {"loss": losses / max(n, 1), "pr_auc": pr_auc, "acc": pr_auc}


def balance_windows(windows: Windows, keep_negative: float = 1.0, fraud_share: float = 0.0, seed: int = 0) -> Windows:
    """Training windows rebalanced for the fraud head.

    ``keep_negative`` < 1 keeps that share of the windows without a fraud label; ``fraud_share`` > 0
    then repeats every window holding a fraud label a whole number of times, so that such windows
    make up about that share of the result (fraud windows are a fraction of a percent of the data,
    so without it a batch of 32 holds about one). Ranking metrics are unaffected by either;
    calibrated probabilities would need weights, which are not applied.
    """
    if not 0 < keep_negative <= 1:
        raise ValueError(f"keep_negative must be in (0, 1], got {keep_negative!r}")
    if not 0 <= fraud_share < 1:
        raise ValueError(f"fraud_share must be in [0, 1), got {fraud_share!r}")
    has_fraud = (windows.labels == 1).any(1)
    keep = np.ones(len(windows), bool)
    if keep_negative < 1.0:
        keep = has_fraud | (np.random.default_rng(seed).random(len(windows)) < keep_negative)
    idx = np.flatnonzero(keep)
    pos, neg = idx[has_fraud[idx]], idx[~has_fraud[idx]]
    if fraud_share > 0 and len(pos):
        repeat = max(1, round(fraud_share / (1 - fraud_share) * len(neg) / len(pos)))
        idx = np.sort(np.r_[neg, np.repeat(pos, repeat)])
    return Windows(*(getattr(windows, f)[idx] for f in ("ids", "txn_mask", "labels", "rows", "score_from")))


def label_customers(customers, fraction: float, seed: int = 0) -> set[str]:
    """A seeded random ``max(1, round(fraction * n))`` of the ``n`` distinct ``customers`` (drawn from
    their sorted list, so the choice depends only on the set, the fraction and the seed)."""
    if not 0 < fraction <= 1:
        raise ValueError(f"label fraction must be in (0, 1], got {fraction!r}; pass e.g. 0.1 for 10% of the"
                         " training customers")
    uniq = np.array(sorted({str(c) for c in customers}))
    k = max(1, round(fraction * len(uniq))) if len(uniq) else 0
    return set(uniq[np.random.default_rng(seed).choice(len(uniq), k, replace=False)])


def windows_of_customers(windows: Windows, bank: Bank, keep: set[str]) -> Windows:
    """The windows whose customer (the one of its newest row) is in ``keep``."""
    cust = bank.df["customer_id"].astype(str).to_numpy()[windows.rows[:, -1]]
    idx = np.flatnonzero(np.isin(cust, list(keep)))
    return Windows(*(getattr(windows, f)[idx] for f in ("ids", "txn_mask", "labels", "rows", "score_from")))


def finetune(bank: Bank, out_dir: str | Path, encoder: TransactionEncoder | None = None, preset: str = "lfm2_tiny",
             overrides: list[str] = (), linear_probe: bool = False, keep_negative: float = 1.0, seed: int = 0,
             files: list[str] = (), loss: str = "bce", focal_gamma: float = 2.0, fraud_share: float = 0.0,
             label_fraction: float = 1.0, head_inputs: str = "state", head_hidden: int | None = None) -> Trainer:
    """Fine-tune a fraud model (from ``encoder``, else from scratch) on training windows with labels
    known by the end of train, rebalanced by :func:`balance_windows` (``keep_negative``,
    ``fraud_share``); ``loss`` is ``bce`` or ``focal`` (with ``focal_gamma``); ``head_inputs`` is
    ``state``, ``surprisal`` or ``both`` (the fraud head's inputs) and ``head_hidden`` its MLP width
    (0: a logistic head; default ``D // 2`` for ``state``, 16 otherwise).

    ``label_fraction`` < 1 keeps the labels of a seeded random share of the training customers
    (:func:`label_customers` with ``seed``) and drops the other customers' training windows: their
    labels are unknown in that setting, and windows whose labels are all ignored would add nothing to
    the loss. ``pos_weight`` is counted over the kept customers; validation keeps all of its labels
    (they only select and report)."""
    cfg = _run_config(FINETUNE_DEFAULTS, out_dir, overrides, files)
    torch.manual_seed(cfg.seed)
    y_train = bank.labels(bank.cuts["train_end"])
    y_val = bank.labels(bank.cuts["test_start"])
    train_rows = bank.period_mask(None, bank.cuts["train_end"])
    customers = bank.df["customer_id"].astype(str)
    labelled = label_customers(set(customers[train_rows]) - {str(c) for c in bank.holdout}, label_fraction, seed)
    if label_fraction < 1:
        train_rows &= customers.isin(labelled).to_numpy()
    pos = int((y_train[train_rows] == 1).sum())
    neg = int((y_train[train_rows] == 0).sum())
    extra = {"pos_weight": pos_weight_from_counts(neg, pos), "freeze_backbone": linear_probe, "fraud_loss": loss,
             "focal_gamma": focal_gamma, "fraud_head_inputs": head_inputs, "fraud_hidden": head_hidden}
    if encoder is None:
        config = TxnEncoderConfig.from_preset(preset, schema=bank.fitted, **extra)
        model = TransactionFraudModel(config)
    else:
        model = TransactionFraudModel.from_encoder(encoder, **extra)
    T = model.config.max_transactions
    train_w = bank.windows(T, T // 2, "train", labels=y_train)
    if label_fraction < 1:
        train_w = windows_of_customers(train_w, bank, labelled)
    train_w = balance_windows(train_w, keep_negative, fraud_share, seed)
    windows = {"train": train_w, "validation": bank.windows(T, T // 2, "validation", labels=y_val)}
    source = TransactionWindows(windows, "fraud")
    bs = cfg.eval_batch_size or cfg.batch_size
    trainer = Trainer(cfg, model, source, evaluator=lambda m, split: fraud_eval(m, windows[split], bs))
    trainer.train()
    return trainer


def finetune_label_fraction_pair(bank: Bank, out_dir: str | Path, encoder: TransactionEncoder,
                                 label_fraction: float, overrides: list[str] = (), keep_negative: float = 1.0,
                                 seed: int = 0, files: list[str] = ()) -> dict[str, TransactionFraudModel]:
    """Does pretraining pay with few labels? Fine-tune twice with one recipe, budget and label subset:
    from ``encoder`` (``lf_pretrained``, in ``out_dir/pretrained``) and from a freshly initialised
    encoder of the same architecture and schema (``lf_scratch``, in ``out_dir/scratch``). Returns the
    two trained models."""
    label_customers([], label_fraction)  # validate before minutes of training
    torch.manual_seed(seed)
    scratch = TransactionEncoder(TxnEncoderConfig(**encoder.config.to_dict()))
    out = {}
    for name, enc in (("pretrained", encoder), ("scratch", scratch)):
        trainer = finetune(bank, Path(out_dir, name), enc, overrides=overrides, keep_negative=keep_negative,
                           seed=seed, files=files, label_fraction=label_fraction)
        out[f"lf_{name}"] = trainer.model
    return out


# -- the downstream heads: window fraud, next-transaction forecast, customer embedding -------------------
@dataclass
class HeadTask:
    """What fine-tuning one downstream head needs: its model class, training / validation windows, the
    data source mode, config extras and ``evaluate(model, windows, batch_size) -> dict``."""

    model_class: type
    windows: dict
    mode: str
    config: dict
    evaluate: Callable


def _sequence_task(bank: Bank, T: int, recent_k: int | None, keep_negative: float, fraud_share: float,
                   seed: int) -> HeadTask:
    from .sequence import SequenceFraudModel, sequence_eval, window_labels

    train_w = bank.windows(T, T // 2, "train", labels=bank.labels(bank.cuts["train_end"]))
    y = window_labels(torch.from_numpy(train_w.labels.astype(np.int64)), torch.from_numpy(train_w.txn_mask), recent_k)
    pos_weight = pos_weight_from_counts(int((y == 0).sum()), int((y == 1).sum()))
    windows = {"train": balance_windows(train_w, keep_negative, fraud_share, seed),
               "validation": bank.windows(T, T // 2, "validation", labels=bank.labels(bank.cuts["test_start"]))}
    return HeadTask(SequenceFraudModel, windows, "sequence", {"pos_weight": pos_weight, "sequence_recent_k": recent_k},
                    lambda m, w, bs: sequence_eval(m, w, recent_k, bs))


def _forecast_task(bank: Bank, T: int, **_) -> HeadTask:
    from .forecast import NextTransactionModel, forecast_eval

    windows = {split: bank.windows(T, T // 2, split) for split in ("train", "validation")}
    return HeadTask(NextTransactionModel, windows, "forecast", {}, forecast_eval)


def _customer_task(bank: Bank, T: int, **_) -> HeadTask:
    from .customer import CustomerEmbeddingModel, customer_eval, window_pairs

    windows = {split: window_pairs(bank, T, split) for split in ("train", "validation")}
    return HeadTask(CustomerEmbeddingModel, windows, "customer", {}, customer_eval)


HEAD_TASKS = {"sequence": _sequence_task, "forecast": _forecast_task, "customer": _customer_task}


def finetune_head(bank: Bank, out_dir: str | Path, head: str, encoder: TransactionEncoder | None = None,
                  preset: str = "lfm2_tiny", overrides: list[str] = (), linear_probe: bool = False,
                  keep_negative: float = 1.0, seed: int = 0, files: list[str] = (), recent_k: int | None = None,
                  fraud_share: float = 0.0) -> Trainer:
    """Fine-tune a downstream head (``sequence``, ``forecast`` or ``customer``) from ``encoder`` (else
    from scratch); validation metrics come from the head's evaluation through the harness's
    ``evaluator`` hook (``acc``: window PR-AUC, mean top-1 of the forecast, pair retrieval top-1).
    ``recent_k``, ``keep_negative`` and ``fraud_share`` apply to ``sequence`` only."""
    if head not in HEAD_TASKS:
        raise ValueError(f"unknown head {head!r}; use one of transaction, {', '.join(HEAD_TASKS)}")
    cfg = _run_config(FINETUNE_DEFAULTS, out_dir, overrides, files)
    torch.manual_seed(cfg.seed)
    T = encoder.config.max_transactions if encoder is not None else TxnEncoderConfig.from_preset(preset).max_transactions
    task = HEAD_TASKS[head](bank, T, recent_k=recent_k, keep_negative=keep_negative, fraud_share=fraud_share,
                            seed=seed)
    extra = {**task.config, "freeze_backbone": linear_probe}
    if encoder is None:
        model = task.model_class(TxnEncoderConfig.from_preset(preset, schema=bank.fitted, **extra))
    else:
        model = task.model_class.from_encoder(encoder, **extra)
    source = TransactionWindows(task.windows, task.mode, recent_k=recent_k)
    bs = cfg.eval_batch_size or cfg.batch_size
    trainer = Trainer(cfg, model, source, evaluator=lambda m, split: task.evaluate(m, task.windows[split], bs))
    trainer.train()
    return trainer
