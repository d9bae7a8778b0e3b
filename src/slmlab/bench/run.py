"""One bench run, and a tier of them: train with the tier's budget, keep the best weights, test once,
append one JSON line (``docs/bench.md``, Results).

A run is an ordinary :class:`slmlab.train.Trainer` run (``keep_best``, early stop at validation
accuracy > 0.99, ``train_on``) on a :class:`~slmlab.data.sources.TaskSource`; the test split is
evaluated once with the best-validation weights, with 95% bootstrap intervals over examples
(:mod:`slmlab.bench.stats`). Results go to ``<out>/results.jsonl``, one line per run, each with
every field of :data:`RESULT_FIELDS`.

The budget is the plan's ``max_steps``; ``max_time`` is only a safety cap. Every line says how the run
ended (``complete``, ``stop``, ``diverged_step``): a run the cap stopped is ``"complete": false`` and no
table shows it; a diverged run is recorded with its step and no test metrics. Ctrl-C (or SIGTERM)
stops the whole tier and writes nothing for the run it cut short. A rerun with the same ``out`` skips
the runs already finished (complete or diverged) and redoes the others; under a longer ``patience`` it
carries over the finished runs the shorter one did not stop (:func:`slmlab.bench.convergence.carries_to`)
instead of training them again.
"""

from __future__ import annotations

import dataclasses
import math
import re
import shutil
import time
from pathlib import Path

import numpy as np
import torch

from ..data.sources import TaskSource
from ..data.tasks import parse_task_spec
from ..evaluate.lm import evaluate_batches
from ..outputs import dumps_finite
from .convergence import attach, carried, carried_note, read_curve, stopped_on_plateau
from .models import build_model, count_parameters, state_floats
from .report import finished
from .stats import bootstrap_ci, example_counts, metrics_from_counts
from .suite import EARLY_STOP_ACC, RunPlan

