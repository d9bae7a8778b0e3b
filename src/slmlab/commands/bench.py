"""``slmlab bench``: the long-memory benchmark suite (``docs/bench.md``)."""

from __future__ import annotations

import dataclasses
from pathlib import Path

from ._common import command_parser

ACTIONS = ("run", "list", "report", "reproduce")


def bench_command(argv: list[str]) -> int:
    """Run the long-memory suite (tasks T1-T7, tiers, control models) and report it with CIs.

    slmlab bench run --tier cpu-smoke|FILE.yaml [--tasks mqar,t7] [--models attn2-z] [--seeds 0,1,2] [--out DIR] [--dry-run]
    slmlab bench list [--yaml TIER]          (--yaml prints a built-in tier's file: a copy to edit)
    slmlab bench report DIR                 (tables and plots from DIR/results.jsonl)
    slmlab bench reproduce zoology-fig2 | mamba-table1 | mamba-table11 | pgsm-distance [--out DIR] [--run]

    A run's budget is its max_steps; max_time is only a safety cap, and a run it stops is written
    "complete": false and is in no table. A run prints which run of how many is going and an ETA;
    rerunning with the same --out skips the runs already finished in DIR/results.jsonl and redoes the
    others. Ctrl-C stops the whole command (exit 130) and records nothing for the run it cut short.
    Each run writes one JSON line (task, model, parameters, state floats, lr, seed, steps, how it
    stopped, acc / token_acc / exact with 95% bootstrap CIs, ...). The report chooses each lr on
    validation and gives the seeds' mean, per-seed values and a CI across seeds and examples.
    """
    p = command_parser(bench_command, "bench")
    p.add_argument("action", choices=ACTIONS)
    p.add_argument("target", nargs="?", help="report: the results folder; reproduce: the anchor")
    p.add_argument("--tier", default=None,
                   help="cpu-smoke, cpu-full, gpu-paper or micro, or a tier file (FILE.yaml)")
    p.add_argument("--tasks", default="", help="comma-separated task names or aliases (default: the tier's)")
    p.add_argument("--models", default="", help="comma-separated model ids (default: the tier's)")
    p.add_argument("--seeds", default="",
                   help="comma-separated seeds (default: the tier file's; 0,1,2 unless it says otherwise, as claims need)")
    p.add_argument("--out", default="runs/bench", help="results folder (default runs/bench)")
    p.add_argument("--device", default="cpu", help="cpu (default), cuda, auto")
    p.add_argument("--threads", type=int, default=0, help="torch CPU threads (0 = torch's default)")
    p.add_argument("--max-time", type=float, default=None,
                   help="replace every run's max_time safety cap (seconds of training; 0 = no cap); the budget stays"
                        " max_steps")
    p.add_argument("--dry-run", action="store_true", help="list the runs and their step budgets only")
    p.add_argument("--run", action="store_true", help="reproduce: run the anchor's missing runs first")
    p.add_argument("--yaml", metavar="TIER", default=None,
                   help="list: print the built-in tier's YAML file (`> my.yaml`, edit, then run --tier my.yaml)")
    args = p.parse_args(argv)
    if args.threads < 0:
        raise ValueError(f"--threads must be >= 0, got {args.threads}; pass 0 for torch's default")
    if args.threads:
        import torch

        torch.set_num_threads(args.threads)
    return {"run": _run, "list": _list, "report": _report, "reproduce": _reproduce}[args.action](args)


def _split(text: str) -> list[str]:
    return [x.strip() for x in text.split(",") if x.strip()]


def _seeds(text: str) -> list[int] | None:
    try:
        return [int(s) for s in _split(text)] or None
    except ValueError:
        raise ValueError(f"--seeds must be comma-separated integers, got {text!r}; e.g. --seeds 0,1,2") from None


