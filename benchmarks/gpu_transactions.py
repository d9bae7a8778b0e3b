"""The transactions GPU recipe: the `large` bank, the seed-size `lfm2_small` encoder in bf16, the fraud head,
the joint-fusion head (the state and the rolling features, end to end), and the full evaluation (HGB raw /
rolling / rolling + risk, the sequence model, joint fusion, stacking, pretrained vs scratch with 10% of the
labels), written as one report.

Stages, each a library call (no pipeline of its own): generate the bank (`pipeline.generate_bank`, skipped
when `--bank` already holds one), split and tokenise it once (`pipeline.load_prepared_bank`), pretrain
(`training.pretrain`), fine-tune the transaction fraud head and the joint-fusion head (`training.finetune`,
`fraud_tabular="rolling"`; both validated every `--eval-every` steps on a seeded sample of `--val-windows`
windows, the step with the best validation PR-AUC kept), the few-label pair
(`training.finetune_label_fraction_arms`, 3 seeds per arm), then `evaluate_models` (stacking, paired bootstrap, criteria
verdicts). Runs are bounded by steps. `--time-cap` is only a safety cap: each training stage gets the
harness's `max_time` from what is left of it (less `--eval-reserve` for the evaluation), and the report
says which stage, if any, the cap stopped (`stopped_by_time_cap`) and whether the whole run overran it.

Writes into `--out`: `report.json`, `report.md` (device, precision, stage steps and seconds, every model's
PR-AUC with its 95% CI, the criteria verdicts), `evaluate/` (the evaluation's own report.md, metrics.json,
pr_curve.png) and the run folders `pretrain/`, `finetune/`, `evaluate/label_fraction/`.

    .venv/bin/python benchmarks/gpu_transactions.py --out runs/gpu-txn          # GPU defaults (one H200, ~9 min)
    .venv/bin/python benchmarks/gpu_transactions.py --out /tmp/toy --toy        # CPU, tiny sizes, well under a minute
    .venv/bin/python benchmarks/gpu_transactions.py --out runs/gpu-txn --bank runs/bank-large   # reuse a bank

Every size is an argument; `--toy` changes the defaults only (an explicit argument wins over both).
"""

from __future__ import annotations

import argparse
import json
import platform
import sys
import time
from pathlib import Path

import torch
import yaml
from threadpoolctl import threadpool_limits

from slmlab.train.environment import device_name, resolve_device
from slmlab.train.precision import uses_bf16
from slmlab.train.trainer import stopped_by_time_cap
from slmlab.transactions import pipeline, training
from slmlab.transactions.evaluation.evaluate import evaluate_models
from slmlab.transactions.model import preset_schema

# The GPU recipe (one H200, ~9 minutes in all: an estimate until measured) and the CPU toy.
DEFAULTS = {
    "gpu": dict(bank_preset="large", bank_overrides=[], model_preset="lfm2_small", precision="bf16",
                pretrain_steps=1500, finetune_steps=600, joint_steps=600, lf_steps=300, batch_size=64,
                keep_negative=0.2, label_fraction=0.1, bootstrap=200, time_cap=540.0, eval_reserve=180.0,
                hgb_threads=0, val_windows=4000, eval_every=150, lf_seeds=3),
    "toy": dict(bank_preset="tiny", bank_overrides=["n_customers=100"], model_preset="lfm2_tiny", precision="auto",
                pretrain_steps=3, finetune_steps=3, joint_steps=3, lf_steps=2, batch_size=8, keep_negative=1.0,
                label_fraction=0.2, bootstrap=20, time_cap=0.0, eval_reserve=0.0, hgb_threads=1, val_windows=5000,
                eval_every=2, lf_seeds=3),
}
MODEL_FIELDS = ("pr_auc", "roc_auc", "recall_at_fpr_1pct", "recall_at_fpr_0.1pct", "card_precision_at_100",
                "amount_weighted_recall")


