"""Evaluation on the test period: the fraud model against the gradient-boosting baselines, on the same
test transactions, with customer-level bootstrap confidence intervals (docs/transactions.md).

Metrics: PR-AUC (``average_precision_score``, primary), ROC-AUC, recall at FPR <= 1% and <= 0.1%,
daily card precision@100 (each test day, the 100 customers with the highest max score; the share of
them with a fraud that day; all of them on a day with fewer), and at the validation 1%-FPR threshold
(the operating point, :func:`operating_threshold`: set by the validation negatives, finite always):
per-pattern recall, amount-weighted recall (the share of the fraud amount alerted) and, per pattern, the
detection delay (how many fraudulent transactions of a case pass before its first alert). Uncertainty:
1,000 resamples of test customers (with replacement), the same resamples for every model, so differences
are paired; the usefulness criteria are decided on those paired CIs (:func:`verdict`: met, not met or
undecided).
"""

from __future__ import annotations

import math
import numbers
import time
from pathlib import Path

import numpy as np

from ...outputs import dumps_finite
from .._deps import pd
from ..data.bank import Bank
from .augmented import cached_encoder_scores, encoder_shift
from .baseline import HGB_VARIANTS, cached_hgb_scores, data_key, token_lr_scores
from .cache import cached_scores, weights_key
from .kinds import ModelKind, fraud_model_kind, kind_of
from .score import score_bank
from .stacking import stacked_scores


def recall_at_fpr(y: np.ndarray, s: np.ndarray, fpr_max: float, w: np.ndarray | None = None) -> float:
    from sklearn.metrics import roc_curve

    fpr, tpr, _ = roc_curve(y, s, sample_weight=w)
    ok = fpr <= fpr_max
    return float(tpr[ok].max()) if ok.any() else 0.0


FALLBACK_THRESHOLD = 0.5  # the alert threshold when there is no negative to set one from


def operating_threshold(y: np.ndarray, s: np.ndarray, fpr_max: float, fallback: float = FALLBACK_THRESHOLD) -> dict:
    """The alert threshold at FPR <= ``fpr_max`` on labelled rows ``(y, s)`` (validation), always finite.

    Rule: let ``k = floor(fpr_max * n_neg)`` (how many negatives may be alerted) and ``n*`` the
    ``(k+1)``-th highest negative score; alerts are ``score >= threshold`` and the threshold is the
    lowest score of ``s`` strictly above ``n*`` (so at most ``k`` negatives are alerted), or, when no
    score lies above ``n*``, the next float above it. Only negatives set it, so no positive is needed.
    ``roc_curve(..., drop_intermediate=False)`` gives the same value where its threshold is finite (and
    ``inf`` where this rule goes above every negative); its default ``drop_intermediate=True`` drops
    collinear points and can stop short of ``fpr_max`` (0.60% instead of 1% for HGB-rolling on the
    ``small`` bank). Rows with a NaN score are dropped.

    Returns ``{"threshold", "source", "fpr", "negatives", "positives"}``; ``fpr`` is the realised FPR on
    ``(y, s)``. ``source``: ``"validation"``; ``"validation, above every negative"`` when the threshold
    lies above the highest negative (fewer than ``1 / fpr_max`` negatives, or ties at the top), so the
    realised FPR is 0; ``"fallback <fallback>: no negatives"`` when there is no negative at all.
    """
    y, s = np.asarray(y), np.asarray(s, dtype=float)
    ok = ~np.isnan(s)
    y, s = y[ok], s[ok]
    neg = np.sort(s[y == 0])[::-1]
    info = {"negatives": int(len(neg)), "positives": int((y == 1).sum())}
    if not len(neg):
        return {"threshold": float(fallback), "source": f"fallback {fallback:g}: no negatives", "fpr": float("nan"),
                **info}
    k = int(np.floor(fpr_max * len(neg) + 1e-9))
    if k >= len(neg):
        thr = float(s.min())
    else:
        above = s[s > neg[k]]
        thr = float(above.min()) if len(above) else float(np.nextafter(neg[k], np.inf))
    source = "validation, above every negative" if thr > neg[0] else "validation"
    return {"threshold": thr, "source": source, "fpr": float((neg >= thr).mean()), **info}