SCHEMA = "slmlab-bench/1"
RESULT_FIELDS = (
    "schema", "key", "task", "task_spec", "task_config", "tier", "model", "model_config", "params_total",
    "params_nonembedding",
    "state_floats", "d_model", "n_layers", "lr", "seed", "batch_size", "train_on", "max_steps", "max_time", "steps",
    "tokens_seen", "wall_s", "stop_reason", "complete", "stop", "diverged_step",
    "acc", "token_acc", "exact", "ci", "examples", "example_counts", "best_step", "best_val_acc", "acc_by_group",
    "exact_by_group", "acc_by_length",
    "leakage", "patience", "early_stop_acc", "curve", "torch", "numpy",
)
TEST_FIELDS = ("acc", "token_acc", "exact", "ci", "examples", "example_counts", "acc_by_group", "exact_by_group",
               "acc_by_length")


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
        eval_every=plan.eval_every, eval_batches=0, eval_batch_size=250, early_stop_acc=plan.early_stop_acc, keep_best=True,
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
    out["example_counts"] = example_counts(correct, scored)
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

    A diverged run returns its line too (``diverged_step``, no test metrics); a run the ``max_time`` cap
    stopped returns ``"complete": false``.

    Raises:
        ValueError: unknown task or model, or a model that cannot hold the task (before training).
        KeyboardInterrupt: Ctrl-C or SIGTERM during the run (``stop_reason`` says which); nothing of it
            is a result, and the next attempt starts the run over.
    """
    from ..train.checkpoint import quiet_hf_progress
    from ..train.run import prepare_for_training
    from ..train.session import interruption
    from ..train.signals import exit_status
    from ..train.trainer import Trainer, TrainingDiverged

    task = parse_task_spec(plan.task)
    if task is None:
        from ..data.tasks import TASKS

        raise ValueError(f"unknown task {plan.task!r}; known: {', '.join(sorted(TASKS))}")
    model = build_model(plan.model, task.vocab_size, task.seq_len, dict(plan.model_config), plan.seed)
    prepare_for_training(model, task.seq_len)  # the model's training-length hook, as `slmlab train` calls it
    source = TaskSource(plan.task, task, plan.seed, train_on=plan.train_on)
    run_dir = Path(out_dir) / "runs" / _slug(plan.key)
    shutil.rmtree(run_dir, ignore_errors=True)  # an earlier attempt that was cut short starts over
    cfg = plan_run_config(plan, run_dir, device)
    trainer = Trainer(cfg, model, source, None, run_dir)
    attach(trainer, plan.patience)
    diverged = None
    with quiet_hf_progress():
        t0 = time.perf_counter()
        try:
            state = trainer.train()
        except TrainingDiverged as err:  # recorded with its step; the tier goes on
            state, diverged = trainer.state, (trainer.state.step + 1, str(err))
        wall = time.perf_counter() - t0
        if exit_status(state.stop_reason):
            raise interruption(state.stop_reason)  # the CLI's exit status: 130 (Ctrl-C) or 143 (SIGTERM)
        best = run_dir / "checkpoints" / "best"
        if diverged is None and best.is_dir():
            model = type(model).from_pretrained(str(best)).to(trainer.device)
    test = dict.fromkeys(TEST_FIELDS) if diverged else held_out_metrics(model, source, trainer.device)
    total, nonemb = count_parameters(model)
    config = model.config
    record = {
        "schema": SCHEMA, "key": plan.key, "task": task.name, "task_spec": plan.task,
        "task_config": {f.name: getattr(task, f.name) for f in dataclasses.fields(task)},
        "tier": tier, "model": plan.model, "model_config": dict(plan.model_config), "params_total": total, "params_nonembedding": nonemb,
        "state_floats": state_floats(model, task.seq_len), "d_model": int(config.hidden_size),
        "n_layers": int(config.num_hidden_layers), "lr": plan.lr, "seed": plan.seed, "batch_size": plan.batch_size,
        "train_on": plan.train_on, "max_steps": plan.max_steps, "max_time": plan.max_time, "steps": state.step,
        "tokens_seen": state.tokens_seen, "wall_s": round(wall, 2),
        "stop_reason": diverged[1] if diverged else state.stop_reason, **ending(plan.max_steps, state, diverged, plan.early_stop_acc),
        **test,
        "best_step": state.best_step, "best_val_acc": state.best_acc,
        "acc_by_length": None if diverged else _lengths(plan, task, model, trainer.device),
        "leakage": source.leakage, "patience": plan.patience, "early_stop_acc": plan.early_stop_acc,
        "curve": read_curve(run_dir),
        "torch": torch.__version__, "numpy": np.__version__,
    }
    for name, value in record["task_config"].items():
        record[f"task_{name}"] = value  # flat copies for filtering (task_T, task_N, ...)
    return record


def ending(total: int, state, diverged: tuple[int, str] | None = None, early_stop_acc: float = EARLY_STOP_ACC) -> dict:
    """``complete``, ``stop`` and ``diverged_step`` of a run of ``total`` (``max_steps``) steps whose trainer
    ended in ``state``, or diverged (``(step, message)``): complete when it trained its ``max_steps`` or
    stopped early on validation accuracy or on a validation plateau (all functions of the steps, not of
    the machine); otherwise
    the ``max_time`` safety cap stopped it. Read from the trainer's state, not its wording."""
    if diverged:
        step, message = diverged
        what = re.sub(r" at step \d+", "", message.split(";")[0]).strip()
        return {"complete": False, "stop": f"diverged at step {step} of {total}: {what}", "diverged_step": step}
    if state.step >= total:
        return {"complete": True, "stop": f"max_steps: {total} of {total} steps", "diverged_step": None}
    if early_stop_acc and state.best_step == state.step and state.best_acc > early_stop_acc:  # the trainer's early stop
        return {"complete": True, "diverged_step": None,
                "stop": f"early stop at step {state.step} of {total}: validation accuracy {state.best_acc:.4f}"
                        f" > {early_stop_acc}"}
    if stopped_on_plateau(state.stop_reason):
        return {"complete": True, "diverged_step": None, "stop": state.stop_reason}
    return {"complete": False, "stop": f"max_time safety cap at step {state.step} of {total}", "diverged_step": None}


