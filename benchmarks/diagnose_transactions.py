"""Why the fraud head trails gradient boosting: the two measured diagnostics of docs/transactions.md.

``hgb-window``: HGB with the rolling features restricted to the last ``K`` transactions (what a window
of ``T = K + 1`` shows the sequence model): how much of the gap the window length explains.

``finetune``: a plain fine-tuning loop outside the harness with a set share of fraud-bearing windows
per batch, printing every ``--eval-every`` steps the PR-AUC and ROC-AUC on training windows,
validation and test (each: all windows holding a fraud plus 20% of the others, those weighted 5), so
over- and under-fitting show as curves. ``--extra rolling`` adds the HGB rolling features
(log-scaled, standardised on training rows, missing flags) through a linear map to the state the
fraud head reads: does handing the network the engineered aggregates close the gap?

``surprisal``: one streaming pass of the frozen pretrained encoder over every window (training
windows: all that hold a fraud plus ``--sample`` of the others, weighted back) caches, per scored
row, the surprisal of each field before the score field and the score-position state
(``--cache``, an ``.npz``), then fits small heads on them with scikit-learn (logistic regressions
with strong L2, HGB) and prints test PR-AUC / ROC-AUC on every test transaction: how far the
unsupervised anomaly inputs go with the frozen encoder, and the best head on the same information.

    .venv/bin/python benchmarks/diagnose_transactions.py hgb-window --data bank --encoder pre --K 15
    .venv/bin/python benchmarks/diagnose_transactions.py surprisal --data bank --encoder pre --cache s.npz
    .venv/bin/python benchmarks/diagnose_transactions.py finetune --data bank --encoder pre --steps 300 \\
        --fraud-share 0.5 [--extra rolling] [--scratch] [--head-inputs surprisal|both --head-hidden 0]
"""

from __future__ import annotations

import argparse
import json
import math
import time

import numpy as np
import torch

from slmlab.train.checkpoint import resolve_checkpoint
from slmlab.transactions._deps import pd
from slmlab.transactions.data.bank import derive_distance, load_bank, prepare_bank
from slmlab.transactions.data.windows import build_windows
from slmlab.transactions.evaluation import baseline
from slmlab.transactions.evaluation import evaluate as evaluation
from slmlab.transactions.heads.fraud import TransactionFraudConfig, TransactionFraudModel, pos_weight_from_counts
from slmlab.transactions.heads.surprisal import field_surprisal
from slmlab.transactions.model import TransactionEncoder


def hgb_window(bank, K: int) -> None:
    """HGB rolling with every per-customer aggregate limited to the customer's last ``K`` rows."""
    plain_stats, plain_build = baseline.window_stats, baseline.build_features

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

    baseline.window_stats, baseline.build_features = capped_stats, capped_build
    try:
        t0 = time.perf_counter()
        s, info = baseline.hgb_scores(bank, rolling=True)
    finally:
        baseline.window_stats, baseline.build_features = plain_stats, plain_build
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
            "fraud_loss": args.loss, "fraud_head_inputs": args.head_inputs, "fraud_hidden": args.head_hidden}
    if args.scratch:
        model = TransactionFraudModel(TransactionFraudConfig.from_config(encoder.config, **over))
    else:
        model = TransactionFraudModel.from_encoder(encoder, **over)
    T, F, k = model.config.max_transactions, len(model.encoder.feature_names), model.encoder.score_index
    extra = rolling_inputs(bank) if args.extra == "rolling" else None
    if extra is not None:
        model.add_module("extra_proj", torch.nn.Linear(extra.shape[1], model.encoder.config.backbone_config().hidden_size))

    def logits(ids, mask, rows):
        h = model.encoder.backbone_forward(torch.from_numpy(ids), torch.from_numpy(mask))
        if extra is None:
            return model.fraud_head(h, torch.from_numpy(ids), torch.from_numpy(mask))
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
        lab, weight = lab[idx], weight[idx]
        for batch in w.take(idx).batches(128):
            part = slice(batch.start, batch.start + len(batch))
            p = logits(batch.host.ids, batch.host.txn_mask, batch.rows).float().numpy()
            keep = (batch.scored if streaming else batch.host.txn_mask) & (lab[part] >= 0)
            ys.append(lab[part][keep])
            ps.append(p[keep])
            ws.append(np.broadcast_to(weight[part, None], keep.shape)[keep])
        model.train()
        y, p, wt = map(np.concatenate, (ys, ps, ws))
        return round(float(average_precision_score(y, p, sample_weight=wt)), 4), round(float(
            roc_auc_score(y, p, sample_weight=wt)), 4)

    enc_p = [p for n, p in model.named_parameters() if n.startswith("encoder.")]
    head_p = [p for n, p in model.named_parameters() if not n.startswith("encoder.")]
    opt = torch.optim.AdamW([{"params": enc_p, "lr": args.lr * args.encoder_lr_scale}, {"params": head_p, "lr": args.lr}],
                            weight_decay=args.weight_decay)
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