def threshold_at_fpr(y: np.ndarray, s: np.ndarray, fpr_max: float) -> float:
    """The lowest score threshold whose FPR on (y, s) is <= ``fpr_max`` (:func:`operating_threshold`)."""
    return operating_threshold(y, s, fpr_max)["threshold"]


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
              pairs: list[tuple[str, str]] = (), arms: dict[str, list[str]] | None = None) -> dict:
    """95% CIs of PR-AUC, ROC-AUC and recall at 0.1% FPR per model and of paired differences (``a - b``:
    ``pr_auc`` CI and ``mean``, ``recall_at_fpr_0.1pct`` CI and ``recall_mean``), resampling customers.
    ROC-AUC and the recall come from one weighted ROC curve per resample. ``arms``: arm name -> the
    models that are its seeds; the difference of the first two arms is bootstrapped over customers and
    seeds together (:func:`arm_difference`) under ``"<arm a> - <arm b>"``."""
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
    if arms:
        (a, names_a), (b, names_b) = list(arms.items())[:2]
        out[f"{a} - {b}"] = {"seeds": {a: list(names_a), b: list(names_b)}}
        for metric, mean_key in (("pr_auc", "mean"), ("recall_at_fpr_0.1pct", "recall_mean")):
            d = arm_difference(np.array([draws[m][metric] for m in names_a]).T,
                               np.array([draws[m][metric] for m in names_b]).T, seed)
            out[f"{a} - {b}"].update({metric: d["ci"], mean_key: d["mean"]})
    out["resamples"] = len(next(iter(draws.values()))["pr_auc"]) if draws else 0
    return out


def arm_difference(draws_a: np.ndarray, draws_b: np.ndarray, seed: int = 0) -> dict:
    """CI of ``mean(arm a) - mean(arm b)`` over seeds, with the seed variance in it.

    ``draws_a [n, k_a]``, ``draws_b [n, k_b]``: a metric per customer resample (rows, the same resamples
    for every model) and per seed (columns). Each resample also redraws each arm's seeds with
    replacement (a two-level bootstrap: customers, then seeds), so two arms whose seeds disagree get a
    CI at least as wide as that disagreement. Returns ``{"ci": [lo, hi], "mean": ...}``; with one seed
    per arm it is the plain paired difference."""
    a, b = np.asarray(draws_a, float), np.asarray(draws_b, float)
    if not len(a):
        return {"ci": [float("nan")] * 2, "mean": float("nan")}
    rng = np.random.default_rng(seed + 1)
    ia = rng.integers(0, a.shape[1], a.shape)
    ib = rng.integers(0, b.shape[1], b.shape)
    diff = np.take_along_axis(a, ia, 1).mean(1) - np.take_along_axis(b, ib, 1).mean(1)
    return {"ci": _ci(diff), "mean": float(a.mean() - b.mean())}


def _ci(values) -> list[float]:
    v = np.asarray(values, dtype=float)
    return [float(np.percentile(v, 2.5)), float(np.percentile(v, 97.5))] if len(v) else [float("nan")] * 2


SEQUENCE_FLOOR = "token_lr"  # every sequence recipe is reported against this per-row floor


def _model_scores(model, bank: Bank, cache_dir, key, device, progress) -> np.ndarray:
    """A fraud model's scores from the validation cut on (:func:`.score.score_bank`), through the cache
    (:mod:`.cache`) keyed by the bank and the model's weights: scoring the validation and test periods of
    a 2.8M-row bank takes a CPU-thread about 20 minutes per model, and a second report of the same run
    folder (or a rerun of the same seeded few-label fine-tunes) gives the same scores."""
    def compute():
        return score_bank(model, bank, bank.cuts["val_start"], device=device, progress=progress), {}

    if cache_dir is None:  # no cache: no weights to hash
        return compute()[0]
    since = str(bank.cuts["val_start"])
    return cached_scores(cache_dir, "fraud_model", key, [weights_key(model), since], len(bank.df), compute)[0]