def _slug(key: str) -> str:
    """The run's folder name; a long key is cut and keeps a digest, so two runs never share (and clear) one."""
    slug = "".join(c if c.isalnum() or c in "-_.=" else "_" for c in key)
    if len(slug) <= 150:
        return slug
    import hashlib

    return f"{slug[:141]}-{hashlib.sha1(key.encode()).hexdigest()[:8]}"


def run_plans(plans: list[RunPlan], tier: str, out_dir: str | Path, device: str = "cpu", log=print) -> list[dict]:
    """Run ``plans`` not yet finished in ``<out_dir>/results.jsonl`` (complete or diverged), appending a line
    after each; prints which run of how many is going and an ETA (the seconds per step so far times the
    steps left, capped by the remaining safety caps). Ctrl-C ends the whole call (``KeyboardInterrupt``)
    and writes nothing for the run it cut short."""
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    path = out / "results.jsonl"
    kept = {line["key"]: line for line in read_results(path) if finished(line)} if path.is_file() else {}
    todo = [p for p in plans if p.key not in kept]
    if len(todo) < len(plans):
        log(f"{len(plans) - len(todo)} of {len(plans)} runs already in {path}: skipped")
    records = _carry_over(todo, list(kept.values()), tier, path, log)
    taken = {r["key"] for r in records}
    todo = [p for p in todo if p.key not in taken]
    spent, steps = 0.0, 0
    for i, plan in enumerate(todo, 1):
        rest = todo[i - 1 :]
        caps = sum(p.max_time for p in rest) if all(p.max_time > 0 for p in rest) else math.inf
        eta = min(caps, spent / steps * sum(p.max_steps for p in rest)) if steps else caps
        log(f"[{i}/{len(todo)}] {plan.key}  (ETA {'unknown' if math.isinf(eta) else f'~{eta / 60:.1f} min'})")
        t0 = time.perf_counter()
        record = run_one(plan, tier, out, device)
        spent += time.perf_counter() - t0
        steps += max(1, record["steps"])
        with path.open("a") as f:
            f.write(dumps_finite(record, default=_json_default) + "\n")
        log(f"    {outcome(record)}")
        records.append(record)
    incomplete = [r for r in records if not r["complete"] and r["diverged_step"] is None]
    if incomplete:
        log(f"{len(incomplete)} of {len(records)} runs incomplete (stopped by the max_time safety cap): not"
            " results; rerun with the same --out and a larger --max-time (0 = no cap) to redo them")
    return records


def _carry_over(todo: list[RunPlan], lines: list[dict], tier: str, path: Path, log) -> list[dict]:
    """Append, for each plan of ``todo`` whose run a finished line holds under a shorter patience that did not
    stop it (:func:`slmlab.bench.convergence.carries_to`), that line under the plan's key; returns them."""
    found = carried(todo, lines, lambda plan, p: dataclasses.replace(plan, patience=p).key, lambda plan: plan.patience)
    records = [{**line, "key": plan.key, "tier": tier, "patience": plan.patience, "carried_from": line["key"]}
               for plan, line in found]
    if records:
        with path.open("a") as f:
            f.writelines(dumps_finite(r, default=_json_default) + "\n" for r in records)
        log(carried_note(len(records), len(todo)))
    return records


def outcome(record: dict) -> str:
    """The printed result of one run."""
    if record["diverged_step"] is not None:
        return f"DIVERGED: {record['stop']}  {record['wall_s']:.0f} s"
    ci = record["ci"]["acc"]
    text = (f"acc {record['acc']:.4f} [{ci[0]:.3f}, {ci[1]:.3f}]  steps {record['steps']}  {record['wall_s']:.0f} s"
            f"  ({record['stop']})")
    return text if record["complete"] else f"INCOMPLETE, not a result: {text}"


def _json_default(value):
    if isinstance(value, (np.integer,)):
        return int(value)
    if isinstance(value, (np.floating,)):
        return None if math.isnan(value) else float(value)
    raise TypeError(f"cannot write {type(value).__name__} to a result line")
