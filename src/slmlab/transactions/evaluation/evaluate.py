"""Evaluation on the test period: the fraud model against the gradient-boosting baselines, on the same
test transactions, with customer-level bootstrap confidence intervals (docs/transactions.md).

Metrics: PR-AUC (``average_precision_score``, primary), ROC-AUC, recall at FPR <= 1% and <= 0.1%,
daily card precision@100 (each test day, the 100 customers with the highest max score; the share of
them with a fraud that day), and at the validation 1%-FPR threshold (the operating point): per-pattern
recall, amount-weighted recall (the share of the fraud amount alerted) and, per pattern, the detection
delay (how many fraudulent transactions of a case pass before its first alert). Uncertainty: 1,000
resamples of test customers (with replacement), the same resamples for every model, so differences
are paired.
"""

from __future__ import annotations

import json
import time
from pathlib import Path

import numpy as np

from .._deps import pd
from ..data.bank import Bank
from .baseline import HGB_VARIANTS, hgb_scores
from .score import score_bank, score_embed_bank
from .stacking import stacked_scores


def recall_at_fpr(y: np.ndarray, s: np.ndarray, fpr_max: float, w: np.ndarray | None = None) -> float:
    from sklearn.metrics import roc_curve

    fpr, tpr, _ = roc_curve(y, s, sample_weight=w)
    ok = fpr <= fpr_max
    return float(tpr[ok].max()) if ok.any() else 0.0


def threshold_at_fpr(y: np.ndarray, s: np.ndarray, fpr_max: float) -> float:
    """The lowest score threshold whose FPR on (y, s) is <= ``fpr_max``."""
    from sklearn.metrics import roc_curve

    fpr, _, thr = roc_curve(y, s)
    ok = np.flatnonzero(fpr <= fpr_max)
    return float(thr[ok[-1]]) if len(ok) else float("inf")


def card_precision_at_k(df: pd.DataFrame, s: np.ndarray, k: int = 100) -> float:
    """Daily card precision@k: mean over days of the fraud share among the k customers with the
    highest max score that day."""
    t = pd.DataFrame({"day": df["timestamp"].dt.floor("D").to_numpy(), "cust": df["customer_id"].to_numpy(),
                      "s": s, "y": df["is_fraud"].to_numpy()})
    per = t.groupby(["day", "cust"], sort=False).agg(s=("s", "max"), y=("y", "max")).reset_index()
    vals = []
    for _, g in per.groupby("day"):
        top = g.nlargest(min(k, len(g)), "s")
        vals.append(top["y"].mean())
    return float(np.mean(vals)) if vals else float("nan")


def amount_weighted_recall(y: np.ndarray, alert: np.ndarray, amount: np.ndarray) -> float:
    """Share of the fraudulent amount (``|amount|`` of rows with ``y == 1``) that is alerted."""
    a = np.abs(np.asarray(amount, float)) * (np.asarray(y) == 1)
    total = a.sum()
    return float((a * np.asarray(alert, bool)).sum() / total) if total > 0 else float("nan")


def detection_delay(case_id: np.ndarray, pattern: np.ndarray, when: np.ndarray, alert: np.ndarray) -> dict:
    """Per pattern, how many fraudulent transactions of a case pass before its first alert.

    Args:
        case_id, pattern, when, alert: one entry per fraudulent transaction (the case it belongs to,
            its pattern, its time, whether its score reached the threshold).

    Returns:
        ``pattern -> {cases, detected, passed_median, passed_mean, passed_mean_all}``: the number of
        cases, the share with at least one alert, the median and mean number of fraudulent
        transactions before the first alert over detected cases (0 = caught at the first; the
        1-based index of the first alert minus one), and the mean over all cases counting every
        transaction of an undetected case as passed.
    """
    t = pd.DataFrame({"case": case_id, "pattern": pattern, "when": when, "alert": np.asarray(alert, bool)})
    t = t.sort_values(["case", "when"], kind="stable")
    t["k"] = t.groupby("case").cumcount()
    per_case = t.groupby("case").agg(pattern=("pattern", "first"), n=("k", "size"))
    per_case["first"] = t[t["alert"]].groupby("case")["k"].min().reindex(per_case.index).astype(float)
    out = {}
    for p, g in per_case.groupby("pattern"):
        hit = g["first"].notna()
        passed_all = np.where(hit, g["first"], g["n"])
        out[str(p)] = {"cases": int(len(g)), "detected": float(hit.mean()),
                       "passed_median": float(g["first"][hit].median()) if hit.any() else float("nan"),
                       "passed_mean": float(g["first"][hit].mean()) if hit.any() else float("nan"),
                       "passed_mean_all": float(passed_all.mean())}
    return out