def parse_args(argv=None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--out", required=True, help="report folder (report.json, report.md, the run folders)")
    p.add_argument("--toy", action="store_true", help="CPU-sized defaults: tiny bank, lfm2_tiny, a few steps")
    p.add_argument("--bank", default=None, help="bank folder: loaded when it holds one, else generated there"
                                                " (default OUT/bank)")
    p.add_argument("--bank-preset", default=None, help="synthetic preset to generate (GPU: large; toy: tiny)")
    p.add_argument("--bank-override", dest="bank_overrides", action="append", default=None, metavar="KEY=VALUE",
                   help="generator setting (repeatable; toy: n_customers=100)")
    p.add_argument("--model-preset", default=None, help="encoder preset (GPU: lfm2_small; toy: lfm2_tiny)")
    p.add_argument("--device", default="auto", help="auto | cuda | cpu")
    p.add_argument("--precision", default=None, choices=("auto", "bf16", "fp32"),
                   help="training autocast (GPU: bf16; toy: auto = bf16 on CUDA, fp32 on CPU)")
    p.add_argument("--threads", type=int, default=0, help="torch CPU threads (0 = torch's default)")
    p.add_argument("--hgb-threads", type=int, default=None,
                   help="OpenMP threads of the gradient-boosting fits (0 = all cores; toy: 1)")
    p.add_argument("--pretrain-steps", type=int, default=None)
    p.add_argument("--finetune-steps", type=int, default=None)
    p.add_argument("--joint-steps", type=int, default=None, help="fine-tuning steps of the joint-fusion model (0: skip)")
    p.add_argument("--lf-steps", type=int, default=None, help="fine-tuning steps of each few-label model")
    p.add_argument("--lf-seeds", type=int, default=None, help="seeds per arm of the few-label pair (criterion 4)")
    p.add_argument("--val-windows", type=int, default=None,
                   help="validation windows (a seeded sample) of every training stage")
    p.add_argument("--eval-every", type=int, default=None,
                   help="fine-tuning: validate every N steps and keep the best step (early stopping by selection)")
    p.add_argument("--batch-size", type=int, default=None, help="windows per step, every training stage")
    p.add_argument("--keep-negative", type=float, default=None, help="share of fraud-free windows kept (fine-tuning)")
    p.add_argument("--label-fraction", type=float, default=None,
                   help="pretrained vs scratch on this share of the labels (0: skip the pair)")
    p.add_argument("--no-stacking", action="store_true", help="skip the stacked models")
    p.add_argument("--bootstrap", type=int, default=None, help="customer resamples for the CIs")
    p.add_argument("--time-cap", type=float, default=None,
                   help="safety cap in seconds for the whole run (0 = none); reported, never the budget")
    p.add_argument("--eval-reserve", type=float, default=None,
                   help="seconds of --time-cap kept for the evaluation when capping training stages")
    p.add_argument("--seed", type=int, default=None, help="generator seed (default: the preset's)")
    args = p.parse_args(argv)
    for key, value in DEFAULTS["toy" if args.toy else "gpu"].items():
        if getattr(args, key) is None:
            setattr(args, key, value)
    if not 0 <= args.label_fraction <= 1:
        p.error(f"--label-fraction must be in [0, 1], got {args.label_fraction}; pass 0 to skip the pair")
    return args


class Clock:
    """Wall time since the start, and what is left of the safety cap for a training stage."""

    def __init__(self, cap: float, reserve: float) -> None:
        self.t0, self.cap, self.reserve = time.perf_counter(), cap, reserve

    def elapsed(self) -> float:
        return time.perf_counter() - self.t0

    def max_time(self, share: float = 1.0) -> float:
        """The harness's ``max_time`` for the next stage (0 = no cap): ``share`` of what is left of the cap
        after the evaluation's reserve, at least 1 s (so a stage takes a step and says the cap stopped it).
        A stage within its steps never meets it; it is there for a run that would overrun the machine."""
        if not self.cap:
            return 0.0
        return max(1.0, (self.cap - self.reserve - self.elapsed()) * share)


def train_stage(trainer, asked: int, max_time: float, seconds: float, batch_size: int) -> dict:
    st = trainer.state
    return {"steps_asked": asked, "steps_done": int(st.step), "batch_size": batch_size, "seconds": round(seconds, 2),
            "train_time_s": round(st.train_time_s, 2), "tokens_per_s": round(trainer.tokens_per_s),
            "max_time_s": round(max_time, 1), "stop_reason": st.stop_reason,
            "stopped_by_time_cap": stopped_by_time_cap(st.stop_reason)}


def kept(trainer) -> dict:
    """Which fine-tuning step was kept and why: the best validation PR-AUC (``keep_best``), with the training
    sample's PR-AUC at the same evaluations (the gap that shows memorising)."""
    st = trainer.state
    return {"val_pr_auc_last": trainer.state.last_eval.get("pr_auc"),
            "train_pr_auc_last": trainer.state.last_eval.get("train_pr_auc"),
            "kept_step": int(st.best_step) if st.best_step >= 0 else int(st.step),
            "kept_val_pr_auc": float(st.best_acc) if st.best_step >= 0 else trainer.state.last_eval.get("pr_auc"),
            "kept_because": "best validation PR-AUC" if st.best_step >= 0 else
            "last step (no evaluation ran)" if not st.last_eval else
            "last step (validation PR-AUC undefined: no labelled fraud in the validation windows)"}


def best_or_last(trainer, run: Path):
    """The model of the kept step: ``checkpoints/best`` when the run saved one, else the trained model."""
    from slmlab.transactions.heads import TransactionFraudModel

    best = run / "checkpoints" / "best"
    return TransactionFraudModel.from_pretrained(str(best)) if best.is_dir() else trainer.model


def overrides(args, device, steps: int, max_time: float) -> list[str]:
    return [f"device={device}", f"precision={args.precision}", f"max_steps={steps}", f"batch_size={args.batch_size}",
            f"max_time={max_time:g}", "progress=false"]


def run(args) -> dict:
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    clock = Clock(args.time_cap, args.eval_reserve)
    if args.threads:
        torch.set_num_threads(args.threads)
    device = resolve_device(args.device)
    bf16 = uses_bf16(device, args.precision)
    env = {"device": str(device), "device_name": device_name(device), "precision": args.precision,
           "autocast_dtype": "bfloat16" if bf16 else None, "weights_dtype": "float32",
           "dtype": "bf16 autocast (weights fp32)" if bf16 else "fp32", "torch": torch.__version__,
           "cuda": torch.version.cuda, "cpu_threads": torch.get_num_threads(), "python": platform.python_version()}
    print(f"gpu_transactions: device {env['device']} ({env['device_name']}) | dtype {env['dtype']}"
          f" | torch {env['torch']} | CPU threads {env['cpu_threads']}", flush=True)
    if device.type != "cuda" and not args.toy:
        print("gpu_transactions: warning: no CUDA device; the GPU sizes will take hours here (pass --toy for a CPU"
              " check, or explicit small sizes)", flush=True)
    stages: dict = {}

    bank_dir = Path(args.bank) if args.bank else out / "bank"
    t = time.perf_counter()
    if (bank_dir / "transactions.parquet").is_file() or (bank_dir / "transactions.csv").is_file():
        stages["generate"] = {"skipped": f"loaded the bank in {bank_dir}"}
    else:
        overrides_ = {k: yaml.safe_load(v) for k, v in (item.split("=", 1) for item in args.bank_overrides)}
        gen = pipeline.generate_bank(bank_dir, args.bank_preset, args.seed, "parquet", overrides=overrides_)
        stages["generate"] = {"seconds": round(time.perf_counter() - t, 2), "rows": len(gen.data.transactions),
                              "preset": args.bank_preset, "overrides": overrides_}
    print(f"bank: {bank_dir} ({stages['generate']})", flush=True)

    t = time.perf_counter()
    bank = pipeline.load_prepared_bank(bank_dir, preset_schema(args.model_preset))
    stages["prepare"] = {"seconds": round(time.perf_counter() - t, 2)}
    df = bank.df
    test = bank.period_mask(bank.cuts["test_start"], None)
    y = df["is_fraud"].fillna(0).to_numpy() if "is_fraud" in df else None
    bank_info = {"path": str(bank_dir), "rows": len(df), "customers": int(df["customer_id"].nunique()),
                 "fraud_rate": float(y.mean()) if y is not None else None, "test_rows": int(test.sum()),
                 "test_frauds": int(y[test].sum()) if y is not None else None, "n_days": int(bank.cuts["n_days"])}
    print(f"bank: {bank_info}", flush=True)

    t, cap = time.perf_counter(), clock.max_time()
    pre = training.pretrain(bank, args.model_preset, out / "pretrain", overrides(args, device, args.pretrain_steps, cap),
                            val_windows=args.val_windows)
    stages["pretrain"] = {**train_stage(pre, args.pretrain_steps, cap, time.perf_counter() - t, args.batch_size),
                          "val_loss": pre.state.last_eval.get("loss")}
    print(f"pretrain: {stages['pretrain']}", flush=True)
    encoder = pre.model

    selection = [f"eval_every={args.eval_every}", "keep_best=true"]
    t, cap = time.perf_counter(), clock.max_time(0.5 if args.joint_steps else 1.0)
    ft = training.finetune(bank, out / "finetune", encoder, args.model_preset,
                           overrides(args, device, args.finetune_steps, cap) + selection,
                           keep_negative=args.keep_negative, val_windows=args.val_windows)
    stages["finetune"] = {**train_stage(ft, args.finetune_steps, cap, time.perf_counter() - t, args.batch_size),
                          **kept(ft), "keep_negative": args.keep_negative}
    print(f"finetune: {stages['finetune']}", flush=True)
    extra_models = {}
    if args.joint_steps:
        t, cap = time.perf_counter(), clock.max_time()
        jt = training.finetune(bank, out / "finetune-joint", encoder, args.model_preset,
                               overrides(args, device, args.joint_steps, cap) + selection,
                               keep_negative=args.keep_negative, val_windows=args.val_windows, fraud_tabular="rolling")
        stages["joint"] = {**train_stage(jt, args.joint_steps, cap, time.perf_counter() - t, args.batch_size),
                           **kept(jt), "features": len(jt.model.config.tabular_features)}
        extra_models["joint"] = best_or_last(jt, out / "finetune-joint").to(device).eval()
        print(f"joint: {stages['joint']}", flush=True)
    else:
        stages["joint"] = {"skipped": "--joint-steps 0"}
    fraud = best_or_last(ft, out / "finetune").to(device).eval()

    models, arms = {}, None
    if args.label_fraction:
        t, cap = time.perf_counter(), clock.max_time(1 / (2 * args.lf_seeds))  # each of the 2 x seeds runs
        models, arms = training.finetune_label_fraction_arms(
            bank, out / "evaluate" / "label_fraction", encoder, args.label_fraction,
            overrides(args, device, args.lf_steps, cap), args.keep_negative, seeds=range(args.lf_seeds))
        stages["label_fraction"] = {"fraction": args.label_fraction, "steps_asked": args.lf_steps, "seeds": args.lf_seeds,
                                    "max_time_s": round(cap, 1), "seconds": round(time.perf_counter() - t, 2)}
        models = {k: m.to(device).eval() for k, m in models.items()}
    else:
        stages["label_fraction"] = {"skipped": "--label-fraction 0"}
    models.update(extra_models)

    t = time.perf_counter()
    with threadpool_limits(args.hgb_threads or None):  # OpenMP threads of the boosters (an oversubscribed pool stalls)
        result = evaluate_models(bank, fraud, out / "evaluate", args.bootstrap, device=device,
                                 stacking=not args.no_stacking, models=models, encoder=encoder, arms=arms)
    stages["evaluate"] = {"seconds": round(time.perf_counter() - t, 2), "bootstrap": args.bootstrap,
                          "timings_s": {k: round(v, 2) for k, v in result["timings_s"].items()}}
    elapsed = clock.elapsed()
    boot = result["bootstrap"]
    report = {
        "script": "benchmarks/gpu_transactions.py", "argv": sys.argv[1:], "environment": env,
        "settings": {k: v for k, v in vars(args).items()}, "bank": bank_info, "stages": stages,
        "models": {name: {**{k: m.get(k) for k in MODEL_FIELDS}, "pr_auc_ci": boot.get(name, {}).get("pr_auc")}
                   for name, m in result["models"].items()},
        "paired": {k: {"pr_auc_mean": v["mean"], "pr_auc_ci": v["pr_auc"]} for k, v in boot.items() if " - " in k},
        "resamples": boot.get("resamples"), "n_test": result["n_test"], "n_test_fraud": result["n_test_fraud"],
        "criteria": [{k: c[k] for k in ("criterion", "difference", "rule", "pr_auc_diff", "pr_auc_ci", "verdicts",
                                        "verdict", "counted")} for c in result["criteria"]],
        "time_cap": {"seconds": args.time_cap, "elapsed_s": round(elapsed, 1),
                     "exceeded": bool(args.time_cap) and elapsed > args.time_cap,
                     "stages_stopped_by_cap": [name for name, s in stages.items() if s.get("stopped_by_time_cap")]},
    }
    (out / "report.json").write_text(json.dumps(report, indent=1, default=str))
    (out / "report.md").write_text(markdown(report))
    return report


def _f(x, fmt: str = ".3f") -> str:
    return "-" if x is None else format(x, fmt)


def markdown(r: dict) -> str:
    env, cap = r["environment"], r["time_cap"]
    lines = ["# Transactions GPU recipe", "",
             f"Device **{env['device']}** ({env['device_name']}), dtype **{env['dtype']}**, torch {env['torch']}"
             f" (CUDA {env['cuda']}). Command: `python benchmarks/gpu_transactions.py {' '.join(r['argv'])}`", "",
             f"Bank {r['bank']['path']}: {r['bank']['rows']:,} transactions, {r['bank']['customers']:,} customers,"
             f" {r['bank']['n_days']} days; test period {r['n_test']:,} transactions, {r['n_test_fraud']:,} frauds.", "",
             "| stage | steps done / asked | seconds | tokens/s | stopped by the time cap |", "|---|---|---|---|---|"]
    for name, s in r["stages"].items():
        if "skipped" in s:
            lines.append(f"| {name} | skipped: {s['skipped']} | | | |")
            continue
        steps = f"{s['steps_done']} / {s['steps_asked']}" if "steps_done" in s else s.get("steps_asked", "")
        lines.append(f"| {name} | {steps} | {s['seconds']:.1f} | {s.get('tokens_per_s', '')} |"
                     f" {'**yes**' if s.get('stopped_by_time_cap') else 'no'} |")
    lines += ["", f"Safety cap {cap['seconds']:g} s (0 = none); elapsed {cap['elapsed_s']:.1f} s"
              f"{' (**exceeded**)' if cap['exceeded'] else ''}.", "",
              f"| model | PR-AUC [95% CI, {r['resamples']} customer resamples] | ROC-AUC | recall@1%FPR | recall@0.1%FPR |",
              "|---|---|---|---|---|"]
    for name, m in r["models"].items():
        ci = m["pr_auc_ci"] or [None, None]
        lines.append(f"| {name} | {_f(m['pr_auc'])} [{_f(ci[0])}, {_f(ci[1])}] | {_f(m['roc_auc'])} |"
                     f" {_f(m['recall_at_fpr_1pct'])} | {_f(m['recall_at_fpr_0.1pct'])} |")
    lines += ["", "| criterion | difference | rule | PR-AUC diff [95% CI] | verdict |", "|---|---|---|---|---|"]
    for c in r["criteria"]:
        ci = c["pr_auc_ci"]
        lines.append(f"| {c['criterion']} | {c['difference']} | {c['rule']} | {c['pr_auc_diff']:+.3f}"
                     f" [{ci[0]:+.3f}, {ci[1]:+.3f}] | {c['verdict']} |")
    return "\n".join(lines) + "\n"


def main(argv=None) -> int:
    args = parse_args(argv)
    report = run(args)
    print(Path(args.out, "report.md").read_text())
    print(f"gpu_transactions: device {report['environment']['device']} | dtype {report['environment']['dtype']}"
          f" | {report['time_cap']['elapsed_s']:.1f} s -> {args.out}/report.json")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
