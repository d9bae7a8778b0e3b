"""One bench run, and a tier of them: train with the tier's budget, keep the best weights, test once,
append one JSON line (``docs/bench.md``, Results).

A run is an ordinary :class:`slmlab.train.Trainer` run (``keep_best``, early stop at validation
accuracy > 0.99, ``train_on``) on a :class:`~slmlab.data.sources.TaskSource`; the test split is
evaluated once with the best-validation weights, with 95% bootstrap intervals over examples
(:mod:`slmlab.bench.stats`). Results go to ``<out>/results.jsonl``, one line per run, each with
every field of :data:`RESULT_FIELDS`; a rerun with the same ``out`` skips the runs already there.
"""

from __future__ import annotations

import dataclasses
import json
import math
import time
from pathlib import Path

import numpy as np
import torch

from ..data.sources import TaskSource
from ..data.tasks import parse_task_spec
from ..evaluate.lm import evaluate_batches
from .models import build_model, count_parameters, state_floats
from .stats import bootstrap_ci, metrics_from_counts
from .suite import RunPlan

SCHEMA = "slmlab-bench/1"
RESULT_FIELDS = (
    "schema", "key", "task", "task_spec", "task_config", "tier", "model", "params_total", "params_nonembedding",
    "state_floats", "d_model", "n_layers", "lr", "seed", "batch_size", "train_on", "steps", "wall_s", "stop_reason",
    "acc", "token_acc", "exact", "ci", "examples", "best_step", "best_val_acc", "acc_by_group", "exact_by_group",
    "acc_by_length",
    "leakage", "torch", "numpy",
)


def read_results(path: Path) -> list[dict]:
    """The result lines of ``path`` (``results.jsonl`` or a folder holding one); ``ValueError`` for a
    line from another schema version."""
    from .jsonl import read_result_lines

    return read_result_lines(path, SCHEMA, "bench", "run `slmlab bench run --out DIR` first",
                             "rerun the bench with this version or read the file with the version that wrote it")


def plan_run_config(plan: RunPlan, run_dir: Path, device: str):
    from ..train.config import OptimConfig, RunConfig, ScheduleConfig

    return RunConfig(
        model=plan.model, data=plan.task, batch_size=plan.batch_size, max_steps=plan.max_steps,
        max_time=plan.max_time, seed=plan.seed, device=device, precision="auto",
        optim=OptimConfig(lr=plan.lr, betas=(0.9, 0.98), weight_decay=0.1, grad_clip=1.0),
        schedule=ScheduleConfig(name="constant" if plan.constant_lr else "cosine", warmup=0.1, min_lr_ratio=0.0),
        eval_every=plan.eval_every, eval_batches=0, eval_batch_size=250, early_stop_acc=0.99, keep_best=True,
        checkpoint_every=0, keep_checkpoints=1, log_every=max(1, min(50, plan.eval_every)), progress=False,
        tensorboard=False, out_dir=str(run_dir), train_on=plan.train_on,
    ).validate()


def held_out_metrics(model, source: TaskSource, device) -> dict:
    """Test metrics with per-example bootstrap intervals."""
    result = evaluate_batches(model, source.eval_batches("test", 250), _forward_inputs(model), device, keep_rows=True)
    rows = result.pop("rows")
    correct, scored = np.asarray(rows["correct"]), np.asarray(rows["scored"])
    out = metrics_from_counts(correct, scored)
    out["ci"] = bootstrap_ci(correct, scored)
    out["examples"] = int(correct.size)
    out["acc_by_group"] = {str(k): v for k, v in result.get("acc_by_group", {}).items()}
    groups = np.asarray(rows["group"])
    out["exact_by_group"] = (
        {str(g): float(np.mean(correct[groups == g] == scored[groups == g])) for g in np.unique(groups)}
        if groups.size == correct.size else {}
    )
    return out


def _forward_inputs(model):
    from ..evaluate.lm import family_forward_inputs

    return family_forward_inputs(model)


def _lengths(plan: RunPlan, task, model, device) -> dict:
    """Test accuracy at the task's other test lengths (T4); ``None`` where the model cannot hold them."""
    lengths = getattr(task, "lengths", ())
    out = {}
    for T in lengths:
        if T == task.seq_len:
            continue
        limit = model.max_positions()
        if limit is not None and limit < T:
            out[str(T)] = None  # learned positions / fixed context of the trained model: n/a at this length
            continue
        other = task.with_length(T)
        source = TaskSource(f"{plan.task},T={T}", other, plan.seed)
        out[str(T)] = held_out_metrics(model, source, device)["acc"]
    return out