def point_metrics(y: np.ndarray, s: np.ndarray, w: np.ndarray | None = None) -> dict:
    from sklearn.metrics import average_precision_score, roc_auc_score

    if len(np.unique(y)) < 2:  # no positives (or no negatives): nothing to rank
        return {k: float("nan") for k in ("pr_auc", "roc_auc", "recall_at_fpr_1pct", "recall_at_fpr_0.1pct")}
    return {"pr_auc": float(average_precision_score(y, s, sample_weight=w)),
            "roc_auc": float(roc_auc_score(y, s, sample_weight=w)),
            "recall_at_fpr_1pct": recall_at_fpr(y, s, 0.01, w), "recall_at_fpr_0.1pct": recall_at_fpr(y, s, 0.001, w)}


def bootstrap(y: np.ndarray, scores: dict[str, np.ndarray], customers: np.ndarray, n: int = 1000, seed: int = 0,
              pairs: list[tuple[str, str]] = ()) -> dict:
    """95% CIs of PR-AUC, ROC-AUC and recall at 0.1% FPR per model and of paired differences (``a - b``:
    ``pr_auc`` CI and ``mean``, ``recall_at_fpr_0.1pct`` CI and ``recall_mean``), resampling customers.
    ROC-AUC and the recall come from one weighted ROC curve per resample."""
    from sklearn.metrics import auc, average_precision_score, roc_curve

    codes, uniq = pd.factorize(customers)
    rng = np.random.default_rng(seed)
    draws = {name: {"pr_auc": [], "roc_auc": [], "recall_at_fpr_0.1pct": []} for name in scores}
    for _ in range(n):
        w = np.bincount(rng.integers(0, len(uniq), len(uniq)), minlength=len(uniq))[codes].astype(float)
        if (w * y).sum() == 0 or (w * (1 - y)).sum() == 0:
            continue
        for name, s in scores.items():
            draws[name]["pr_auc"].append(average_precision_score(y, s, sample_weight=w))
            fpr, tpr, _ = roc_curve(y, s, sample_weight=w)
            draws[name]["roc_auc"].append(auc(fpr, tpr))
            draws[name]["recall_at_fpr_0.1pct"].append(float(tpr[fpr <= 0.001].max()) if (fpr <= 0.001).any() else 0.0)
    out = {}
    for name, d in draws.items():
        out[name] = {m: _ci(v) for m, v in d.items()}
    for a, b in pairs:
        diff = np.array(draws[a]["pr_auc"]) - np.array(draws[b]["pr_auc"])
        rdiff = np.array(draws[a]["recall_at_fpr_0.1pct"]) - np.array(draws[b]["recall_at_fpr_0.1pct"])
        out[f"{a} - {b}"] = {"pr_auc": _ci(diff), "mean": float(diff.mean()) if len(diff) else float("nan"),
                             "recall_at_fpr_0.1pct": _ci(rdiff),
                             "recall_mean": float(rdiff.mean()) if len(rdiff) else float("nan")}
    out["resamples"] = len(next(iter(draws.values()))["pr_auc"]) if draws else 0
    return out


def _ci(values) -> list[float]:
    v = np.asarray(values, dtype=float)
    return [float(np.percentile(v, 2.5)), float(np.percentile(v, 97.5))] if len(v) else [float("nan")] * 2