@torch.no_grad()
def surprisal_cache(bank, encoder: TransactionEncoder, args) -> dict:
    """Per scored row: surprisal ``[n, score_index]`` (nats), state ``[n, D]``, weight, row index."""
    rng = np.random.default_rng(args.seed)
    T, F, k = encoder.config.max_transactions, len(encoder.feature_names), encoder.score_index
    w = build_windows(bank.encoded(), T, T // 2, row_offsets=bank.starts)
    y_all = bank.df["is_fraud"].fillna(0).to_numpy().astype(np.int8)
    train = bank.period_mask(None, bank.cuts["train_end"])
    end_row = w.rows[:, -1]
    has = (np.where(w.rows >= 0, y_all[np.maximum(w.rows, 0)], 0) == 1).any(1)
    in_train = train[end_row]
    keep = ~in_train | has | (rng.random(len(w)) < args.sample)
    weight = np.where(in_train & ~has, 1 / args.sample, 1.0)
    idx = np.flatnonzero(keep)
    encoder.eval()
    out = {"rows": [], "surprisal": [], "state": [], "weight": []}
    t0 = time.perf_counter()
    weight = weight[idx]
    for batch in w.take(idx).batches(128):
        ids, mask = batch.ids, batch.txn_mask
        h = encoder.backbone_forward(ids, mask)
        sur = field_surprisal(encoder.lm_heads, h, ids, mask, k).numpy()
        st = h[:, k::F].float().numpy()
        scored = batch.scored
        out["rows"].append(batch.rows[scored])
        out["surprisal"].append(sur[scored])
        out["state"].append(st[scored])
        part = weight[batch.start:batch.start + len(batch)]
        out["weight"].append(np.broadcast_to(part[:, None], scored.shape)[scored])
    res = {name: np.concatenate(v) for name, v in out.items()}
    print(f"surprisal cache: {len(idx):,} of {len(w):,} windows, {len(res['rows']):,} rows, "
          f"{time.perf_counter() - t0:.0f} s", flush=True)
    return res


def surprisal_heads(bank, encoder: TransactionEncoder, args) -> None:
    """Small heads on the cached surprisal / state inputs; test metrics on every test transaction."""
    from pathlib import Path

    from sklearn.ensemble import HistGradientBoostingClassifier
    from sklearn.linear_model import LogisticRegression
    from sklearn.metrics import average_precision_score, roc_auc_score
    from sklearn.pipeline import make_pipeline
    from sklearn.preprocessing import StandardScaler

    if args.cache and Path(args.cache).exists():
        c = dict(np.load(args.cache))
    else:
        c = surprisal_cache(bank, encoder, args)
        if args.cache:
            np.savez(args.cache, **c)
    rows = c["rows"]
    period = {"train": bank.period_mask(None, bank.cuts["train_end"]),
              "val": bank.period_mask(bank.cuts["val_start"], bank.cuts["val_end"]),
              "test": bank.period_mask(bank.cuts["test_start"], None)}
    labels = {"train": bank.labels(bank.cuts["train_end"]), "val": bank.labels(bank.cuts["test_start"]),
              "test": bank.df["is_fraud"].fillna(0).to_numpy().astype(np.int8)}
    sel = {}
    for name in period:
        m = period[name][rows] & (labels[name][rows] >= 0)
        sel[name] = (m, labels[name][rows][m])
    ntest = int(period["test"].sum())
    assert sel["test"][0].sum() == ntest, "every test transaction must be scored once"
    scale = np.log(np.asarray(encoder.embedding.vocab_sizes[:encoder.score_index], dtype=np.float64))
    inputs = {"surprisal": c["surprisal"] / scale, "state": c["state"],
              "both": np.c_[c["surprisal"] / scale, c["state"]]}
    names = list(encoder.feature_names[:encoder.score_index])
    ytr = sel["train"][1]
    print(json.dumps({"train_rows": int(sel["train"][0].sum()), "train_frauds": int(ytr.sum()),
                      "val_frauds": int(sel["val"][1].sum()), "test_rows": ntest,
                      "test_frauds": int(sel["test"][1].sum())}), flush=True)
    for name in ("surprisal", "state"):
        x = inputs[name] if name == "surprisal" else None
        if x is not None:  # which fields are surprising on frauds (test, medians)
            m, y = sel["test"]
            med = {f: [round(float(np.median(x[m][y == v, i])), 2) for v in (0, 1)] for i, f in enumerate(names)}
            print(json.dumps({"median scaled surprisal on test, legit vs fraud": med}), flush=True)

    def report(label, make, x):
        t0 = time.perf_counter()
        best = None
        for param, model in make():
            m, y = sel["train"]
            model.fit(x[m], y, **({"logisticregression__sample_weight": c["weight"][m]}
                                  if hasattr(model, "steps") else {"sample_weight": c["weight"][m]}))
            pv = model.predict_proba(x[sel["val"][0]])[:, 1]
            val = average_precision_score(sel["val"][1], pv, sample_weight=c["weight"][sel["val"][0]])
            pt = model.predict_proba(x[sel["test"][0]])[:, 1]
            test = (average_precision_score(sel["test"][1], pt), roc_auc_score(sel["test"][1], pt))
            print(json.dumps({"head": label, "param": param, "val_pr_auc": round(val, 4),
                              "test_pr_auc": round(test[0], 4), "test_roc_auc": round(test[1], 4)}), flush=True)
            if best is None or val > best[0]:
                best = (val, param, test, pt)
        ci = {}
        if args.bootstrap:  # the same customer resamples as `evaluate` (seed 0, test rows in bank order)
            m = sel["test"][0]
            b = evaluation.bootstrap(sel["test"][1], {"s": best[3]}, bank.df["customer_id"].to_numpy()[rows[m]],
                                     args.bootstrap)
            ci = {"test_pr_auc_ci": [round(v, 3) for v in b["s"]["pr_auc"]]}
        print(json.dumps({"head": label, "chosen_by_val": best[1], "test_pr_auc": round(best[2][0], 4), **ci,
                          "test_roc_auc": round(best[2][1], 4), "seconds": round(time.perf_counter() - t0)}),
              flush=True)

    def logistic():
        for C in (0.001, 0.01, 0.1, 1.0):
            yield C, make_pipeline(StandardScaler(), LogisticRegression(C=C, max_iter=2000))

    def hgb():
        for leaf in (50, 200):
            yield leaf, HistGradientBoostingClassifier(learning_rate=0.05, max_iter=300, max_leaf_nodes=31,
                                                       min_samples_leaf=leaf, l2_regularization=1.0, random_state=0)

    heads = {"logistic": logistic, "hgb": hgb}
    for name in args.inputs.split(","):
        for head in args.heads.split(","):
            report(f"{head} on {name}", heads[head], inputs[name])


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("what", choices=("hgb-window", "finetune", "surprisal"))
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
    p.add_argument("--head-inputs", default="state", choices=("state", "surprisal", "both"),
                   help="finetune: the fraud head's inputs (as finetune --head-inputs)")
    p.add_argument("--head-hidden", type=int, default=None, help="finetune: head MLP width (0: logistic)")
    p.add_argument("--weight-decay", type=float, default=0.01, help="finetune: AdamW weight decay")
    p.add_argument("--scratch", action="store_true", help="random encoder weights instead of the pretrained ones")
    p.add_argument("--eval-every", type=int, default=100)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--sample", type=float, default=0.3, help="surprisal: share of fraud-free training windows")
    p.add_argument("--cache", default="", help="surprisal: .npz of the encoder pass (written, or read if present)")
    p.add_argument("--inputs", default="surprisal,both,state", help="surprisal: comma-separated input sets")
    p.add_argument("--heads", default="logistic,hgb", help="surprisal: comma-separated heads")
    p.add_argument("--bootstrap", type=int, default=0, help="surprisal: customer resamples for a test CI")
    p.add_argument("--threads", type=int, default=1)
    args = p.parse_args()
    torch.set_num_threads(args.threads)
    encoder = TransactionEncoder.from_pretrained(str(resolve_checkpoint(args.encoder)))
    data = load_bank(args.data)
    bank = prepare_bank(data.transactions, encoder.config.fitted_schema, data.customers)
    if args.what == "hgb-window":
        hgb_window(bank, args.K)
    elif args.what == "surprisal":
        surprisal_heads(bank, encoder, args)
    else:
        finetune(bank, encoder, args)


if __name__ == "__main__":
    main()