def run_one(plan: RunPlan, tier: str, out_dir: Path, device: str = "cpu") -> dict:
    """Train, test with the best weights, and return the result line (not yet written).

    Raises:
        ValueError: unknown task or model, or a model that cannot hold the task (before training).
    """
    from ..train.checkpoint import quiet_hf_progress
    from ..train.trainer import Trainer

    task = parse_task_spec(plan.task)
    if task is None:
        from ..data.tasks import TASKS

        raise ValueError(f"unknown task {plan.task!r}; known: {', '.join(sorted(TASKS))}")
    model = build_model(plan.model, task.vocab_size, task.seq_len, dict(plan.model_config), plan.seed)
    source = TaskSource(plan.task, task, plan.seed, train_on=plan.train_on)
    run_dir = Path(out_dir) / "runs" / _slug(plan.key)
    cfg = plan_run_config(plan, run_dir, device)
    trainer = Trainer(cfg, model, source, None, run_dir)
    with quiet_hf_progress():
        t0 = time.perf_counter()
        state = trainer.train()
        wall = time.perf_counter() - t0
        best = run_dir / "checkpoints" / "best"
        if best.is_dir():
            model = type(model).from_pretrained(str(best)).to(trainer.device)
    test = held_out_metrics(model, source, trainer.device)
    total, nonemb = count_parameters(model)
    config = model.config
    record = {
        "schema": SCHEMA, "key": plan.key, "task": task.name, "task_spec": plan.task,
        "task_config": {f.name: getattr(task, f.name) for f in dataclasses.fields(task)},
        "tier": tier, "model": plan.model, "params_total": total, "params_nonembedding": nonemb,
        "state_floats": state_floats(model, task.seq_len), "d_model": int(config.hidden_size),
        "n_layers": int(config.num_hidden_layers), "lr": plan.lr, "seed": plan.seed, "batch_size": plan.batch_size,
        "train_on": plan.train_on, "steps": state.step, "wall_s": round(wall, 2), "stop_reason": state.stop_reason,
        **test,
        "best_step": state.best_step, "best_val_acc": state.best_acc,
        "acc_by_length": _lengths(plan, task, model, trainer.device),
        "leakage": source.leakage,
        "torch": torch.__version__, "numpy": np.__version__,
    }
    for name, value in record["task_config"].items():
        record[f"task_{name}"] = value  # flat copies for filtering (task_T, task_N, ...)
    return record


def _slug(key: str) -> str:
    return "".join(c if c.isalnum() or c in "-_.=" else "_" for c in key)[:150]


def run_plans(plans: list[RunPlan], tier: str, out_dir: str | Path, device: str = "cpu", log=print) -> list[dict]:
    """Run ``plans`` not yet in ``<out_dir>/results.jsonl``, appending a line after each; prints which run
    of how many is going and an ETA (the mean wall time so far, capped by the remaining time budgets)."""
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    path = out / "results.jsonl"
    done = {line["key"] for line in read_results(path)} if path.is_file() else set()
    todo = [p for p in plans if p.key not in done]
    if len(todo) < len(plans):
        log(f"{len(plans) - len(todo)} of {len(plans)} runs already in {path}: skipped")
    records, spent = [], []
    for i, plan in enumerate(todo, 1):
        rest = todo[i - 1 :]
        caps = sum(p.max_time for p in rest) if all(p.max_time > 0 for p in rest) else math.inf
        eta = min(caps, (sum(spent) / len(spent)) * len(rest)) if spent else caps
        log(f"[{i}/{len(todo)}] {plan.key}  (ETA {'unknown' if math.isinf(eta) else f'~{eta / 60:.1f} min'})")
        t0 = time.perf_counter()
        record = run_one(plan, tier, out, device)
        spent.append(time.perf_counter() - t0)
        with path.open("a") as f:
            f.write(json.dumps(record, default=_json_default) + "\n")
        ci = record["ci"]["acc"]
        log(f"    acc {record['acc']:.4f} [{ci[0]:.3f}, {ci[1]:.3f}]  steps {record['steps']}  {record['wall_s']:.0f} s"
            f"  ({record['stop_reason']})")
        records.append(record)
    return records


def _json_default(value):
    if isinstance(value, (np.integer,)):
        return int(value)
    if isinstance(value, (np.floating,)):
        return None if math.isnan(value) else float(value)
    raise TypeError(f"cannot write {type(value).__name__} to a result line")
