"""The benchmark suite's entry points, one per ``slmlab bench`` action (``docs/bench.md``).

:func:`select_plans` / :func:`run_tier` (``run``), :func:`catalogue` / :func:`tier_yaml` (``list``),
:func:`report_lines` (``report``), :func:`reproduce` (``reproduce``). Each returns what the command
prints, so a test or a notebook gets the same text without the command. Task, model and seed
selections are lists or comma-separated text, as the command's flags give them.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterator
from pathlib import Path


def _names(selection: str | list[str] | None) -> list[str] | None:
    """``"a, b"`` or ``["a", "b"]`` -> ``["a", "b"]``; nothing named -> None (every one)."""
    items = selection.split(",") if isinstance(selection, str) else list(selection or [])
    return [x.strip() for x in items if x.strip()] or None


def _seed_list(seeds: str | list[int] | None) -> list[int] | None:
    """``"0,1,2"`` or ``[0, 1, 2]`` -> ``[0, 1, 2]``; nothing named -> None (the tier's seeds)."""
    if not isinstance(seeds, str):
        return list(seeds) if seeds else None
    try:
        return [int(s) for s in _names(seeds) or []] or None
    except ValueError:
        raise ValueError(f"--seeds must be comma-separated integers, got {seeds!r}; e.g. --seeds 0,1,2") from None


def select_plans(tier: str, tasks: str | list[str] | None = None, models: str | list[str] | None = None,
                 seeds: str | list[int] | None = None, max_time: float | None = None) -> tuple[str, list]:
    """``(tier name, runs)``: the runs of ``tier`` (a built-in name or a tier file) for ``tasks``,
    ``models`` and ``seeds`` (None: the tier's), each with its ``max_time`` safety cap replaced by
    ``max_time`` when given (0: no cap).

    Raises:
        ValueError: an unknown tier, task or model; a negative ``max_time``; a selection with no run.
    """
    from .suite import filter_plans
    from .tier_file import load_tier_file, tier_path

    name, _, plans = load_tier_file(tier_path(tier))
    plans = filter_plans(plans, _names(tasks), _names(models), _seed_list(seeds))
    if max_time is not None:
        if max_time < 0:
            raise ValueError(f"--max-time must be >= 0 seconds, got {max_time}; 0 removes the safety cap")
        plans = [dataclasses.replace(x, max_time=float(max_time)) for x in plans]
    if not plans:
        raise ValueError(f"tier {tier} has no run for tasks={tasks!r} models={models!r}; see `slmlab bench list`")
    return name, plans


def plan_summary(plans: list) -> str:
    """A dry run's text: one line per run (``[i/n] key``), then the runs, steps, seeds and safety caps."""
    lines = [f"[{i}/{len(plans)}] {plan.key}" for i, plan in enumerate(plans, 1)]
    lines.append(f"{len(plans)} runs, {sum(x.max_steps for x in plans):,} steps in all, seeds"
                 f" {','.join(map(str, sorted({x.seed for x in plans})))}; safety caps (max_time) sum to"
                 f" {sum(x.max_time for x in plans) / 60:.1f} min")
    return "\n".join(lines)


def check_fits(plans: list) -> None:
    """Build every (task, model) pair's config before any training starts: a model that cannot take a
    task is refused (ValueError naming the task) before the first run, not hours into a tier."""
    from ..data.tasks import parse_task_spec
    from .models import make_config

    for plan in plans:
        task = parse_task_spec(plan.task)
        try:
            make_config(plan.model, task.vocab_size, task.seq_len, dict(plan.model_config))
        except ValueError as err:
            raise ValueError(f"task {plan.task}: {err}") from None


def run_tier(tier: str, out: str | Path, device: str = "cpu", tasks: str | list[str] | None = None,
             models: str | list[str] | None = None, seeds: str | list[int] | None = None,
             max_time: float | None = None, log=print) -> list[dict]:
    """Run the :func:`select_plans` runs not yet finished in ``<out>/results.jsonl`` (one line each),
    after :func:`check_fits`; returns the records of the runs made now (:func:`slmlab.bench.run.run_plans`)."""
    from .run import run_plans

    name, plans = select_plans(tier, tasks, models, seeds, max_time)
    check_fits(plans)
    return run_plans(plans, name, out, device, log)


def tier_yaml(tier: str) -> str:
    """The YAML file of a built-in tier (or a tier file), to copy and edit."""
    from .tier_file import tier_path

    return tier_path(tier).read_text()


def catalogue() -> str:
    """``slmlab bench list``: the built-in tiers (runs, seeds, steps), the tasks with their aliases and
    settings, the control models with their parameter counts, and the anchors."""
    from ..data.tasks import TASKS
    from .anchors import ANCHORS
    from .models import MODELS
    from .tier_file import builtin_tiers, load_tier_file

    lines = ["tiers:"]
    tiers = builtin_tiers()
    width = max(len(name) for name in tiers)
    for name, path in tiers.items():
        _, description, plans = load_tier_file(path)
        seeds = len({p.seed for p in plans})
        lines.append(f"  {name:<{width}} {len(plans):>4} runs ({seeds} seed{'s' if seeds > 1 else ''}),"
                     f" {sum(p.max_steps for p in plans):>11,} steps  {description}")
    lines.append("tasks:")
    for cls in sorted(set(TASKS.values()), key=lambda c: c.task_id):
        aliases = sorted(k for k, v in TASKS.items() if v is cls and k != cls.name)
        lines.append(f"  T{cls.task_id} {cls.name:<15} aliases {', '.join(aliases):<24} settings {', '.join(cls.settings)}")
    lines.append("models (plus any registered family or family:preset):")
    for entry in MODELS.values():
        count = f"{entry.params[0]:,}" if entry.params else "-"
        lines.append(f"  {entry.id:<17} {count:>10}  {entry.description}")
    lines.append("anchors (slmlab bench reproduce NAME):")
    lines += [f"  {anchor.name:<15} {anchor.title}" for anchor in ANCHORS.values()]
    return "\n".join(lines)


def report_lines(folder: str | Path, write: bool = False) -> Iterator[str]:
    """``slmlab bench report``'s lines, as they are made: the table of ``folder/results.jsonl`` (or a
    results file itself), the incomplete runs' note, then ``page: ...`` when ``write`` (``report.md``
    regenerated byte for byte) and ``plot: ...`` per plot written under ``plots/``."""
    from .pages import results_page
    from .plots import make_plots
    from .report import best_of_lr, format_table, incomplete_note
    from .run import read_results

    folder = Path(folder)
    lines = read_results(folder)
    yield format_table(best_of_lr(lines))
    yield incomplete_note(lines) or "every run complete"
    home, name = (folder, folder.name) if folder.is_dir() else (folder.parent, folder.parent.name)
    if write:
        page = home / "report.md"
        page.write_text(results_page(lines, name))
        yield f"page: {page}"
    for path in make_plots(lines, home / "plots"):
        yield f"plot: {path}"


def reproduce(anchor: str, out: str | Path, run: bool = False, tier: str | None = None,
              seeds: str | list[int] | None = None, device: str = "cpu") -> str:
    """The table of ``anchor`` (published numbers beside ours from ``out/results.jsonl``); with ``run``,
    the anchor's missing runs of ``tier`` (default: the anchor's) are run first.

    Raises:
        ValueError: an unknown anchor, or what :func:`check_fits` and the runs refuse.
    """
    from .anchors import ANCHORS
    from .report import matches, reproduce_table
    from .run import read_results, run_plans
    from .tier_file import tier_plans

    if anchor not in ANCHORS:
        raise ValueError(f"unknown anchor {anchor!r}; known: {', '.join(ANCHORS)}")
    spec = ANCHORS[anchor]
    if run:
        tier = tier or spec.plan_tier
        wanted = [{k: v for k, v in where.items() if k in ("task", "model")} for _, _, where in spec.rows]
        plans = [p for p in tier_plans(tier, seeds=_seed_list(seeds))
                 if any(matches({"task": p.task_name, "model": p.model}, w) for w in wanted)]
        check_fits(plans)
        run_plans(plans, tier, out, device)
    return reproduce_table(spec, read_results(Path(out)))