def evaluate_models(bank: Bank, fraud_model=None, out_dir: str | Path | None = None, n_boot: int = 1000,
                    device="cpu", extra: dict | None = None, progress: bool = False, stacking: bool = False,
                    models: dict | None = None, pairs: list[tuple[str, str]] = ()) -> dict:
    """Score the test period with every model, compute the metrics and write the report folder
    (``report.md``, ``metrics.json``, ``pr_curve.png``). Returns the metrics dict.

    Args:
        stacking: also the stacked models of :mod:`slmlab.transactions.evaluation.stacking` (needs ``fraud_model``;
            its scores then come from the same one-pass scoring of every row).
        models: further fraud models (name -> model) scored like ``fraud_model``, e.g. the
            label-fraction pair; ``pairs``: further paired differences to bootstrap.
    """
    if stacking and fraud_model is None:
        raise ValueError("stacking needs the fine-tuned fraud model; pass --model (a fine-tuned run folder)")
    df = bank.df
    test = bank.period_mask(bank.cuts["test_start"], None)
    val = bank.period_mask(bank.cuts["val_start"], bank.cuts["val_end"])
    if bank.holdout:
        test &= df["customer_id"].isin(bank.holdout).to_numpy()
    timings, info = {}, {}
    all_scores: dict[str, np.ndarray] = {}
    for name, kw in HGB_VARIANTS.items():
        all_scores[name], info[name] = hgb_scores(bank, **kw)
        timings[name] = info[name]["total_seconds"]
    if fraud_model is not None and stacking:
        t0 = time.perf_counter()
        all_scores["sequence"], emb = score_embed_bank(fraud_model, bank, device=device, progress=progress)
        timings["sequence_scoring_all_rows"] = time.perf_counter() - t0
        stacked, stack_info = stacked_scores(bank, all_scores["sequence"], emb)
        all_scores.update(stacked)
        info.update(stack_info)
        timings.update({k: v["total_seconds"] for k, v in stack_info.items()})
    elif fraud_model is not None:
        t0 = time.perf_counter()
        all_scores["sequence"] = score_bank(fraud_model, bank, bank.cuts["val_start"], device=device, progress=progress)
        timings["sequence_scoring"] = time.perf_counter() - t0
    for name, m in (models or {}).items():
        t0 = time.perf_counter()
        all_scores[name] = score_bank(m, bank, bank.cuts["val_start"], device=device, progress=progress)
        timings[f"{name}_scoring"] = time.perf_counter() - t0
    y_all = df["is_fraud"].fillna(0).to_numpy().astype(int)
    y = y_all[test]
    y_val = bank.labels(bank.cuts["test_start"])
    val_ok = val & (y_val >= 0)
    result: dict = {"n_test": int(test.sum()), "n_test_fraud": int(y.sum()), "models": {}, "timings_s": timings,
                    "cuts": {k: str(v) for k, v in bank.cuts.items()}}
    ftype = df["fraud_type"].astype(str).to_numpy() if "fraud_type" in df else np.array(["nan"] * len(df))
    for name, s in all_scores.items():
        st = s[test]
        m = point_metrics(y, st)
        m["card_precision_at_100"] = card_precision_at_k(df[test], st)
        thr = threshold_at_fpr(y_val[val_ok], s[val_ok], 0.01) if y_val[val_ok].sum() else float("inf")
        m["val_threshold_1pct"] = thr
        alert = st >= thr
        m["per_pattern_recall"] = {p: float(alert[(ftype[test] == p)].mean()) for p in np.unique(ftype[test][y == 1])}
        m["amount_weighted_recall"] = amount_weighted_recall(y, alert, df["amount"].to_numpy()[test])
        fr = y == 1
        if "fraud_case_id" in df and fr.any():
            m["detection_delay"] = detection_delay(df["fraud_case_id"].astype(str).to_numpy()[test][fr], ftype[test][fr],
                                                   df["timestamp"].to_numpy()[test][fr], alert[fr])
        result["models"][name] = m
    seq_pairs = [("sequence", "hgb_rolling"), ("sequence", "hgb_raw")] if fraud_model is not None else []
    pairs = [*seq_pairs, ("hgb_rolling", "hgb_raw"), ("hgb_rolling_risk", "hgb_rolling"),
             *[(name, "hgb_rolling") for name in all_scores if name.startswith("stacked")], *pairs]
    result["bootstrap"] = bootstrap(y, {k: v[test] for k, v in all_scores.items()}, df["customer_id"].to_numpy()[test],
                                    n_boot, pairs=pairs)
    result["hgb"] = {k: {kk: vv for kk, vv in v.items() if kk != "features"} for k, v in info.items()}
    result.update(extra or {})
    result["criteria"] = usefulness_criteria(result)
    if out_dir is not None:
        write_report(result, {k: v[test] for k, v in all_scores.items()}, y, Path(out_dir))
    return result