def _all_scores(bank: Bank, fraud_model, encoder, models: dict, cache_dir, device, progress, stacking: bool,
                kinds: dict[str, ModelKind]):
    """Every model's scores ``[N]``, the fit info and the timings of :func:`evaluate_models` (``kinds``:
    the further models')."""
    timings, info = {}, {}
    all_scores: dict[str, np.ndarray] = {}
    key = data_key(bank) if cache_dir is not None else None
    for name, kw in HGB_VARIANTS.items():
        all_scores[name], info[name] = cached_hgb_scores(bank, name, kw, cache_dir, key)
        timings[name] = info[name]["total_seconds"]
    all_scores[SEQUENCE_FLOOR], info[SEQUENCE_FLOOR] = token_lr_scores(bank)
    timings[SEQUENCE_FLOOR] = info[SEQUENCE_FLOOR]["total_seconds"]
    if encoder is not None:
        t0 = time.perf_counter()
        all_scores["hgb_rolling_encoder"], info["hgb_rolling_encoder"] = cached_encoder_scores(
            bank, encoder, cache_dir, key, device, progress)
        info["hgb_rolling_encoder"]["encoder_shift"] = encoder_shift(encoder, bank, device=device)
        timings["hgb_rolling_encoder"] = time.perf_counter() - t0
    named = {"sequence": fraud_model} if fraud_model is not None else {}
    for name, m in {**named, **(models or {})}.items():
        t0 = time.perf_counter()
        all_scores[name] = _model_scores(m, bank, cache_dir, key, device, progress)
        timings[f"{name}_scoring"] = time.perf_counter() - t0
    if fraud_model is not None and stacking:
        all_scores["stacked"], info["stacked"] = stacked_scores(bank, all_scores, kinds=kinds)
    return all_scores, info, timings


def _model_metrics(bank: Bank, s: np.ndarray, test: np.ndarray, y: np.ndarray, y_val: np.ndarray,
                   val_ok: np.ndarray, ftype: np.ndarray) -> dict:
    """One model's row: point metrics on test, the PR-AUC on the validation period (``val_pr_auc``: the
    period every model's choices were made on, so a drop from it to test is drift or selection, not
    noise alone), and at its validation 1%-FPR threshold the per-pattern, amount-weighted recall and the
    detection delay."""
    df = bank.df
    st = s[test]
    m = point_metrics(y, st)
    scored = val_ok & np.isfinite(s)
    m["val_pr_auc"] = point_metrics(y_val[scored], s[scored])["pr_auc"]
    m["card_precision_at_100"] = card_precision_at_k(df[test], st)
    op = operating_threshold(y_val[val_ok], s[val_ok], 0.01)
    thr = op["threshold"]
    m["val_threshold_1pct"], m["threshold_source"], m["val_threshold_fpr"] = thr, op["source"], op["fpr"]
    m["val_threshold_counts"] = {"negatives": op["negatives"], "positives": op["positives"]}
    alert = st >= thr
    m["per_pattern_recall"] = {p: float(alert[(ftype[test] == p)].mean()) for p in np.unique(ftype[test][y == 1])}
    m["amount_weighted_recall"] = amount_weighted_recall(y, alert, df["amount"].to_numpy()[test])
    fr = y == 1
    if "fraud_case_id" in df and fr.any():
        m["detection_delay"] = detection_delay(df["fraud_case_id"].astype(str).to_numpy()[test][fr], ftype[test][fr],
                                               df["timestamp"].to_numpy()[test][fr], alert[fr])
    return m


