"""``slmlab compare``: every family at one non-embedding parameter budget, on the same data, steps,
batch, learning-rate grid and seeds, with one report (``docs/compare.md``).

1. **Fit**: each family's ``fit_budget`` (:mod:`slmlab.models.budget`) gives its config at the budget
   (±10%), embeddings tied unless ``untied``; then every (model, data) pair is checked before any
   training (context length, fixed vocabulary).
2. **Run**: each (data, model, lr, seed) is an ordinary ``slmlab train`` run
   (:func:`slmlab.train.run.build_trainer`: the same tokenizer, data source, ``build_model``,
   ``attach_tokenizer`` and ``prepare_for_training``), on a task with the bench's protocol
   (:func:`slmlab.bench.run.plan_run_config`: AdamW, warm-up then cosine, ``keep_best``, early stop,
   scored positions) and tested once with bootstrap intervals (:func:`slmlab.bench.run.held_out_metrics`);
   on text the validation bits per byte at the last step (the same validation batches for every model).
   Each run stops on a validation plateau (``--patience`` steps without a gain over the tolerances of
   :mod:`slmlab.bench.convergence`), or at ``--steps``, the ceiling; no run has a time limit, so a run is
   the same on any machine. Every row says ``converged`` or ``not converged`` by that rule.
3. **Measure**: parameters (audit), cache bytes per token and constant state (the generic
   ``ModelCache.nbytes`` after prefills of two lengths, fitted as a line), training tokens/s (the run),
   decode tokens/s (``slmlab.generation.generate``, batch 1, greedy, fixed context).
4. **Record**: one line per run in ``<out>/results.jsonl`` (:data:`SCHEMA`), also for a run that
   failed (its error) or diverged (``status: "diverged"`` and the step); a rerun with the same ``out``
   skips the runs already finished (complete or diverged) and retries failed ones; under a longer
   ``--patience`` it carries over the finished runs the shorter one did not stop
   (:func:`slmlab.bench.convergence.carries_to`) instead of training them again. The report
   (:mod:`slmlab.bench.compare_report`: lr chosen on validation, seeds with an interval) is made from
   those lines only.
"""

from __future__ import annotations

import contextlib
import dataclasses
import hashlib
import io
import json
import math
import re
import shutil
import time
from dataclasses import dataclass, field
from pathlib import Path

from ..outputs import dumps_finite

SCHEMA = "slmlab-compare/1"
BUDGET_FORMS = "a count such as 2M, 1.5M, 200k or 1500000"
DECODE_CONTEXT = 64  # prompt tokens before decode speed is timed
DECODE_TOKENS = 32  # greedy tokens generated for the decode speed
_BUDGET = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*([kKmM]?)\s*$")


def parse_budget(text: str) -> int:
    """``"2M"`` -> 2,000,000, ``"200k"`` -> 200,000, ``"1500000"`` -> 1,500,000; ``ValueError``
    naming the accepted forms otherwise."""
    match = _BUDGET.match(str(text).replace("_", "").replace(",", ""))
    if not match:
        raise ValueError(f"malformed --budget {text!r}; write {BUDGET_FORMS}")
    value = float(match.group(1)) * {"": 1, "k": 1_000, "m": 1_000_000}[match.group(2).lower()]
    if value < 1 or value != int(value):
        raise ValueError(f"--budget {text!r} is not a whole positive number of parameters; write {BUDGET_FORMS}")
    return int(value)


def split_specs(text: str | None) -> list[str]:
    """Comma-separated data or task specs; a ``key=value`` item belongs to the spec before it
    (``"t7:cpu,n_train=512,mqar:cpu"`` -> ``["t7:cpu,n_train=512", "mqar:cpu"]``)."""
    specs: list[str] = []
    for item in (text or "").split(","):
        item = item.strip()
        if not item:
            continue
        if "=" in item and ":" not in item.split("=", 1)[0] and specs:
            specs[-1] += f",{item}"
        else:
            specs.append(item)
    return specs