def _criterion(result: dict, name: str, a: str, b: str, rule: str, min_pr: float, need_ci: bool,
               min_recall: float | None = None) -> dict | None:
    """One criterion on the paired difference ``a - b``: the point differences on the whole test set,
    their bootstrap CIs, and whether ``rule`` is met."""
    models, boot = result["models"], result["bootstrap"]
    key = f"{a} - {b}"
    if a not in models or b not in models or key not in boot:
        return None
    d_pr = models[a]["pr_auc"] - models[b]["pr_auc"]
    d_rec = models[a]["recall_at_fpr_0.1pct"] - models[b]["recall_at_fpr_0.1pct"]
    ci, rci = boot[key]["pr_auc"], boot[key].get("recall_at_fpr_0.1pct", [float("nan")] * 2)
    met = d_pr >= min_pr and (ci[0] > 0 or not need_ci)
    if min_recall is not None:
        met = met or d_rec >= min_recall
    return {"criterion": name, "difference": key, "rule": rule, "pr_auc_diff": float(d_pr), "pr_auc_ci": ci,
            "recall_0.1pct_diff": float(d_rec), "recall_0.1pct_ci": rci, "met": bool(met)}


def usefulness_criteria(result: dict) -> list[dict]:
    """When the sequence model counts as useful, on the test set with paired customer-bootstrap CIs:

    1. parity: sequence - HGB-rolling PR-AUC >= -0.01;
    2. useful: stacked - HGB-rolling PR-AUC >= 0.03 with the CI excluding 0, or recall at 0.1% FPR
       >= 0.05 (for each stacked variant present);
    3. strong: sequence - HGB-rolling PR-AUC >= 0.03 with the CI excluding 0;
    4. pretraining pays: with a fraction of the labels, pretrained - from-scratch PR-AUC >= 0.05.

    Criteria whose models were not evaluated are left out.
    """
    out = [_criterion(result, "1 parity", "sequence", "hgb_rolling", "PR-AUC diff >= -0.01", -0.01, False)]
    for name in result["models"]:
        if name.startswith("stacked"):
            out.append(_criterion(result, f"2 useful ({name})", name, "hgb_rolling",
                                  "PR-AUC diff >= 0.03 with CI > 0, or recall@0.1%FPR diff >= 0.05", 0.03, True, 0.05))
    out.append(_criterion(result, "3 strong", "sequence", "hgb_rolling", "PR-AUC diff >= 0.03 with CI > 0", 0.03, True))
    out.append(_criterion(result, "4 pretraining pays", "lf_pretrained", "lf_scratch", "PR-AUC diff >= 0.05", 0.05,
                          False))
    return [c for c in out if c is not None]


