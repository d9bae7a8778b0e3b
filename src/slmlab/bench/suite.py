"""One run of the suite (:class:`RunPlan`) and the filter that picks runs out of a tier.

A tier is a list of plans written as a YAML file (:mod:`slmlab.bench.tier_file`; the built-in tiers
``cpu-smoke``, ``cpu-full``, ``gpu-paper`` and ``micro`` are the files in ``slmlab/bench/tiers/``).
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
