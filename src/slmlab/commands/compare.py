"""``slmlab compare``: families side by side at one non-embedding parameter budget."""

from __future__ import annotations

from pathlib import Path

from ._common import command_parser


def compare_command(argv: list[str]) -> int:
    """Compare families at one non-embedding parameter budget: fitted configs, same data/steps/lrs/seeds, one report.

    Every family is fitted to --budget (±10%) by its scaling rule, embeddings tied (--untied keeps
    them separate), then trained as `slmlab train` trains it on every --data corpus and --tasks task
    with the same step ceiling, batch, lr grid and seeds (three by default). A run stops on a validation
    plateau (--patience steps without a gain) or at --steps, the ceiling; no run has a time limit, and
    every row says converged or not converged (docs/bench.md, Convergence). Each family's lr is chosen
    on validation; its row gives the seeds' mean, per-seed values and a 95% interval across seeds (and
    test examples, on tasks); a diverged run is shown with its step. The report folder (--out) holds
    summary.md, results.jsonl, fitted_configs.json and PNGs; a rerun with the same --out skips finished
    runs, and --report-only DIR rebuilds the report from DIR/results.jsonl alone. Details: docs/compare.md.

    example: slmlab compare --models lumen,lfm2,pgsm,nanohammer,neollm --budget 2M --data shakespeare
             --tasks mqar:cpu,t7:cpu --steps 300 --lrs 1e-3,3e-3 --seeds 0,1,2 --out runs/compare
    """
    p = command_parser(compare_command, "compare")
    p.add_argument("--models", default="lumen,lfm2,pgsm,nanohammer,neollm",
                   help="comma-separated registered families (default: %(default)s)")
    p.add_argument("--budget", default="2M", help="non-embedding parameters per model: 2M, 200k, 1500000 (default: 2M)")
    p.add_argument("--data", default="", help="comma-separated text corpora (e.g. shakespeare)")
    p.add_argument("--tasks", default="", help="comma-separated task specs (e.g. mqar:cpu,t7:cpu,n_train=512)")
    p.add_argument("--steps", type=int, default=2000, help="step ceiling per run (default: 2000)")
    p.add_argument("--patience", type=int, default=None,
                   help="stop a run after this many steps without a validation gain (0: run to --steps;"
                        " default: half of --steps, at least 1,500)")
    p.add_argument("--batch-size", type=int, default=32, help="sequences per step (default: 32)")
    p.add_argument("--block-size", type=int, default=128, help="sequence length on text data (default: 128)")
    p.add_argument("--lrs", default="1e-3,3e-3",
                   help="learning-rate grid; the one best on validation is reported (default: %(default)s)")
    p.add_argument("--seeds", default="0,1,2",
                   help="comma-separated seeds; the report's rows are over them (default: %(default)s, what a claim needs)")
    p.add_argument("--eval-every", type=int, default=0,
                   help="validation cadence in steps (default: 4 per patience window, or per run)")
    p.add_argument("--eval-batches", type=int, default=16,
                   help="text validation batches per evaluation, the same for every model (0: whole split; default: 16)")
    p.add_argument("--untied", action="store_true", help="separate input table and LM head (default: tied)")
    p.add_argument("--set", action="append", default=[], metavar="FAMILY.FIELD=VALUE",
                   help="a config field one family keeps while fitting (e.g. pgsm.block_size=256); repeatable")
    p.add_argument("--out", default="runs/compare", help="report folder (default: %(default)s)")
    p.add_argument("--report-only", metavar="DIR", help="rebuild DIR's report from DIR/results.jsonl; nothing runs")
    p.add_argument("--device", default="cpu", help="cpu, cuda or auto (default: cpu)")
    p.add_argument("--threads", type=int, default=0, help="torch CPU threads (0: torch's default)")
    args = p.parse_args(argv)

    from slmlab.bench import compare

    if args.report_only:
        written = compare.rebuild_report(args.report_only)
        print(f"slmlab compare: report rebuilt from {Path(args.report_only) / 'results.jsonl'}:"
              f" {', '.join(p.name for p in written)}")
        return 0
    fixed = compare.parse_fixed(args.set)  # refused before the other values, as written
    settings = compare.CompareSettings(
        models=tuple(m.strip() for m in args.models.split(",") if m.strip()), budget=compare.parse_budget(args.budget),
        data=tuple(compare.split_specs(args.data) + compare.split_specs(args.tasks)), steps=args.steps,
        patience=args.patience, batch_size=args.batch_size, lrs=tuple(compare.split_numbers(args.lrs, "--lrs")),
        seeds=tuple(compare.split_numbers(args.seeds, "--seeds", int)), block_size=args.block_size,
        eval_every=args.eval_every, eval_batches=args.eval_batches, untied=args.untied,
        fixed=fixed, device=args.device,
    ).check()
    if args.threads:
        import torch

        torch.set_num_threads(args.threads)
    result = compare.run_compare(settings, args.out)
    print(f"slmlab compare: report in {args.out}: {', '.join(p.name for p in result['written'])}")
    print(compare.overhead_line(result["timing"]))
    compare.check_compared(result["lines"], args.out)
    return 0