def evaluate_models(bank: Bank, fraud_model=None, out_dir: str | Path | None = None, n_boot: int = 1000,
                    device="cpu", extra: dict | None = None, progress: bool = False, stacking: bool = True,
                    models: dict | None = None, pairs: list[tuple[str, str]] = (), cache_dir: str | Path | None = None,
                    encoder=None, primary: str | None = None, arms: dict[str, list[str]] | None = None) -> dict:
    """Score the test period with every model, compute the metrics and write the report folder
    (``report.md``, ``metrics.json``, ``pr_curve.png``). Returns the metrics dict.

    Rows: ``hgb_raw``, ``hgb_rolling``, ``hgb_rolling_risk`` and the per-row floor ``token_lr`` always;
    ``hgb_rolling_encoder`` with ``encoder`` (a pretrained, label-free
    :class:`~slmlab.transactions.model.TransactionEncoder`: :mod:`.augmented`); ``sequence`` and (``stacking``,
    default) ``stacked`` (:mod:`.stacking`) with ``fraud_model``.

    Args:
        models: further fraud models (name -> model) scored like ``fraud_model``, e.g. the
            label-fraction seeds or a joint-fusion model (whose head reads tabular features: a fused
            model and a stacker input, :mod:`.kinds`); ``pairs``: further paired differences to bootstrap.
        cache_dir: where the costly scores are kept between evaluations of the same bank (:mod:`.cache`):
            the boosters', ``hgb_rolling_encoder``'s (per encoder) and each fraud model's (per weights);
            None: always computed.
        primary: criterion 2's one pre-declared comparison (``stacked``, ``hgb_rolling_encoder`` or a joint
            model, against ``hgb_rolling``); default ``stacked`` with a fraud model, else
            ``hgb_rolling_encoder``. The other fused models are shown as secondary, not counted.
        arms: arm name -> its seeds' model names (two arms: criterion 4's pretrained and scratch).
    """
    kinds = {name: fraud_model_kind(model) for name, model in (models or {}).items()}
    rows = ["stacked"] * (fraud_model is not None and stacking) + ["hgb_rolling_encoder"] * (encoder is not None)
    fused = [name for name in [*rows, *(models or {})] if kind_of(name, kinds).fused]
    primary = primary or ("stacked" if "stacked" in fused else "hgb_rolling_encoder")
    if fused and primary not in fused:
        raise ValueError(f"the primary comparison {primary!r} is not among the fused models evaluated {fused}")
    all_scores, info, timings = _all_scores(bank, fraud_model, encoder, models, cache_dir, device, progress, stacking,
                                            kinds)
    df = bank.df
    test = bank.period_mask(bank.cuts["test_start"], None)
    val = bank.period_mask(bank.cuts["val_start"], bank.cuts["val_end"])
    if bank.holdout:
        test &= df["customer_id"].isin(bank.holdout).to_numpy()
    y = df["is_fraud"].fillna(0).to_numpy().astype(int)[test]
    y_val = bank.labels(bank.cuts["test_start"])
    result: dict = {"n_test": int(test.sum()), "n_test_fraud": int(y.sum()), "models": {}, "timings_s": timings,
                    "cuts": {k: str(v) for k, v in bank.cuts.items()}, "primary": f"{primary} - hgb_rolling"}
    ftype = df["fraud_type"].astype(str).to_numpy() if "fraud_type" in df else np.array(["nan"] * len(df))
    for name, s in all_scores.items():
        result["models"][name] = _model_metrics(bank, s, test, y, y_val, val & (y_val >= 0), ftype)
    if "stacked" in info:
        result["models"]["stacked"]["stacker"] = {k: v for k, v in info["stacked"].items()}
    recipes = [name for name in all_scores if kind_of(name, kinds).recipe]
    seq_pairs = [("sequence", "hgb_rolling"), ("sequence", "hgb_raw")] if fraud_model is not None else []
    pairs = [*seq_pairs, ("hgb_rolling", "hgb_raw"), ("hgb_rolling_risk", "hgb_rolling"),
             *[(name, "hgb_rolling") for name in all_scores if kind_of(name, kinds).fused],
             *[(name, SEQUENCE_FLOOR) for name in recipes], *pairs]
    result["bootstrap"] = bootstrap(y, {k: v[test] for k, v in all_scores.items()}, df["customer_id"].to_numpy()[test],
                                    n_boot, pairs=list(dict.fromkeys(pairs)), arms=arms)
    result["floor"] = {name: _floor(result, name) for name in recipes}
    result["hgb"] = {k: {kk: vv for kk, vv in v.items() if kk != "features"} for k, v in info.items()}
    if arms:
        result["arms"] = {arm: _arm_means(result["models"], names) for arm, names in arms.items()}
    result.update(extra or {})
    result["criteria"] = usefulness_criteria(result, kinds)
    if out_dir is not None:
        write_report(result, {k: v[test] for k, v in all_scores.items()}, y, Path(out_dir))
    return result


def _floor(result: dict, name: str) -> dict:
    """Does the sequence recipe ``name`` beat ``token_lr``? The paired PR-AUC difference, its CI and the
    verdict of "difference > 0" (``above``, ``not above`` or ``undecided``)."""
    key = f"{name} - {SEQUENCE_FLOOR}"
    ci = result["bootstrap"][key]["pr_auc"]
    v = verdict(ci, 0.0)
    return {"difference": key, "pr_auc_diff": result["models"][name]["pr_auc"] - result["models"][SEQUENCE_FLOOR]["pr_auc"],
            "pr_auc_ci": ci, "verdict": {"met": "above", "not met": "not above"}.get(v, v)}


