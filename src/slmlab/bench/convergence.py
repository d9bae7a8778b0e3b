"""Converged or not: the rule every ``slmlab bench`` and ``slmlab compare`` row is read by, and the
plateau stop that ends a run by the same rule (``docs/bench.md``, Convergence).

A run's curve is its periodic validation: ``[[step, loss, acc], ...]`` (``acc`` None on text). Over the
last ``W`` steps of the run (``W`` = the run's ``patience``; a run without one is judged over the last
quarter of its ``max_steps``) the run is **still improving** when its best validation accuracy rose by
more than :data:`ACC_TOL` (absolute) or its best validation loss fell by more than :data:`LOSS_TOL`
(relative) against the best up to step ``last - W``. A run is

* **converged** when it stopped on the solved threshold (validation accuracy above the run's
  ``early_stop_acc``, :data:`slmlab.bench.suite.EARLY_STOP_ACC` by default: nothing left to gain), or
  when it is not still improving;
* **not converged** when it is still improving, or when it is shorter than ``W`` (no evaluation at or
  before ``last - W``: it cannot show a plateau); a row whose not-converged seeds all ran to their step
  ceiling says so (``not converged (1 of 3 seeds, at the 4,000-step ceiling)``): the ceiling is the
  limit of that reading, stated on the row;
* **convergence unknown (run before the rule)** when its result line has no curve (written before the
  rule existed).

With ``patience`` P a run stops at the first evaluation where the rule reads "converged" over the last
P steps (:class:`PlateauStop`); ``max_steps`` stays the ceiling, and the clock decides nothing.
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from pathlib import Path

ACC_TOL = 0.01  # a gain of best validation accuracy above this (absolute) is still improving
LOSS_TOL = 0.01  # a fall of best validation loss above this fraction is still improving
CONVERGED = "converged"
NOT_CONVERGED = "not converged"
UNKNOWN = "convergence unknown (run before the rule)"
PLATEAU = "validation plateau"  # the trainer's stop_reason of a plateau stop starts with these words
QUARTER = 4  # without a patience, the window is max_steps // QUARTER


@dataclass(frozen=True)
class Judgement:
    """The rule's reading of one run: ``word`` (:data:`CONVERGED`, :data:`NOT_CONVERGED` or :data:`UNKNOWN`),
    ``why`` (the numbers behind it) and ``ceiling``: the run's ``max_steps`` when it ran all of them (0 when it
    stopped before its ceiling, or the ceiling is not known)."""

    word: str
    why: str
    ceiling: int = 0

    @property
    def converged(self) -> bool:
        return self.word == CONVERGED


def window(patience: int, max_steps: int) -> int:
    """The steps the rule looks back over: the run's ``patience``, or a quarter of ``max_steps``."""
    return int(patience) if patience and patience > 0 else max(1, int(max_steps) // QUARTER)


def judge(curve: list | None, span: int, solved: bool = False) -> Judgement:
    """Read ``curve`` (``[[step, loss, acc or None], ...]``, in step order) over its last ``span`` steps.

    Args:
        curve: the run's validation points; None or empty: written before the rule.
        span: the window ``W`` in steps (:func:`window`).
        solved: the run stopped early on validation accuracy above the solved threshold.
    """
    if solved:
        return Judgement(CONVERGED, "stopped on the solved threshold")
    if not curve:
        return Judgement(UNKNOWN, "no validation curve in the result line")
    last = curve[-1][0]
    before = [p for p in curve if p[0] <= last - span]
    if not before:
        return Judgement(NOT_CONVERGED, f"{last} steps, shorter than the {span}-step window: no plateau shown")
    gains = []
    accs_before = [p[2] for p in before if p[2] is not None]
    accs = [p[2] for p in curve if p[2] is not None]
    if accs_before and max(accs) - max(accs_before) > ACC_TOL:
        gains.append(f"best validation accuracy {max(accs_before):.4f} -> {max(accs):.4f}")
    loss_before, loss = min(p[1] for p in before), min(p[1] for p in curve)
    if loss < loss_before * (1 - LOSS_TOL):
        gains.append(f"best validation loss {loss_before:.4f} -> {loss:.4f}")
    if gains:
        return Judgement(NOT_CONVERGED, f"{' and '.join(gains)} in the last {span} steps")
    return Judgement(CONVERGED, f"no gain over {ACC_TOL} accuracy or {LOSS_TOL:.0%} loss in the last {span} steps")


def point(step: int, result: dict) -> list:
    """One curve point from a validation result (``loss``, and ``acc`` on a task)."""
    acc = result.get("acc")
    return [int(step), round(float(result["loss"]), 5), None if acc is None else round(float(acc), 5)]


def read_curve(run_dir: str | Path) -> list[list]:
    """The curve of a run folder: its ``metrics.jsonl`` validation records, one point per step."""
    from ..train.metrics import read_metrics

    path = Path(run_dir) / "metrics.jsonl"
    if not path.is_file():
        return []
    by_step = {int(r["step"]): point(r["step"], r) for r in read_metrics(path, "eval") if "loss" in r}
    return [by_step[s] for s in sorted(by_step)]


@dataclass
class PlateauStop:
    """Stops a run at the first evaluation where :func:`judge` reads "converged" over the last
    ``patience`` steps. ``observe`` returns the stop reason, or ``""`` to go on."""

    patience: int
    max_steps: int
    curve: list = field(default_factory=list)

    def observe(self, step: int, result: dict) -> str:
        if self.patience <= 0 or "loss" not in result:
            return ""
        self.curve.append(point(step, result))
        if not judge(self.curve, self.patience).converged:
            return ""
        return (f"{PLATEAU} at step {step} of {self.max_steps}: no gain over {ACC_TOL} accuracy or {LOSS_TOL:.0%}"
                f" loss in the last {self.patience} steps")


def attach(trainer, patience: int) -> None:
    """Make ``trainer`` stop on a validation plateau of ``patience`` steps (0: it runs to ``max_steps``):
    a :class:`PlateauStop` on its evaluation hooks (:attr:`slmlab.train.trainer.Trainer.on_evaluation`),
    read after the trainer's own early stop, at each of its evaluations."""
    if patience > 0:
        trainer.on_evaluation.append(PlateauStop(patience, trainer.cfg.max_steps).observe)


def stopped_on_plateau(stop_reason: str) -> bool:
    return str(stop_reason).startswith(PLATEAU)


def carries_to(line: dict, patience: int) -> bool:
    """Whether the finished run of ``line`` is, step for step, the run a longer ``patience`` makes (0: no
    plateau stop, the longest), so a rerun takes it instead of training again.

    The rule is monotone in its window: a plateau read over ``W`` steps is also one over any ``W' <= W``
    (the points before the window are fewer, their best no better), so a run the plateau did not stop
    under ``line["patience"]`` is not stopped under a longer one either; it ends where it ended (the step
    ceiling, the solved threshold, a divergence) with the same curve and weights. A run that stopped on a
    plateau, or that ran without a plateau stop (a patience may stop it sooner), is not carried."""
    before = int(line.get("patience") or 0)
    if before <= 0 or before == patience or 0 < patience < before:
        return False
    return not stopped_on_plateau(line.get("stop_reason") or "")


def carried(todo: list, lines: list[dict], key_under, patience_of) -> list[tuple[object, dict]]:
    """``[(plan, line)]``: each plan of ``todo`` whose run a finished line holds under a shorter patience
    (:func:`carries_to`). ``key_under(plan, p)`` is the plan's key under patience ``p``, ``patience_of(plan)``
    its own patience; ``lines`` are the finished result lines (latest per key)."""
    by_key = {line["key"]: line for line in lines}
    patiences = sorted({int(line.get("patience") or 0) for line in lines} - {0}, reverse=True)
    found = []
    for plan in todo:
        target = patience_of(plan)
        source = next((by_key[k] for p in patiences if (k := key_under(plan, p)) in by_key
                       and carries_to(by_key[k], target)), None)
        if source is not None:
            found.append((plan, source))
    return found


def carried_note(carried: int, todo: int) -> str:
    """The line ``bench run`` and ``compare`` print when they carry runs over."""
    return (f"{carried} of {todo} runs carried over from a shorter patience that did not stop them (the same run step"
            " for step; carried_from names each one's line): not trained again")


def row_word(judgements: list[Judgement]) -> str:
    """The word of a row over its seeds: unknown if any seed is, converged if every seed is, otherwise
    ``not converged (k of n seeds)``, with ``at the N-step ceiling`` added when every seed that is not
    converged ran to the same ceiling ``N`` (the limit of the row's reading)."""
    if not judgements or any(j.word == UNKNOWN for j in judgements):
        return UNKNOWN
    still = [j for j in judgements if not j.converged]
    if not still:
        return CONVERGED
    notes = [] if len(judgements) == 1 else [f"{len(still)} of {len(judgements)} seeds"]
    ceilings = {j.ceiling for j in still}
    if len(ceilings) == 1 and min(ceilings) > 0:
        notes.append(f"at the {min(ceilings):,}-step ceiling")
    return f"{NOT_CONVERGED} ({', '.join(notes)})" if notes else NOT_CONVERGED


def line_judgement(line: dict, curve_key: str = "curve") -> Judgement:
    """The rule's reading of one result line (bench or compare): its curve under ``curve_key``, its
    ``patience`` and ``max_steps``, and whether it stopped on the solved threshold."""
    stop = str(line.get("stop") or line.get("stop_reason") or "")
    solved = stop.startswith(("early stop", "validation accuracy"))
    max_steps = int(line.get("max_steps") or 0)
    judgement = judge(line.get(curve_key), window(line.get("patience") or 0, max_steps), solved)
    if max_steps and int(line.get("steps") or 0) >= max_steps:
        return replace(judgement, ceiling=max_steps)
    return judgement
