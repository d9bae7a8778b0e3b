"""One run of the suite (:class:`RunPlan`) and the filter that picks runs out of a tier.

A tier is a list of plans written as a YAML file (:mod:`slmlab.bench.tier_file`; the built-in tiers
``cpu-smoke``, ``cpu-full``, ``gpu-paper`` and ``micro`` are the files in ``slmlab/bench/tiers/``).
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass

from ..data.tasks import parse_task_spec

EARLY_STOP_ACC = 0.99  # validation accuracy that ends a run early by default (a function of the steps, so allowed)


@dataclass(frozen=True)
class RunPlan:
    """One run: a task spec, a model id and the training budget.

    Args:
        task: a task spec (``"mqar:cpu,T=128,N=8"``).
        model: a model id of :data:`slmlab.bench.models.MODELS` or a registered family / preset.
        lr: peak learning rate (AdamW, warm-up 10%, cosine to 0; ``constant_lr`` for Mamba's protocols).
        seed: model init and data.
        batch_size / max_steps: the budget (a run stops at ``max_steps``, or earlier when validation
            accuracy exceeds ``early_stop_acc``: both functions of the steps, so the same on any machine).
        max_time: a safety cap in seconds of training (0 = none); a run it stops is written
            ``"complete": false`` and no table shows it. Not part of :attr:`key`.
        eval_every: validation cadence in steps (an epoch for fixed sets, 500 for fresh data).
        train_on: ``scored`` or ``all`` (a full next-token LM on the training rows, safari style).
        model_config: config overrides as ``((field, value), ...)`` (e.g. ``(("d_model", 128),)``).
        constant_lr: constant learning rate after warm-up instead of cosine.
        patience: stop on a validation plateau: at the first evaluation where no gain over the
            convergence rule's tolerances happened in the last ``patience`` steps
            (:mod:`slmlab.bench.convergence`); ``max_steps`` stays the ceiling. 0: run to ``max_steps``.
        early_stop_acc: the validation accuracy that counts as solved and ends the run
            (:data:`EARLY_STOP_ACC`, 0.99); 0 = never. A claim that asks whether accuracy reaches 0.99
            needs it off: a run stopped the moment validation passes 0.99 scores about 0.99 on test by
            construction, so no number of seeds could put the interval clear of it.
    """

    task: str
    model: str
    lr: float
    seed: int = 0
    batch_size: int = 64
    max_steps: int = 10_000
    max_time: float = 0.0
    eval_every: int = 313
    train_on: str = "scored"
    model_config: tuple = ()
    constant_lr: bool = False
    patience: int = 0
    early_stop_acc: float = EARLY_STOP_ACC

    @property
    def key(self) -> str:
        """A stable identifier of what the run computes: a rerun with the same ``--out`` skips the plans whose
        key is already there finished. The ``max_time`` cap is no part of it (it does not change the result of
        a run it does not stop), so a run the cap cut short is redone under the same key with a larger cap."""
        extra = ",".join(f"{k}={v}" for k, v in self.model_config)
        return (f"{self.task}|{self.model}{'[' + extra + ']' if extra else ''}|lr={self.lr:g}|seed={self.seed}"
                f"|b={self.batch_size}|steps={self.max_steps}|eval={self.eval_every}|{self.train_on}"
                f"{'|constant_lr' if self.constant_lr else ''}{f'|patience={self.patience}' if self.patience else ''}"
                f"{'' if self.early_stop_acc == EARLY_STOP_ACC else f'|early_stop={self.early_stop_acc:g}'}")

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