def _arm_means(models: dict, names: list[str]) -> dict:
    """An arm's metrics: the mean over its seeds, and each seed's PR-AUC."""
    return {"seeds": list(names), "pr_auc_by_seed": [models[n]["pr_auc"] for n in names],
            **{k: float(np.mean([models[n][k] for n in names])) for k in ("pr_auc", "recall_at_fpr_0.1pct")}}


def verdict(ci, threshold: float) -> str:
    """The decision of a rule "difference >= ``threshold``" from the 95% CI ``[lo, hi]`` of the difference:
    ``"met"`` when ``lo >= threshold`` (the whole CI on the right side), ``"not met"`` when
    ``hi < threshold`` (the whole CI on the wrong side), else ``"undecided"`` (the CI straddles the
    threshold: the data cannot decide); also ``"undecided"`` when the CI is not finite (no resamples)."""
    lo, hi = (float(v) for v in ci)
    if not (np.isfinite(lo) and np.isfinite(hi)):
        return "undecided"
    return "met" if lo >= threshold else "not met" if hi < threshold else "undecided"


def any_verdict(verdicts) -> str:
    """Verdict of "any of these rules": met if one is met, not met if all are not met, else undecided."""
    verdicts = list(verdicts)
    return "met" if "met" in verdicts else "not met" if all(v == "not met" for v in verdicts) else "undecided"


def _half_width(ci) -> float:
    return float((ci[1] - ci[0]) / 2)


def _criterion(result: dict, name: str, a: str, b: str, min_pr: float, min_recall: float | None = None,
               models: dict | None = None) -> dict | None:
    """One criterion on the paired difference ``a - b``: met when PR-AUC diff >= ``min_pr`` (or, given
    ``min_recall``, recall at 0.1% FPR diff >= ``min_recall``), decided on the bootstrap CIs by
    :func:`verdict`; the point differences on the whole test set are reported beside them. ``models``:
    where ``a`` and ``b``'s metrics are read (default the report's rows; criterion 4: its arms)."""
    models, boot = models if models is not None else result["models"], result["bootstrap"]
    key = f"{a} - {b}"
    if a not in models or b not in models or key not in boot:
        return None
    nan2 = [float("nan")] * 2
    d_pr = models[a]["pr_auc"] - models[b]["pr_auc"]
    d_rec = models[a]["recall_at_fpr_0.1pct"] - models[b]["recall_at_fpr_0.1pct"]
    ci, rci = boot[key].get("pr_auc", nan2), boot[key].get("recall_at_fpr_0.1pct", nan2)
    rule = f"PR-AUC diff >= {min_pr:+.2f}"
    verdicts = {"pr_auc": verdict(ci, min_pr)}
    if min_recall is not None:
        rule += f", or recall@0.1%FPR diff >= {min_recall:+.2f}"
        verdicts["recall_0.1pct"] = verdict(rci, min_recall)
    out = {"criterion": name, "difference": key, "rule": rule, "pr_auc_threshold": min_pr,
           "pr_auc_diff": float(d_pr), "pr_auc_ci": ci, "pr_auc_ci_half_width": _half_width(ci),
           "recall_0.1pct_diff": float(d_rec), "recall_0.1pct_ci": rci, "recall_0.1pct_ci_half_width": _half_width(rci),
           "verdicts": verdicts, "verdict": any_verdict(verdicts.values()), "counted": True}
    if min_recall is not None:
        out["recall_0.1pct_threshold"] = min_recall
    return out


CRITERIA_MARGINS = {"1 parity": -0.01, "2 useful": 0.03, "2 useful (recall)": 0.05, "3 strong": 0.03,
                    "4 pretraining pays": 0.05}


