"""Why the fraud head trails gradient boosting: the two measured diagnostics of docs/transactions.md.

``hgb-window``: HGB with the rolling features restricted to the last ``K`` transactions (what a window
of ``T = K + 1`` shows the sequence model): how much of the gap the window length explains.

``finetune``: a plain fine-tuning loop outside the harness with a set share of fraud-bearing windows
per batch, printing every ``--eval-every`` steps the PR-AUC and ROC-AUC on training windows,
validation and test (each: all windows holding a fraud plus 20% of the others, those weighted 5), so
over- and under-fitting show as curves. ``--extra rolling`` adds the HGB rolling features
(log-scaled, standardised on training rows, missing flags) through a linear map to the state the
fraud head reads: does handing the network the engineered aggregates close the gap?

    .venv/bin/python benchmarks/diagnose_transactions.py hgb-window --data bank --encoder pre --K 15
    .venv/bin/python benchmarks/diagnose_transactions.py finetune --data bank --encoder pre --steps 300 \\
        --fraud-share 0.5 [--extra rolling] [--scratch]
"""

from __future__ import annotations

import argparse
import json
import math
import time

import numpy as np
import torch

from slmlab.train.checkpoint import resolve_checkpoint
from slmlab.transactions import baseline
from slmlab.transactions import evaluate as evaluation
from slmlab.transactions._deps import pd
from slmlab.transactions.data import derive_distance, prepare_bank
from slmlab.transactions.fraud import TransactionFraudModel, pos_weight_from_counts
from slmlab.transactions.model import TransactionEncoder, TxnEncoderConfig
from slmlab.transactions.synth import load_bank
from slmlab.transactions.windows import build_windows


def hgb_window(bank, K: int) -> None:
    """HGB rolling with every per-customer aggregate limited to the customer's last ``K`` rows."""
    plain_stats, plain_build = baseline._window_stats, baseline.build_features

    def capped_stats(key_cust, secs, values, w):
        key = key_cust * 1e10 + secs
        idx = np.arange(len(key))
        lo = np.maximum(np.searchsorted(key, key - w, side="left"), idx - K)
        return [(idx - lo).astype(np.float64)] + [np.r_[0.0, np.cumsum(v)][idx] - np.r_[0.0, np.cumsum(v)][lo]
                                                  for v in values]

    def capped_build(df, distance_home=None, rolling=True, freq_rows=None, risk=False):
        X = plain_build(df, distance_home, rolling, freq_rows, risk)
        if rolling:  # novelty: not seen in the last K rows
            idx, cust = np.arange(len(df)), pd.factorize(df["customer_id"])[0]
            for col in ("merchant_id", "mcc", "merchant_country", "device_id"):
                prev = pd.Series(idx).groupby([cust, pd.factorize(df[col].astype(str))[0]]).shift(1).to_numpy()
                X[f"new_{col}"] = np.where(df[col].notna(), np.isnan(prev) | (idx - prev > K), np.nan).astype(float)
        return X

    baseline._window_stats, evaluation.build_features = capped_stats, capped_build
    try:
        t0 = time.perf_counter()
        s, info = evaluation.hgb_scores(bank, rolling=True)
    finally:
        baseline._window_stats, evaluation.build_features = plain_stats, plain_build
    from sklearn.metrics import average_precision_score, roc_auc_score

    test = bank.period_mask(bank.cuts["test_start"], None)
    y = bank.df["is_fraud"].fillna(0).to_numpy().astype(int)[test]
    print(f"HGB rolling, aggregates over the last {K} transactions only: test PR-AUC "
          f"{average_precision_score(y, s[test]):.3f}, ROC-AUC {roc_auc_score(y, s[test]):.3f}, "
          f"{info['n_iter']} iterations, {time.perf_counter() - t0:.0f} s")


def rolling_inputs(bank) -> np.ndarray:
    """``[N + 1, 2k]`` float32: standardised rolling features and their missing flags (row -1: zeros)."""
    train = bank.period_mask(None, bank.cuts["train_end"])
    X = baseline.build_features(bank.df, derive_distance(bank), rolling=True, freq_rows=train)
    X = X.select_dtypes("number").astype(float).replace([np.inf, -np.inf], np.nan)
    heavy = [c for c in X.columns if not c.startswith(("hour", "weekday", "new_"))]
    X[heavy] = np.sign(X[heavy]) * np.log1p(np.abs(X[heavy]))
    Xn = ((X - X[train].mean()) / X[train].std().replace(0, 1)).clip(-5, 5)
    out = np.c_[Xn.fillna(0).to_numpy(np.float32), X.isna().to_numpy(np.float32)]
    return np.r_[out, np.zeros((1, out.shape[1]), np.float32)]