def split_numbers(text: str, what: str, kind=float) -> list:
    try:
        values = [kind(x) for x in text.split(",") if x.strip()]
    except ValueError:
        raise ValueError(f"malformed {what} {text!r}; write comma-separated numbers (e.g. 1e-3,3e-3 or 0,1,2)") from None
    if not values:
        raise ValueError(f"{what} is empty; give at least one value")
    return values


def parse_fixed(items: list[str]) -> dict[str, dict]:
    """``--set`` items: ``["pgsm.block_size=256"]`` -> ``{"pgsm": {"block_size": 256}}`` (values parsed as YAML)."""
    import yaml

    fixed: dict[str, dict] = {}
    for item in items:
        target, eq, value = item.partition("=")
        family, dot, key = target.partition(".")
        if not (eq and dot and family and key):
            raise ValueError(f"malformed --set {item!r}; write FAMILY.FIELD=VALUE (e.g. pgsm.block_size=256)")
        fixed.setdefault(family, {})[key] = yaml.safe_load(value)
    return fixed


# The default patience's floor: attention on the multi-query T2 sat on its 1/6 plateau with a flat validation loss
# for 1,413 steps before it solved the task (docs/bench.md, Convergence); a patience of a few evaluations calls
# such a plateau converged.
MIN_PATIENCE = 1500