def usefulness_criteria(result: dict, kinds: dict[str, ModelKind] | None = None) -> list[dict]:
    """When the sequence model counts as useful, on the test set with paired customer-bootstrap CIs:

    1. parity: sequence - HGB-rolling PR-AUC >= -0.01;
    2. useful: the report's one pre-declared primary (``result["primary"]``, e.g. ``"stacked -
       hgb_rolling"``; default ``stacked``) PR-AUC >= +0.03, or recall at 0.1% FPR >= +0.05. Every other
       fused model present (a row whose kind is fused: ``stacked``, ``hgb_rolling_encoder``, joint fusion;
       ``kinds``: the further models' kinds, :func:`~.kinds.kind_of`) is shown as ``2 useful, secondary
       (<name>)`` with ``counted: False``: several comparisons are never pooled into one "any of them
       passed";
    3. strong: sequence - HGB-rolling PR-AUC >= +0.03;
    4. pretraining pays: with a fraction of the labels, pretrained - from-scratch PR-AUC >= +0.05; with
       ``result["arms"]`` (seeds per arm) the arms' seed means, the CI over customers and seeds.

    Each rule is decided on the 95% CI of its paired difference (:func:`verdict`): ``met`` when the CI's
    lower bound is at or above the margin, ``not met`` when its upper bound is below it, ``undecided``
    when the CI straddles it (criterion 2: met if either rule is met, not met if both are not met).
    Criteria whose models were not evaluated are left out.
    """
    m = CRITERIA_MARGINS
    primary = result.get("primary", "stacked - hgb_rolling").split(" - ")[0]
    out = [_criterion(result, "1 parity", "sequence", "hgb_rolling", m["1 parity"])]
    fused = [name for name in result["models"] if kind_of(name, kinds).fused]
    for name in sorted(fused, key=lambda n: n != primary):
        label = "2 useful" if name == primary else f"2 useful, secondary ({name})"
        c = _criterion(result, label, name, "hgb_rolling", m["2 useful"], m["2 useful (recall)"])
        if c is not None:
            c["counted"] = name == primary
        out.append(c)
    out.append(_criterion(result, "3 strong", "sequence", "hgb_rolling", m["3 strong"]))
    out.append(_criterion(result, "4 pretraining pays", "lf_pretrained", "lf_scratch", m["4 pretraining pays"],
                          models=result.get("arms")))
    return [c for c in out if c is not None]


def _passed(delay: dict) -> str:
    """``median / mean`` transactions passed before the first alert over detected cases, or what stands
    in for them when no case of the pattern was detected (both are then undefined, never ``nan``)."""
    median, mean = delay.get("passed_median"), delay.get("passed_mean")
    if not all(isinstance(v, float) and np.isfinite(v) for v in (median, mean)):
        return "n/a (no detections)"
    return f"{median:.1f} / {mean:.2f}"


class _Shown(float):
    """A number as a report shows it: formatted as usual when finite, ``n/a`` when not (a PR-AUC without
    positives, a CI that could not be drawn): a report never prints ``nan``."""

    def __format__(self, spec: str) -> str:
        return float.__format__(self, spec) if math.isfinite(self) else "n/a"


def _shown(value):
    """``value`` with every non-integral number (through dicts, lists and tuples) as a :class:`_Shown`."""
    if isinstance(value, dict):
        return {key: _shown(item) for key, item in value.items()}
    if isinstance(value, (list, tuple)):
        return [_shown(item) for item in value]
    if isinstance(value, numbers.Real) and not isinstance(value, (bool, numbers.Integral)):
        return _Shown(value)
    return value