def finetune(bank, encoder: TransactionEncoder, args) -> None:
    torch.manual_seed(args.seed)
    rng = np.random.default_rng(args.seed)
    y_tr, y_va = bank.labels(bank.cuts["train_end"]), bank.labels(bank.cuts["test_start"])
    y_all = bank.df["is_fraud"].fillna(0).to_numpy().astype(np.int8)
    tr = bank.period_mask(None, bank.cuts["train_end"])
    over = {"pos_weight": pos_weight_from_counts(int((y_tr[tr] == 0).sum()), int((y_tr[tr] == 1).sum())),
            "fraud_loss": args.loss}
    if args.scratch:
        model = TransactionFraudModel(TxnEncoderConfig(**{**encoder.config.to_dict(), **over}))
    else:
        model = TransactionFraudModel.from_encoder(encoder, **over)
    T, F, k = model.config.max_transactions, len(model.encoder.feature_names), model.encoder.score_index
    extra = rolling_inputs(bank) if args.extra == "rolling" else None
    if extra is not None:
        model.add_module("extra_proj", torch.nn.Linear(extra.shape[1], model.encoder.config.backbone_config().hidden_size))

    def logits(ids, mask, rows):
        h = model.encoder.backbone_forward(torch.from_numpy(ids), torch.from_numpy(mask))
        if extra is None:
            return model.fraud_head(h)
        return model.fraud_head.mlp(h[:, k::F] + model.extra_proj(torch.from_numpy(extra[rows]))).squeeze(-1)

    def eval_set(since, until, labels):
        lo = bank.count_before(since)
        hi = bank.count_before(until) if until is not None else None
        w = build_windows(bank.encoded(), T, T // 2, row_offsets=bank.starts, min_end=lo, max_end=hi)
        lab = np.where(w.rows >= 0, labels[np.maximum(w.rows, 0)], -1)
        has = (lab == 1).any(1)
        return w, lab, np.flatnonzero(has | (rng.random(len(w)) < 0.2)), np.where(has, 1.0, 5.0), True

    trw = bank.windows(T, T // 2, "train", labels=y_tr)
    pos_w, neg_w = np.flatnonzero((trw.labels == 1).any(1)), np.flatnonzero(~(trw.labels == 1).any(1))
    sub = rng.choice(neg_w, min(1500, len(neg_w)), replace=False)
    sets = {"train": (trw, trw.labels, np.sort(np.r_[pos_w, sub]),
                      np.where((trw.labels == 1).any(1), 1.0, len(neg_w) / len(sub)), False),
            "val": eval_set(bank.cuts["val_start"], bank.cuts["val_end"], y_va),
            "test": eval_set(bank.cuts["test_start"], None, y_all)}

    @torch.no_grad()
    def measure(w, lab, idx, weight, streaming):
        from sklearn.metrics import average_precision_score, roc_auc_score

        model.eval()
        ys, ps, ws = [], [], []
        for s in range(0, len(idx), 128):
            b = idx[s:s + 128]
            p = logits(w.ids[b], w.txn_mask[b], w.rows[b]).float().numpy()
            keep = w.txn_mask[b] & (lab[b] >= 0)
            if streaming:
                keep &= np.arange(T)[None] >= w.score_from[b, None]
            ys.append(lab[b][keep])
            ps.append(p[keep])
            ws.append(np.broadcast_to(weight[b, None], keep.shape)[keep])
        model.train()
        y, p, wt = map(np.concatenate, (ys, ps, ws))
        return round(float(average_precision_score(y, p, sample_weight=wt)), 4), round(float(
            roc_auc_score(y, p, sample_weight=wt)), 4)

    enc_p = [p for n, p in model.named_parameters() if n.startswith("encoder.")]
    head_p = [p for n, p in model.named_parameters() if not n.startswith("encoder.")]
    opt = torch.optim.AdamW([{"params": enc_p, "lr": args.lr * args.encoder_lr_scale}, {"params": head_p, "lr": args.lr}],
                            weight_decay=0.01)
    peaks = [g["lr"] for g in opt.param_groups]
    print(json.dumps({"train_windows": len(trw), "fraud_windows": len(pos_w), **vars(args)}, default=str), flush=True)
    t0 = time.perf_counter()
    for step in range(1, args.steps + 1):
        f = min(1.0, step / (0.1 * args.steps)) * (0.1 + 0.45 * (1 + math.cos(math.pi * step / args.steps)))
        for g, peak in zip(opt.param_groups, peaks):
            g["lr"] = peak * f
        n_pos = rng.binomial(args.batch, args.fraud_share)
        b = np.r_[rng.choice(pos_w, n_pos), rng.choice(neg_w, args.batch - n_pos)]
        lab = torch.from_numpy(trw.labels[b].astype(np.int64))
        lab = torch.where(torch.from_numpy(trw.txn_mask[b]) & (lab >= 0), lab, torch.full_like(lab, -100))
        z = logits(trw.ids[b], trw.txn_mask[b], trw.rows[b])
        valid = lab != -100
        loss = (model.loss_fn(z, lab.clamp(min=0)) * valid).sum() / valid.sum().clamp(min=1)
        opt.zero_grad()
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        if step % args.eval_every == 0 or step == args.steps:
            row = {"step": step, "seconds": round(time.perf_counter() - t0), "loss": round(float(loss.detach()), 4)}
            row.update({name: measure(*s) for name, s in sets.items()})
            print(json.dumps(row), flush=True)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("what", choices=("hgb-window", "finetune"))
    p.add_argument("--data", required=True, help="a bank folder")
    p.add_argument("--encoder", required=True, help="a pretrained encoder run (its fitted schema is used)")
    p.add_argument("--K", type=int, default=15)
    p.add_argument("--steps", type=int, default=300)
    p.add_argument("--batch", type=int, default=32)
    p.add_argument("--lr", type=float, default=1e-3)
    p.add_argument("--encoder-lr-scale", type=float, default=1.0)
    p.add_argument("--fraud-share", type=float, default=0.5, help="share of each batch drawn from fraud windows")
    p.add_argument("--loss", default="bce", choices=("bce", "focal"))
    p.add_argument("--extra", default="", choices=("", "rolling"))
    p.add_argument("--scratch", action="store_true", help="random encoder weights instead of the pretrained ones")
    p.add_argument("--eval-every", type=int, default=100)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--threads", type=int, default=1)
    args = p.parse_args()
    torch.set_num_threads(args.threads)
    encoder = TransactionEncoder.from_pretrained(str(resolve_checkpoint(args.encoder)))
    data = load_bank(args.data)
    bank = prepare_bank(data.transactions, encoder.config.fitted_schema, data.customers)
    if args.what == "hgb-window":
        hgb_window(bank, args.K)
    else:
        finetune(bank, encoder, args)


if __name__ == "__main__":
    main()
