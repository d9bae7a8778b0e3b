"""The two training stages through the harness's ``Trainer``: next-token pretraining of the encoder and
fine-tuning of the fraud model (progress bar, checkpoints, exact resume and the non-finite stop are
the harness's)."""

from __future__ import annotations

import math
from pathlib import Path

import numpy as np
import torch

from ..train.config import load_config
from ..train.trainer import Trainer
from .data import Bank, TransactionWindows, pretrain_report, unigram_counts
from .fraud import TransactionFraudModel, pos_weight_from_counts
from .model import TransactionEncoder, TxnEncoderConfig

PRETRAIN_DEFAULTS = {"batch_size": 32, "max_steps": 200, "eval_every": 0, "checkpoint_every": 0, "log_every": 10,
                     "tensorboard": False, "optim": {"lr": 1e-3, "weight_decay": 0.1}, "schedule": {"warmup": 0.1}}
FINETUNE_DEFAULTS = {"batch_size": 32, "max_steps": 200, "eval_every": 0, "checkpoint_every": 0, "log_every": 10,
                     "tensorboard": False, "optim": {"lr": 1e-3, "lr_scales": {"encoder.": 0.1}},
                     "schedule": {"warmup": 0.1}}


def _run_config(defaults: dict, out_dir: str | Path, overrides: list[str], files: list[str] = ()):
    base = {**defaults, "out_dir": str(out_dir), "model": "transactions", "data": "transactions"}
    return load_config(list(files), list(overrides), base=base)


def pretrain(bank: Bank, preset: str, out_dir: str | Path, overrides: list[str] = (), resume: bool = False,
             model: TransactionEncoder | None = None, files: list[str] = ()) -> Trainer:
    """Pretrain an encoder of ``preset`` on the bank's training windows (stride ``T // 2``);
    validation reports per-feature CE against the training and customer-history unigrams."""
    cfg = _run_config(PRETRAIN_DEFAULTS, out_dir, overrides, files)
    torch.manual_seed(cfg.seed)
    model = model or TransactionEncoder(TxnEncoderConfig.from_preset(preset, schema=bank.fitted))
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
    """Validation BCE and PR-AUC of the fraud model on ``windows`` (known labels only)."""
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
    return {"loss": losses / max(n, 1), "pr_auc": float(average_precision_score(y, p)) if y.sum() else math.nan}


def finetune(bank: Bank, out_dir: str | Path, encoder: TransactionEncoder | None = None, preset: str = "lfm2_tiny",
             overrides: list[str] = (), linear_probe: bool = False, keep_negative: float = 1.0, seed: int = 0,
             files: list[str] = (), loss: str = "bce", focal_gamma: float = 2.0) -> Trainer:
    """Fine-tune a fraud model (from ``encoder``, else from scratch) on training windows with labels
    known by the end of train; ``keep_negative`` < 1 keeps that share of windows without fraud;
    ``loss`` is ``bce`` or ``focal`` (with ``focal_gamma``)."""
    cfg = _run_config(FINETUNE_DEFAULTS, out_dir, overrides, files)
    torch.manual_seed(cfg.seed)
    y_train = bank.labels(bank.cuts["train_end"])
    y_val = bank.labels(bank.cuts["test_start"])
    train_rows = bank.period_mask(None, bank.cuts["train_end"])
    pos = int((y_train[train_rows] == 1).sum())
    neg = int((y_train[train_rows] == 0).sum())
    extra = {"pos_weight": pos_weight_from_counts(neg, pos), "freeze_backbone": linear_probe, "fraud_loss": loss,
             "focal_gamma": focal_gamma}
    if encoder is None:
        config = TxnEncoderConfig.from_preset(preset, schema=bank.fitted, **extra)
        model = TransactionFraudModel(config)
    else:
        model = TransactionFraudModel.from_encoder(encoder, **extra)
    T = model.config.max_transactions
    train_w = bank.windows(T, T // 2, "train", labels=y_train)
    if keep_negative < 1.0:
        has_fraud = (train_w.labels == 1).any(1)
        keep = has_fraud | (np.random.default_rng(seed).random(len(train_w)) < keep_negative)
        train_w = type(train_w)(*(getattr(train_w, f)[keep] for f in ("ids", "txn_mask", "labels", "rows", "score_from")))
    windows = {"train": train_w, "validation": bank.windows(T, T // 2, "validation", labels=y_val)}
    source = TransactionWindows(windows, "fraud")
    bs = cfg.eval_batch_size or cfg.batch_size
    trainer = Trainer(cfg, model, source, evaluator=lambda m, split: fraud_eval(m, windows[split], bs))
    trainer.train()
    return trainer