def write_report(result: dict, scores: dict[str, np.ndarray], y: np.ndarray, out: Path) -> None:
    """``metrics.json``, ``report.md`` and ``pr_curve.png`` (matplotlib, when installed)."""
    out.mkdir(parents=True, exist_ok=True)
    (out / "metrics.json").write_text(json.dumps(result, indent=1, default=str))
    lines = ["# Fraud evaluation (test period)", "",
             f"Test transactions: {result['n_test']:,}, frauds: {result['n_test_fraud']:,}.", "",
             "| model | PR-AUC [95% CI] | ROC-AUC | recall@1%FPR | recall@0.1%FPR | card precision@100 |",
             "|---|---|---|---|---|---|"]
    boot = result["bootstrap"]
    for name, m in result["models"].items():
        ci = boot.get(name, {}).get("pr_auc", [float("nan")] * 2)
        lines.append(f"| {name} | {m['pr_auc']:.3f} [{ci[0]:.3f}, {ci[1]:.3f}] | {m['roc_auc']:.3f} |"
                     f" {m['recall_at_fpr_1pct']:.3f} | {m['recall_at_fpr_0.1pct']:.3f} | {m['card_precision_at_100']:.3f} |")
    lines += ["", "Paired PR-AUC differences (same customer resamples):", ""]
    for key, v in boot.items():
        if " - " in key:
            r = v.get("recall_at_fpr_0.1pct", [float("nan")] * 2)
            lines.append(f"- {key}: mean {v['mean']:+.3f}, 95% CI [{v['pr_auc'][0]:+.3f}, {v['pr_auc'][1]:+.3f}];"
                         f" recall@0.1%FPR mean {v.get('recall_mean', float('nan')):+.3f}, [{r[0]:+.3f}, {r[1]:+.3f}]")
    if result.get("criteria"):
        lines += ["", "When the sequence model counts as useful (differences on the whole test set, paired 95% CIs):",
                  "", "| criterion | difference | rule | PR-AUC diff [CI] | recall@0.1%FPR diff [CI] | met |",
                  "|---|---|---|---|---|---|"]
        for c in result["criteria"]:
            ci, rci = c["pr_auc_ci"], c["recall_0.1pct_ci"]
            lines.append(f"| {c['criterion']} | {c['difference']} | {c['rule']} | {c['pr_auc_diff']:+.3f}"
                         f" [{ci[0]:+.3f}, {ci[1]:+.3f}] | {c['recall_0.1pct_diff']:+.3f} [{rci[0]:+.3f}, {rci[1]:+.3f}]"
                         f" | {'met' if c['met'] else 'not met'} |")
    lines += ["", "At the validation 1%-FPR threshold: per-pattern recall and amount-weighted recall:", ""]
    for name, m in result["models"].items():
        lines.append(f"- {name}: " + ", ".join(f"{p} {r:.2f}" for p, r in m["per_pattern_recall"].items())
                     + f"; amount-weighted {m['amount_weighted_recall']:.2f}")
    lines += ["", "Detection delay at that threshold, per pattern: cases detected, and fraudulent transactions",
              "passed before the first alert (median / mean over detected cases; mean over all cases, an",
              "undetected case counting all of its transactions):", ""]
    for name, m in result["models"].items():
        parts = [f"{p} {d['detected'] * d['cases']:.0f}/{d['cases']} detected, passed {d['passed_median']:.1f} /"
                 f" {d['passed_mean']:.2f}; all {d['passed_mean_all']:.2f}" for p, d in m.get("detection_delay", {}).items()]
        lines.append(f"- {name}: " + ("; ".join(parts) or "no fraud cases in the test period"))
    (out / "report.md").write_text("\n".join(lines) + "\n")
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
        from sklearn.metrics import precision_recall_curve
    except ImportError:
        return
    fig, ax = plt.subplots(figsize=(5.5, 4.2))
    for name, s in scores.items():
        p, r, _ = precision_recall_curve(y, s)
        ax.plot(r, p, label=f"{name} (AP {result['models'][name]['pr_auc']:.3f})")
    ax.set_xlabel("recall")
    ax.set_ylabel("precision")
    ax.set_title("Test-period precision-recall")
    ax.legend(loc="upper right", fontsize=8)
    fig.tight_layout()
    fig.savefig(out / "pr_curve.png", dpi=120)
    plt.close(fig)