def _run(args) -> int:
    from ..bench.run import run_plans
    from ..bench.suite import filter_plans
    from ..bench.tier_file import load_tier_file, tier_path

    if not args.tier:
        raise ValueError("bench run needs --tier; pass --tier cpu-smoke (see `slmlab bench list`)")
    tier, _, plans = load_tier_file(tier_path(args.tier))
    plans = filter_plans(plans, _split(args.tasks) or None, _split(args.models) or None, _seeds(args.seeds))
    if args.max_time is not None:
        if args.max_time < 0:
            raise ValueError(f"--max-time must be >= 0 seconds, got {args.max_time}; 0 removes the safety cap")
        plans = [dataclasses.replace(x, max_time=float(args.max_time)) for x in plans]
    if not plans:
        raise ValueError(f"tier {args.tier} has no run for tasks={args.tasks!r} models={args.models!r}; see `slmlab bench list`")
    if args.dry_run:
        for i, plan in enumerate(plans, 1):
            print(f"[{i}/{len(plans)}] {plan.key}")
        print(f"{len(plans)} runs, {sum(x.max_steps for x in plans):,} steps in all, seeds"
              f" {','.join(map(str, sorted({x.seed for x in plans})))}; safety caps (max_time) sum to"
              f" {sum(x.max_time for x in plans) / 60:.1f} min")
        return 0
    _check_fits(plans)
    run_plans(plans, tier, args.out, args.device)
    print(f"results: {Path(args.out) / 'results.jsonl'}; `slmlab bench report {args.out}` for tables and plots")
    return 0


def _check_fits(plans) -> None:
    """Every (task, model) pair is checked before any training starts."""
    from ..bench.models import make_config
    from ..data.tasks import parse_task_spec

    for plan in plans:
        task = parse_task_spec(plan.task)
        try:
            make_config(plan.model, task.vocab_size, task.seq_len, dict(plan.model_config))
        except ValueError as err:
            raise ValueError(f"task {plan.task}: {err}") from None


def _list(args) -> int:
    from ..bench.anchors import ANCHORS
    from ..bench.models import MODELS
    from ..bench.tier_file import builtin_tiers, load_tier_file, tier_path
    from ..data.tasks import TASKS

    if args.yaml:
        print(tier_path(args.yaml).read_text(), end="")
        return 0
    print("tiers:")
    for name, path in builtin_tiers().items():
        _, description, plans = load_tier_file(path)
        seeds = len({p.seed for p in plans})
        print(f"  {name:<10} {len(plans):>4} runs ({seeds} seed{'s' if seeds > 1 else ''}),"
              f" {sum(p.max_steps for p in plans):>11,} steps  {description}")
    print("tasks:")
    for cls in sorted(set(TASKS.values()), key=lambda c: c.task_id):
        aliases = sorted(k for k, v in TASKS.items() if v is cls and k != cls.name)
        print(f"  T{cls.task_id} {cls.name:<15} aliases {', '.join(aliases):<24} settings {', '.join(cls.settings)}")
    print("models (plus any registered family or family:preset):")
    for entry in MODELS.values():
        count = f"{entry.params[0]:,}" if entry.params else "-"
        print(f"  {entry.id:<17} {count:>10}  {entry.description}")
    print("anchors (slmlab bench reproduce NAME):")
    for anchor in ANCHORS.values():
        print(f"  {anchor.name:<15} {anchor.title}")
    return 0


def _report(args) -> int:
    from ..bench.plots import make_plots
    from ..bench.report import best_of_lr, format_table, incomplete_note
    from ..bench.run import read_results

    folder = Path(args.target or args.out)
    lines = read_results(folder)
    print(format_table(best_of_lr(lines)))
    note = incomplete_note(lines)
    print(note or "every run complete")
    written = make_plots(lines, (folder if folder.is_dir() else folder.parent) / "plots")
    for path in written:
        print(f"plot: {path}")
    return 0


def _reproduce(args) -> int:
    from ..bench.anchors import ANCHORS
    from ..bench.report import matches, reproduce_table
    from ..bench.run import read_results, run_plans
    from ..bench.tier_file import tier_plans

    if args.target not in ANCHORS:
        raise ValueError(f"unknown anchor {args.target!r}; known: {', '.join(ANCHORS)}")
    anchor = ANCHORS[args.target]
    if args.run:
        tier = args.tier or anchor.plan_tier
        plans = [p for p in tier_plans(tier, seeds=_seeds(args.seeds))
                 if any(matches({"task": p.task_name, "model": p.model}, {k: v for k, v in where.items()
                                                                           if k in ("task", "model")})
                        for _, _, where in anchor.rows)]
        _check_fits(plans)
        run_plans(plans, tier, args.out, args.device)
    print(reproduce_table(anchor, read_results(Path(args.out))))
    return 0