@dataclass(frozen=True)
class CompareSettings:
    """What one comparison runs (every family gets the same).

    Args:
        models: registered family names.
        budget: non-embedding parameters each model is fitted to (±10%).
        data: text corpora (``shakespeare``) and task specs (``t7:cpu``), in order.
        steps / batch_size / lrs / seeds: the shared step ceiling, batch and grid (the lr chosen on
            validation is reported; three seeds by default, what a claim needs).
        patience: a run stops at the first evaluation after which ``patience`` steps brought no
            validation gain over the convergence rule's tolerances (0: every run trains ``steps``; None:
            :attr:`plateau`, half of ``steps`` and at least :data:`MIN_PATIENCE`).
        block_size: sequence length on text (tasks fix their own).
        eval_every: validation cadence in steps (0: four evaluations per patience window, or per run
            without a patience).
        eval_batches: text validation batches per evaluation, the same for every model (0: the
            whole validation split); tasks always use their whole validation set.
        untied: keep separate input table and LM head (default: tied for every family).
        fixed: per-family config fields kept fixed while fitting (``{"pgsm": {"block_size": 256}}``).
        device: ``cpu``, ``cuda`` or ``auto``.
        data_cache: the data layer's cache folder (None: its default).
    """

    models: tuple[str, ...]
    budget: int
    data: tuple[str, ...]
    steps: int = 2000
    patience: int | None = None
    batch_size: int = 32
    lrs: tuple[float, ...] = (1e-3, 3e-3)
    seeds: tuple[int, ...] = (0, 1, 2)
    block_size: int = 128
    eval_every: int = 0
    eval_batches: int = 16
    untied: bool = False
    fixed: dict = field(default_factory=dict)
    device: str = "cpu"
    data_cache: str | None = None

    def check(self) -> CompareSettings:
        import slmlab.models  # noqa: F401  (registers the families)

        from ..models.registry import families

        known = families()
        if not self.models:
            raise ValueError(f"no models given; pass --models with some of: {', '.join(sorted(known))}")
        for name in self.models:
            if name not in known:
                raise ValueError(f"unknown family {name!r}; registered families: {', '.join(sorted(known))}")
        if len(set(self.models)) != len(self.models):
            raise ValueError(f"--models lists a family twice ({', '.join(self.models)}); name each once")
        for name in self.fixed:
            if name not in self.models:
                raise ValueError(f"--set names {name!r}, which is not among --models ({', '.join(self.models)});"
                                 " write --set FAMILY.FIELD=VALUE for a compared family")
        if not self.data:
            raise ValueError("no data given; pass --data (e.g. shakespeare) and/or --tasks (e.g. mqar:cpu,t7:cpu)")
        for name, value in (("--steps", self.steps), ("--batch-size", self.batch_size), ("--block-size", self.block_size)):
            if value < 1:
                raise ValueError(f"{name} must be a positive integer, got {value}")
        if self.eval_batches < 0:
            raise ValueError(f"--eval-batches must be >= 0 (0: the whole validation split), got {self.eval_batches}")
        if self.patience is not None and self.patience < 0:
            raise ValueError(f"--patience must be >= 0 steps (0: no plateau stop), got {self.patience}")
        if self.eval_every < 0:
            raise ValueError(f"--eval-every must be >= 0 (0: four evaluations per run), got {self.eval_every}")
        if any(not (lr > 0 and math.isfinite(lr)) for lr in self.lrs):
            raise ValueError(f"--lrs must be positive, got {', '.join(map(str, self.lrs))}")
        from ..train.config import check_seed

        for seed in self.seeds:  # refused here, not as every run failing
            check_seed(seed, "--seeds")
        return self

    @property
    def cadence(self) -> int:
        return self.eval_every or max(1, min(self.steps, self.plateau or self.steps) // 4)

    @property
    def plateau(self) -> int:
        """The patience runs stop on: ``patience``, or when it is None half the step ceiling and at least
        :data:`MIN_PATIENCE` (a shorter run is then never plateau-stopped and reads "not converged")."""
        return max(self.steps // 2, MIN_PATIENCE) if self.patience is None else self.patience


# -- fitting and checks ------------------------------------------------------------------------


def fit_all(settings: CompareSettings, log=print) -> dict[str, dict]:
    """``{model: {"overrides", "non_embedding", "budget", "rule"} or {"error"}}``: each family's
    fitted config. A budget below a family's minimum raises ``ValueError`` (bad input); any other
    exception marks that family failed, and the comparison goes on."""
    from ..models.budget import non_embedding_parameters
    from ..models.registry import get_family

    fits = {}
    for name in settings.models:
        fam = get_family(name)
        base = {"tie_word_embeddings": not settings.untied, **settings.fixed.get(name, {})}
        try:
            overrides = fam.fit_budget(settings.budget, **base)
            count = non_embedding_parameters(fam, overrides)
        except ValueError:
            raise
        except Exception as err:  # a broken family must not stop the others
            fits[name] = {"error": f"fitting failed: {type(err).__name__}: {err}"}
            log(f"  {name:<11} fitting failed: {type(err).__name__}: {err}")
            continue
        fits[name] = {"budget": settings.budget, "overrides": overrides, "non_embedding": count,
                      "rule": getattr(fam.scaling, "description", "")}
        shown = ", ".join(f"{k}={v}" for k, v in overrides.items() if k not in base)
        log(f"  {name:<11} {count:>10,} non-embedding ({count / settings.budget - 1:+.1%}): {shown}")
    return fits


@dataclass(frozen=True)
class DataInfo:
    """What a model must hold for one data spec."""

    spec: str
    synthetic: bool
    seq_len: int
    vocab: int
    task: str | None = None


def data_info(settings: CompareSettings, spec: str) -> DataInfo:
    """Sequence length and vocabulary of ``spec`` (text: the run's tokenizer, built as ``slmlab
    train`` builds it and cached)."""
    from ..data.tasks import parse_task_spec

    task = parse_task_spec(spec)
    if task is not None:
        return DataInfo(spec, True, int(task.seq_len), int(task.vocab_size), task.name)
    from ..train.run import fresh_tokenizer

    cfg = _base_config(settings, spec, settings.models[0], 0.0, 0, Path("."))
    with contextlib.redirect_stdout(io.StringIO()):
        tokenizer = fresh_tokenizer(cfg)
    return DataInfo(spec, False, settings.block_size, len(tokenizer))


def check_pairs(settings: CompareSettings, fits: dict, infos: list[DataInfo]) -> None:
    """Refuse, before any training, a (model, data) pair the model cannot take: a sequence longer
    than its fixed context, or a data vocabulary larger than a fixed ``vocab_size``."""
    from ..models.registry import get_family

    for name, fit in fits.items():
        if "overrides" not in fit:
            continue
        fam = get_family(name)
        for info in infos:
            overrides = dict(fit["overrides"])
            fixed_vocab = overrides.get("vocab_size")
            if fixed_vocab is not None and int(fixed_vocab) < info.vocab:
                raise ValueError(
                    f"{name} has a fixed vocab_size={fixed_vocab} but {info.spec} needs {info.vocab} ids; drop"
                    f" --set {name}.vocab_size or leave {info.spec} out"
                )
            overrides.setdefault("vocab_size", info.vocab)
            config = fam.make_config(None, **overrides)
            limit = getattr(config, "max_position_embeddings", None)
            if limit is not None and int(limit) < info.seq_len:
                field_name = type(config).attribute_map.get("max_position_embeddings", "max_position_embeddings")
                raise ValueError(
                    f"{name} accepts {field_name}={limit} tokens but {info.spec} has sequences of {info.seq_len};"
                    f" raise it (--set {name}.{field_name}={info.seq_len}), or shorten the data (--block-size)"
                )


# -- runs --------------------------------------------------------------------------------------


class RunDiverged(RuntimeError):
    """A run's loss or gradient became NaN/inf at ``step`` (recorded as ``status: "diverged"``)."""

    def __init__(self, step: int, message: str) -> None:
        super().__init__(message)
        self.step = step


@dataclass(frozen=True)
class ComparePlan:
    """One run of the grid."""

    data: str
    model: str
    lr: float
    seed: int
    synthetic: bool
    overrides: tuple = ()

    def key(self, settings: CompareSettings) -> str:
        """Stable across reruns of the same comparison: a rerun skips the keys already finished."""
        config = json.dumps(dict(self.overrides), sort_keys=True)
        return (f"{self.data}|{self.model}|lr={self.lr:g}|seed={self.seed}|b={settings.batch_size}"
                f"|steps={settings.steps}|block={settings.block_size if not self.synthetic else '-'}"
                f"|val={settings.eval_batches if not self.synthetic else '-'}"
                f"|eval={settings.cadence}|patience={settings.plateau}|{config}")

    def folder(self, settings: CompareSettings) -> str:
        digest = hashlib.sha1(self.key(settings).encode()).hexdigest()[:8]
        data = "".join(c if c.isalnum() else "_" for c in self.data)[:40]
        return f"{self.model}-{data}-lr{self.lr:g}-s{self.seed}-{digest}"


def plan_runs(settings: CompareSettings, fits: dict, infos: list[DataInfo]) -> list[ComparePlan]:
    """The grid, data-major: data, then model, lr, seed."""
    plans = []
    for info in infos:
        for model in settings.models:
            overrides = tuple(sorted((fits[model].get("overrides") or {}).items()))
            for lr in settings.lrs:
                for seed in settings.seeds:
                    plans.append(ComparePlan(info.spec, model, float(lr), int(seed), info.synthetic, overrides))
    return plans


def _base_config(settings: CompareSettings, data: str, model: str, lr: float, seed: int, run_dir: Path,
                 overrides: dict | None = None):
    """The run's ``RunConfig``: the bench's task protocol, or plain LM training on text."""
    from ..train.config import OptimConfig, RunConfig, ScheduleConfig

    cfg = RunConfig(
        model=model, model_config=dict(overrides or {}), data=data, block_size=settings.block_size,
        batch_size=settings.batch_size, max_steps=settings.steps, seed=seed, device=settings.device,
        optim=OptimConfig(lr=lr or 1e-3, betas=(0.9, 0.98), weight_decay=0.1, grad_clip=1.0),
        schedule=ScheduleConfig(name="cosine", warmup=0.1, min_lr_ratio=0.0), eval_every=settings.cadence,
        eval_batches=settings.eval_batches, checkpoint_every=0, keep_checkpoints=1,
        log_every=max(1, min(50, settings.cadence)),
        progress=False, tensorboard=False, out_dir=str(run_dir), sample_tokens=0, data_cache=settings.data_cache,
    )
    return cfg.validate()


def run_config(settings: CompareSettings, plan: ComparePlan, run_dir: Path):
    """The run's config; tasks take the bench runner's protocol (:func:`slmlab.bench.run.plan_run_config`)."""
    if not plan.synthetic:
        return _base_config(settings, plan.data, plan.model, plan.lr, plan.seed, run_dir, dict(plan.overrides))
    from .run import plan_run_config
    from .suite import RunPlan

    bench = RunPlan(plan.data, plan.model, plan.lr, plan.seed, batch_size=settings.batch_size,
                    max_steps=settings.steps, max_time=0.0, eval_every=settings.cadence)
    cfg = plan_run_config(bench, run_dir, settings.device)
    return dataclasses.replace(cfg, model_config=dict(plan.overrides), data_cache=settings.data_cache).validate()


def run_one(settings: CompareSettings, plan: ComparePlan, out: Path) -> tuple[dict, float]:
    """Train and evaluate one plan as ``slmlab train`` would; returns ``(result fields, seconds spent
    measuring)``. ``KeyboardInterrupt`` when the run was interrupted (nothing is recorded);
    :class:`RunDiverged` (with the step) when its loss or gradient became NaN/inf."""
    import numpy as np
    import torch

    from ..train.checkpoint import quiet_hf_progress
    from ..train.run import build_trainer
    from ..train.session import interruption
    from ..train.signals import exit_status
    from ..train.trainer import TrainingDiverged
    from .convergence import attach, read_curve
    from .run import ending

    run_dir = out / "runs" / plan.folder(settings)
    shutil.rmtree(run_dir, ignore_errors=True)  # an unfinished earlier attempt starts over
    cfg = run_config(settings, plan, run_dir)
    with contextlib.redirect_stdout(io.StringIO()), quiet_hf_progress():
        trainer = build_trainer(cfg)
        attach(trainer, settings.plateau)
        t0 = time.perf_counter()
        try:
            state = trainer.train()
        except TrainingDiverged as err:
            raise RunDiverged(trainer.state.step + 1, str(err)) from None
        train_wall = time.perf_counter() - t0
    if exit_status(state.stop_reason):
        raise interruption(state.stop_reason)  # the CLI's exit status: 130 (Ctrl-C) or 143 (SIGTERM)
    model = trainer.model
    record = {"steps": state.step, "stop_reason": state.stop_reason, **ending(settings.steps, state),
              "train_wall_s": round(train_wall, 2), "tokens_seen": state.tokens_seen,
              "train_tokens_per_s": round(trainer.tokens_per_s, 1)}
    if plan.synthetic:
        from .run import held_out_metrics

        best = run_dir / "checkpoints" / "best"
        if best.is_dir():
            with quiet_hf_progress():
                model = type(model).from_pretrained(str(best)).to(trainer.device)
        test = held_out_metrics(model, trainer.source, trainer.device)
        record.update(test, best_step=state.best_step, best_val_acc=state.best_acc)
    else:  # the trainer's evaluation at the last step, on the validation batches every model reads
        final = trainer.state.last_eval
        scope = (f"first {settings.eval_batches} batches of {settings.batch_size} sequences"
                 if settings.eval_batches else "whole validation split")
        record.update(val_loss=final.get("loss"), bits_per_byte=final.get("bits_per_byte"),
                      val_tokens=final.get("tokens"), val_scope=scope)
    record["curve"] = _curve(run_dir, state)
    record.update(patience=settings.plateau, val_curve=read_curve(run_dir))
    t1 = time.perf_counter()
    record.update(measure(model, trainer.source.seq_len if plan.synthetic else settings.block_size))
    measuring = time.perf_counter() - t1
    record.update(torch=torch.__version__, numpy=np.__version__)
    return record, measuring


def _curve(run_dir: Path, state) -> list[list[float]]:
    """``[[tokens, validation loss], ...]`` of the run's periodic evaluations."""
    from ..train.metrics import read_metrics

    path = run_dir / "metrics.jsonl"
    if not path.is_file() or not state.step:
        return []
    per_step = state.tokens_seen / state.step
    return [[int(r["step"] * per_step), round(float(r["loss"]), 5)] for r in read_metrics(path, "eval") if "loss" in r]


# -- measures ----------------------------------------------------------------------------------


def parameter_counts(model) -> dict[str, int]:
    """Total / non-embedding / embedding parameters from the family's audit (shared tensors once)."""
    from ..models.registry import get_family

    rows = get_family(model.config.model_type).parameter_audit(model)
    embedding = sum(int(v) for v in model.embedding_rows().values())
    return {"params_total": int(rows["Total"]), "params_nonembedding": int(rows["Total"]) - embedding,
            "params_embedding": embedding}


def cache_growth(model, lengths: tuple[int, int]) -> dict:
    """Cache bytes per token and constant state bytes: ``ModelCache.nbytes`` after prefills of two
    lengths, fitted as ``constant + per_token * T``."""
    from .models import cache_nbytes

    short, long = lengths
    n_short, n_long = cache_nbytes(model, short), cache_nbytes(model, long)
    per_token = (n_long - n_short) / (long - short)
    return {"cache_bytes_per_token": round(per_token, 3), "cache_bytes_constant": round(n_short - per_token * short, 3),
            "cache_lengths": [short, long], "cache_bytes": [n_short, n_long]}


def decode_speed(model, context: int = DECODE_CONTEXT, new_tokens: int = DECODE_TOKENS) -> float:
    """Greedy decode tokens/s at batch 1 after a ``context``-token prompt (``slmlab.generation``);
    the prefill and first token are not timed."""
    import torch

    from ..generation import SamplingConfig, generate

    device = next(model.parameters()).device
    ids = torch.randint(0, model.config.vocab_size, (1, context), generator=torch.Generator().manual_seed(0))
    stamps: list[float] = []
    was_training = model.training
    model.eval()
    try:
        with torch.no_grad():
            generate(model, ids.to(device), new_tokens, SamplingConfig(temperature=0.0),
                     callback=lambda _tok: stamps.append(time.perf_counter()))
    finally:
        model.train(was_training)
    if len(stamps) < 2:
        return float("nan")
    return (len(stamps) - 1) / max(stamps[-1] - stamps[0], 1e-9)


def measure(model, seq_len: int) -> dict:
    """Every per-model measure of the report (parameters, cache growth, decode speed)."""
    short = max(2, seq_len // 2)
    context = min(DECODE_CONTEXT, max(1, seq_len - DECODE_TOKENS))
    limit = getattr(model.config, "max_position_embeddings", None)
    if limit is not None:
        context = min(context, max(1, int(limit) - DECODE_TOKENS))
    return {**parameter_counts(model), **cache_growth(model, (short, seq_len)),
            "decode_tokens_per_s": round(decode_speed(model, context), 1), "decode_context": context,
            "d_model": int(model.config.hidden_size), "n_layers": int(model.config.num_hidden_layers),
            "dtype": str(next(model.parameters()).dtype).replace("torch.", "")}


# -- the whole comparison ----------------------------------------------------------------------


def read_lines(path: Path) -> list[dict]:
    """The result lines of ``<out>/results.jsonl`` (a later line for a key replaces an earlier one);
    ``ValueError`` for a damaged line or another schema."""
    from .jsonl import last_written, read_result_lines

    return last_written(read_result_lines(path, SCHEMA, "comparison", "run `slmlab compare ... --out DIR` first",
                                          "rerun the comparison into a new --out folder"), lambda line: line["key"])


def _json_default(value):
    """numpy integers as ints (:func:`~slmlab.outputs.dumps_finite` has made every float finite or None)."""
    import numpy as np

    if isinstance(value, np.integer):
        return int(value)
    raise TypeError(f"cannot write {type(value).__name__} to a result line")


def run_compare(settings: CompareSettings, out: str | Path, log=print) -> dict:
    """Fit, check, run what is missing, report. Returns ``{"lines", "written", "timing"}``; timing
    holds the runs' wall time and compare's own overhead (fitting, measuring, reporting)."""
    from .compare_report import write_report

    settings.check()
    out = Path(out)
    timing = {"fitting_s": 0.0, "measuring_s": 0.0, "reporting_s": 0.0, "runs_s": 0.0}
    t0 = time.perf_counter()
    log(f"slmlab compare: fitting {len(settings.models)} families to {settings.budget:,} non-embedding parameters"
        f" ({'untied' if settings.untied else 'tied'} embeddings)")
    fits = fit_all(settings, log)
    infos = [data_info(settings, spec) for spec in settings.data]
    check_pairs(settings, fits, infos)
    plans = plan_runs(settings, fits, infos)
    timing["fitting_s"] = time.perf_counter() - t0

    out.mkdir(parents=True, exist_ok=True)
    path = out / "results.jsonl"
    kept = [line for line in read_lines(path) if finished(line)] if path.is_file() else []
    done = {line["key"] for line in kept}
    todo = [p for p in plans if p.key(settings) not in done]
    if len(todo) < len(plans):
        log(f"{len(plans) - len(todo)} of {len(plans)} runs already in {path}: skipped")
    todo = _carry_over(settings, todo, kept, path, log)
    spent: list[float] = []
    for i, plan in enumerate(todo, 1):
        eta = "unknown" if not spent else f"~{sum(spent) / len(spent) * (len(todo) - i + 1) / 60:.1f} min"
        log(f"run {i} of {len(todo)}: {plan.model}, {plan.data}, lr {plan.lr:g}, seed {plan.seed}  (ETA {eta})")
        fit = fits[plan.model]
        line = {"schema": SCHEMA, "key": plan.key(settings), "model": plan.model, "data": plan.data,
                "kind": "task" if plan.synthetic else "text",
                "task": next(d.task for d in infos if d.spec == plan.data), "lr": plan.lr, "seed": plan.seed,
                "batch_size": settings.batch_size, "max_steps": settings.steps, "budget": settings.budget,
                "tied": not settings.untied, "fit": fit, "settings": _settings_record(settings)}
        t1 = time.perf_counter()
        if "error" in fit:
            line.update(status="failed", error=fit["error"])
        else:
            try:
                record, measuring = run_one(settings, plan, out)
                timing["measuring_s"] += measuring
                line.update(status="ok", **record)
            except KeyboardInterrupt:
                raise
            except RunDiverged as err:  # an outcome of this lr and seed: recorded with its step, not retried
                line.update(status="diverged", diverged_step=err.step, complete=False,
                            stop=f"diverged at step {err.step} of {settings.steps}", error=f"TrainingDiverged: {err}")
            except Exception as err:  # recorded, shown as failed; the comparison goes on
                line.update(status="failed", error=f"{type(err).__name__}: {err}")
        wall = time.perf_counter() - t1
        line["wall_s"] = round(wall, 2)
        timing["runs_s"] += wall
        spent.append(wall)
        with path.open("a") as f:
            f.write(dumps_finite(line, default=_json_default) + "\n")
        log(f"    {_outcome(line)}")
    t2 = time.perf_counter()
    lines = read_lines(path)
    written = write_report(lines, out)
    timing["reporting_s"] = time.perf_counter() - t2
    timing["runs_s"] -= timing["measuring_s"]  # the measures are compare's own work, not the runs'
    return {"lines": lines, "written": written, "timing": timing}


def _carry_over(settings: CompareSettings, todo: list[ComparePlan], lines: list[dict], path: Path, log) -> list[ComparePlan]:
    """Append, for each plan of ``todo`` whose run a finished line holds under a shorter patience that did
    not stop it (:func:`slmlab.bench.convergence.carries_to`), that line under the plan's key and these
    settings; returns the plans still to run."""
    from .convergence import carried, carried_note

    found = carried(todo, lines, lambda plan, p: plan.key(dataclasses.replace(settings, patience=p)),
                    lambda plan: settings.plateau)
    if not found:
        return todo
    with path.open("a") as f:
        for plan, line in found:
            line = {**line, "key": plan.key(settings), "patience": settings.plateau,
                    "settings": _settings_record(settings), "carried_from": line["key"]}
            f.write(dumps_finite(line, default=_json_default) + "\n")
    log(carried_note(len(found), len(todo)))
    done = {id(plan) for plan, _ in found}
    return [plan for plan in todo if id(plan) not in done]


def rebuild_report(folder: str | Path) -> list[Path]:
    """The report of ``folder`` made again from ``folder/results.jsonl`` alone (nothing runs); the files written."""
    from .compare_report import write_report

    folder = Path(folder)
    return write_report(read_lines(folder), folder)


def check_compared(lines: list[dict], out: str | Path) -> None:
    """Refuse (ValueError) a comparison in which every run failed: nothing was compared, not a success."""
    failed = [line for line in lines if line.get("status") == "failed"]
    if failed and len(failed) == len(lines):
        raise ValueError(f"all {len(failed)} runs failed (first: {failed[0].get('model')}: {failed[0].get('error')});"
                         f" each run's error is in {out}/results.jsonl: fix the cause and rerun (failed runs are"
                         " retried)")


def finished(line: dict) -> bool:
    """A run a rerun skips: ``ok`` and complete, or diverged; failed runs are retried."""
    return (line.get("status") == "ok" and line.get("complete", True)) or line.get("status") == "diverged"


def _settings_record(settings: CompareSettings) -> dict:
    return {"models": list(settings.models), "data": list(settings.data), "steps": settings.steps,
            "patience": settings.plateau,
            "batch_size": settings.batch_size, "lrs": list(settings.lrs), "seeds": list(settings.seeds),
            "block_size": settings.block_size, "eval_every": settings.cadence,
            "eval_batches": settings.eval_batches, "untied": settings.untied,
            "device": settings.device}


def _outcome(line: dict) -> str:
    if line["status"] == "diverged":
        return f"DIVERGED: {line['stop']} ({line['error']})"
    if line["status"] != "ok":
        return f"failed: {line['error']}"
    if line["kind"] == "text":
        bpb = line.get("bits_per_byte")
        metric = f"bits/byte {bpb:.4f}" if bpb is not None else f"val loss {line.get('val_loss')}"
    else:
        ci = line["ci"]["acc"]
        metric = f"acc {line['acc']:.4f} [{ci[0]:.3f}, {ci[1]:.3f}]"
    from .convergence import line_judgement

    return (f"{metric}  {line_judgement(line, 'val_curve').word}  steps {line['steps']} of {line['max_steps']}"
            f"  {line['train_tokens_per_s']:,.0f} train tok/s"
            f"  {line['decode_tokens_per_s']:,.0f} decode tok/s  {line['wall_s']:.0f} s")


def overhead_line(timing: dict) -> str:
    """The printed overhead: fitting, measuring and reporting against the runs' wall time."""
    own = timing["fitting_s"] + timing["measuring_s"] + timing["reporting_s"]
    runs = timing["runs_s"]
    share = own / runs if runs > 0 else float("nan")
    return (f"compare overhead: fitting {timing['fitting_s']:.1f} s + measuring {timing['measuring_s']:.1f} s +"
            f" reporting {timing['reporting_s']:.1f} s = {own:.1f} s, {share:.1%} of the runs' {runs:.1f} s")