def write_report(result: dict, scores: dict[str, np.ndarray], y: np.ndarray, out: Path) -> None:
    """``metrics.json``, ``report.md`` and ``pr_curve.png`` (matplotlib, when installed)."""
    out.mkdir(parents=True, exist_ok=True)
    (out / "metrics.json").write_text(dumps_finite(result, indent=1, default=str))
    result = _shown(result)  # report.md: n/a where a number is undefined
    lines = ["# Fraud evaluation (test period)", "",
             f"Test transactions: {result['n_test']:,}, frauds: {result['n_test_fraud']:,}.", "",
             "| model | PR-AUC [95% CI] | ROC-AUC | recall@1%FPR | recall@0.1%FPR | card precision@100 |"
             " validation PR-AUC |", "|---|---|---|---|---|---|---|"]
    boot = result["bootstrap"]
    for name, m in result["models"].items():
        ci = boot.get(name, {}).get("pr_auc", [_Shown("nan")] * 2)
        lines.append(f"| {name} | {m['pr_auc']:.3f} [{ci[0]:.3f}, {ci[1]:.3f}] | {m['roc_auc']:.3f} |"
                     f" {m['recall_at_fpr_1pct']:.3f} | {m['recall_at_fpr_0.1pct']:.3f} | {m['card_precision_at_100']:.3f} |"
                     f" {m['val_pr_auc']:.3f} |")
    lines += ["", "Paired PR-AUC differences (same customer resamples):", ""]
    for key, v in boot.items():
        if " - " in key:
            r = v.get("recall_at_fpr_0.1pct", [_Shown("nan")] * 2)
            pr = v["pr_auc"]
            lines.append(f"- {key}: mean {v['mean']:+.3f}, 95% CI [{pr[0]:+.3f}, {pr[1]:+.3f}] (+/-{_half_width(pr):.3f});"
                         f" recall@0.1%FPR mean {v.get('recall_mean', float('nan')):+.3f}, [{r[0]:+.3f}, {r[1]:+.3f}]"
                         f" (+/-{_half_width(r):.3f})")
    if result.get("criteria"):
        lines += ["", "When the sequence model counts as useful (differences on the whole test set, paired 95% CIs"
                  " and their half-widths). Verdict per rule \"diff >= margin\": met = the CI's lower bound is at or"
                  " above the margin; not met = its upper bound is below it; undecided = the CI straddles the margin"
                  " (the data cannot decide). Criterion 2 is met if either rule is met, not met if both are not met;"
                  f" its one counted comparison is the pre-declared primary, {result.get('primary', 'stacked - hgb_rolling')}"
                  " (secondary rows are shown, not counted).",
                  "", "| criterion | difference | rule | PR-AUC diff [CI] +/-half | recall@0.1%FPR diff [CI] +/-half"
                  " | verdict |", "|---|---|---|---|---|---|"]
        for c in result["criteria"]:
            ci, rci = c["pr_auc_ci"], c["recall_0.1pct_ci"]
            lines.append(f"| {c['criterion']} | {c['difference']} | {c['rule']} | {c['pr_auc_diff']:+.3f}"
                         f" [{ci[0]:+.3f}, {ci[1]:+.3f}] +/-{c['pr_auc_ci_half_width']:.3f} |"
                         f" {c['recall_0.1pct_diff']:+.3f} [{rci[0]:+.3f}, {rci[1]:+.3f}]"
                         f" +/-{c['recall_0.1pct_ci_half_width']:.3f} | {c['verdict']} |")
    stacker = result["models"].get("stacked", {}).get("stacker")
    if stacker:
        lines += ["", f"stacked: chose {stacker['choice']} ({stacker['reason']}; inputs {', '.join(stacker['inputs'])},"
                  f" {stacker['val_frauds']} validation frauds, weights {stacker['weights']})."]
    if result.get("floor"):
        lines += ["", "Per-row floor: each sequence recipe against `token_lr` (one-hot current-row tokens):", ""]
        for f in result["floor"].values():
            lines.append(f"- {f['difference']}: {f['pr_auc_diff']:+.3f} [{f['pr_auc_ci'][0]:+.3f},"
                         f" {f['pr_auc_ci'][1]:+.3f}]: {f['verdict']}")
    lines += ["", "At each model's validation 1%-FPR threshold (alert: score >= threshold; how it was set, and the"
              " realised validation FPR): per-pattern recall and amount-weighted recall:", ""]
    for name, m in result["models"].items():
        lines.append(f"- {name} (threshold {m['val_threshold_1pct']:.4g}, {m['threshold_source']}, validation FPR"
                     f" {m['val_threshold_fpr']:.4f}): "
                     + ", ".join(f"{p} {r:.2f}" for p, r in m["per_pattern_recall"].items())
                     + f"; amount-weighted {m['amount_weighted_recall']:.2f}")
    lines += ["", "Detection delay at that threshold, per pattern: cases detected, and fraudulent transactions",
              "passed before the first alert (median / mean over detected cases; mean over all cases, an",
              "undetected case counting all of its transactions):", ""]
    for name, m in result["models"].items():
        parts = [f"{p} {d['detected'] * d['cases']:.0f}/{d['cases']} detected, passed {_passed(d)}; all"
                 f" {d['passed_mean_all']:.2f}" for p, d in m.get("detection_delay", {}).items()]
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
