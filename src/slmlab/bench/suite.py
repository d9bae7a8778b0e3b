"""The tiers of the suite: which runs, at which budget (``docs/bench.md``, Tiers).

A tier is a list of :class:`RunPlan` s. ``cpu-smoke`` (CI, ≤ 10 min) and ``cpu-full`` (≤ 120 min on
2 cores) follow the benchmark spec's default runs; ``gpu-paper`` holds the paper-scale sweeps (Zoology
Figure 2, Mamba's selective copying and induction protocols, NIAH to 8K, the T7 reconstruction);
``micro`` is two 5-step runs that check the harness itself.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass

from ..data.tasks import parse_task_spec


@dataclass(frozen=True)
class RunPlan:
    """One run: a task spec, a model id and the training budget.

    Args:
        task: a task spec (``"mqar:cpu,T=128,N=8"``).
        model: a model id of :data:`slmlab.bench.models.MODELS` or a registered family / preset.
        lr: peak learning rate (AdamW, warm-up 10%, cosine to 0; ``constant_lr`` for Mamba's protocols).
        seed: model init and data.
        batch_size / max_steps / max_time: the budget (a run stops at whichever comes first, or when
            validation accuracy exceeds 0.99).
        eval_every: validation cadence in steps (an epoch for fixed sets, 500 for fresh data).
        train_on: ``scored`` or ``all`` (T2 trains as a full LM, safari style).
        model_config: config overrides as ``((field, value), ...)`` (e.g. ``(("d_model", 128),)``).
        constant_lr: constant learning rate after warm-up instead of cosine.
    """

    task: str
    model: str
    lr: float
    seed: int = 0
    batch_size: int = 64
    max_steps: int = 10_000
    max_time: float = 300.0
    eval_every: int = 313
    train_on: str = "scored"
    model_config: tuple = ()
    constant_lr: bool = False

    @property
    def key(self) -> str:
        """A stable identifier: a rerun with the same ``--out`` skips the plans whose key is already there."""
        extra = ",".join(f"{k}={v}" for k, v in self.model_config)
        return (f"{self.task}|{self.model}{'[' + extra + ']' if extra else ''}|lr={self.lr:g}|seed={self.seed}"
                f"|b={self.batch_size}|steps={self.max_steps}|t={self.max_time:g}|{self.train_on}")

    @property
    def task_name(self) -> str:
        return parse_task_spec(self.task).name


def _grid(tasks, models, lrs, **kw) -> list[RunPlan]:
    return [RunPlan(t, m, lr, **kw) for t in tasks for m in models for lr in lrs]


T7_CPU = dict(batch_size=32, max_steps=750, eval_every=250, max_time=300.0)


def _cpu_smoke() -> list[RunPlan]:
    # The full 20k-row cpu set, not the spec's reduced 10k: measured, attn2-z (lr 3e-3) memorises 10k rows
    # (train loss 0.96, validation loss rising 3.41 -> 3.95, accuracy 0.25 through 2,669 steps) while on 20k it
    # reaches 0.98 validation accuracy by step 1,252.
    t1 = "mqar:cpu"
    return [
        RunPlan(t1, "attn2-z", 3e-3, eval_every=313, max_time=150.0),
        RunPlan(t1, "shortconv4", 3e-3, eval_every=313, max_time=60.0),
        RunPlan("t7:cpu", "attn2-rope", 2e-3, **{**T7_CPU, "max_time": 150.0}),
        RunPlan("t7:cpu", "pgsm-cpu", 2e-3, **{**T7_CPU, "max_time": 150.0}),
        RunPlan("t7:cpu", "pgsm-cpu-noret", 2e-3, **{**T7_CPU, "max_time": 60.0}),
    ]


def _cpu_full() -> list[RunPlan]:
    controls = ["attn2-z", "shortconv4", "longconv4", "lfm2-hyb-cpu"]
    plans = _grid(["mqar:cpu", "mqar:cpu,T=128,N=8"], controls, [1e-3, 3e-3], max_steps=30 * 313, max_time=240.0)
    plans += _grid(["ar:cpu"], controls + ["attn2-rope", "pgsm-cpu"], [1e-3], train_on="all", eval_every=157,
                   max_steps=3000, max_time=120.0)
    plans += _grid(["t3:cpu"], ["attn2-rope", "shortconv4", "longconv4"], [1e-3], max_time=180.0)
    plans += [RunPlan("t4:cpu", "attn2-rope", 1e-3, max_steps=100_000, max_time=600.0, eval_every=500)]
    plans += _grid(["t5:cpu", "t5:cpu,variant=multikey"], ["attn2-rope", "shortconv4"], [1e-3], batch_size=32,
                   eval_every=313, max_time=180.0)
    plans += _grid(["t7:cpu"], ["attn2-rope", "pgsm-cpu", "pgsm-cpu-noret"], [2e-3], **{**T7_CPU, "max_time": 200.0})
    return plans


def _gpu_paper() -> list[RunPlan]:
    lrs = [1e-4, 4.6e-4, 2.2e-3, 1e-2]
    plans = []
    for (T, N), batch in (((64, 4), 512), ((128, 8), 512), ((256, 16), 256), ((512, 64), 128)):
        steps = 64 * 100_000 // batch
        for d in (64, 128, 256, 512):
            for model in ("attn2-z", "longconv4", "shortconv4"):
                plans += [RunPlan(f"mqar:gpu,T={T},N={N}", model, lr, batch_size=batch, max_steps=steps,
                                  max_time=4 * 3600.0, eval_every=100_000 // batch, model_config=(("d_model", d),))
                          for lr in lrs]
    plans += _grid(["t3:gpu"], ["attn2-rope", "longconv4", "shortconv4"], [1e-4], max_steps=400_000,
                   max_time=24 * 3600.0, eval_every=5000, constant_lr=True)
    plans += _grid(["t4:gpu"], ["attn2-rope", "attn2-z"], [2e-4, 1e-3], batch_size=8, max_steps=50 * 8192,
                   max_time=24 * 3600.0, eval_every=8192, constant_lr=True)
    plans += _grid([f"t5:gpu,T={T}" for T in (1024, 2048, 4096, 8192)], ["attn4-llama", "lfm2-hyb"], [3e-4, 1e-3],
                   max_time=8 * 3600.0, eval_every=1563)
    plans += _grid(["t7:gpu"], ["pgsm-small", "pgsm-small-noret", "attn4-llama"], [3e-4, 1e-3, 3e-3],
                   max_steps=20 * 1563, max_time=8 * 3600.0, eval_every=1563)
    return plans


def _micro() -> list[RunPlan]:
    task = "ar:cpu,T=16,n_train=64,n_test=32"
    return [RunPlan(task, m, 1e-3, batch_size=8, max_steps=5, max_time=60.0, eval_every=5) for m in ("attn2-z", "shortconv4")]


TIERS = {
    "cpu-smoke": ("CI smoke: T1 (64, 4) attention + short-conv control, T7 cpu attention / PGSM / conv-only; <= 10 min",
                  _cpu_smoke),
    "cpu-full": ("T1 x 2 configs x 4 models x 2 lrs, T2, T3, T4 segment (one 600 s attempt), T5, T7; <= 120 min",
                 _cpu_full),
    "gpu-paper": ("Zoology Figure 2 sweep, Mamba T3/T4 protocols, T5 to 8K, T7 reconstruction; GPU-days", _gpu_paper),
    "micro": ("two 5-step T2 runs: checks the harness end to end in seconds", _micro),
}


def tier_plans(tier: str, tasks: list[str] | None = None, models: list[str] | None = None,
               seeds: list[int] | None = None) -> list[RunPlan]:
    """The tier's runs, filtered by task names / aliases and model ids, repeated for each seed."""
    if tier not in TIERS:
        raise ValueError(f"unknown tier {tier!r}; known: {', '.join(TIERS)} (or a tier file, configs/bench-*.yaml)")
    return filter_plans(TIERS[tier][1](), tasks, models, seeds)


def filter_plans(plans: list[RunPlan], tasks: list[str] | None = None, models: list[str] | None = None,
                 seeds: list[int] | None = None) -> list[RunPlan]:
    """``plans`` restricted to task names / aliases and model ids, repeated for each seed."""
    if tasks:
        wanted = set()
        for name in tasks:
            task = parse_task_spec(name)
            if task is None:
                from ..data.tasks import TASKS

                raise ValueError(f"unknown task {name!r}; known: {', '.join(sorted(TASKS))}")
            wanted.add(task.name)
        plans = [p for p in plans if p.task_name in wanted]
    if models:
        from .models import resolve_entry

        for m in models:
            resolve_entry(m)  # unknown ids raise, listing the known ones
        plans = [p for p in plans if p.model in models]
    if seeds:
        plans = list(dict.fromkeys(dataclasses.replace(p, seed=s) for s in seeds for p in plans))
    return plans
