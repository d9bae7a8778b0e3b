"""``slmlab eval``: validation loss, perplexity, bits per byte and task accuracy of a checkpoint
(:func:`slmlab.bench.evaluate_run.evaluate_run`), or lm-evaluation-harness tasks with ``--tasks``
(:func:`~slmlab.bench.evaluate_run.evaluate_tasks_run`; lm-eval is imported only then)."""

from __future__ import annotations

from ..outputs import dumps_finite
from ._common import add_quantize_argument, command_parser


def eval_command(argv: list[str]) -> int:
    """Evaluate a run or checkpoint on a data split: loss, perplexity, bits per byte, accuracy.

    Examples:
      slmlab eval runs/quickstart --data shakespeare
      slmlab eval runs/mqar/checkpoints/step_003000 --data mqar:cpu --split test --json
    The tokenizer saved with the checkpoint is used; the block size defaults to the context the
    model was trained on, the data cache to the run's own (run.yaml beside the weights). Synthetic
    tasks also print accuracy per group. Progress (batches done / total, tokens/s, eta) goes to
    stderr: a live bar on a terminal, a plain line every tenth of the batches or 30 s otherwise
    (--no-progress: none); stdout holds only the result.

    lm-evaluation-harness tasks (extra: pip install "slmlab[eval]"):
      slmlab eval runs/quickstart --tasks arc_easy,piqa --limit 100
      slmlab eval runs/quickstart --tasks my_task --include-path my_tasks/
    The context window is the context the model was trained on (--block-size to change it); see
    docs/eval.md for a task on local JSON files that runs offline.
    """
    p = command_parser(eval_command, "eval")
    p.add_argument("run")
    p.add_argument("--data", default=None, help="data spec (default: the run's own)")
    p.add_argument("--split", default="validation")
    p.add_argument("--batch-size", type=int, default=16)
    p.add_argument("--max-batches", type=int, default=None)
    p.add_argument("--block-size", type=int, default=None)
    p.add_argument("--device", default="auto")
    p.add_argument("--json", action="store_true", help="print one JSON line instead of a table")
    p.add_argument("--no-progress", action="store_true", help="no progress on stderr")
    p.add_argument("--tasks", metavar="T1,T2", help="lm-evaluation-harness tasks (names, patterns or .yaml files)")
    p.add_argument("--include-path", metavar="DIR", help="a folder of extra lm-eval task YAMLs (with --tasks)")
    p.add_argument("--limit", metavar="N", help="documents per task, or a fraction below 1 (with --tasks)")
    p.add_argument("--num-fewshot", type=int, default=None, help="few-shot examples (with --tasks; default: the task's)")
    add_quantize_argument(p)
    args = p.parse_args(argv)
    for name in ("batch_size", "max_batches", "block_size", "num_fewshot"):
        value = getattr(args, name)
        least = 0 if name == "num_fewshot" else 1
        if value is not None and value < least:
            flag = "--" + name.replace("_", "-")
            raise ValueError(f"{flag} must be >= {least}, got {value}; "
                             + ("leave it out to read the whole split" if name == "max_batches" else f"pass {least} or more"))
    if args.tasks is None and (args.include_path or args.limit or args.num_fewshot is not None):
        raise ValueError("--include-path, --limit and --num-fewshot apply to lm-eval tasks; add --tasks T1,T2")
    if args.tasks is not None:
        return _tasks_command(args)
    from ..bench.evaluate_run import evaluate_run

    result = evaluate_run(args.run, args.data, args.split, args.batch_size, args.max_batches, args.block_size,
                          args.quantize, args.device, progress=not args.no_progress)
    if args.json:
        print(dumps_finite(result))
        return 0
    for key, value in result.items():
        if key == "acc_by_group":
            for g, a in value.items():
                print(f"  acc[group={g}]".ljust(22) + f"{a:.4f}")
        elif isinstance(value, float):
            print(f"{key:<22}{value:.4f}")
        else:
            print(f"{key:<22}{value}")
    return 0


def _tasks_command(args) -> int:
    """``slmlab eval RUN --tasks ...``: lm-evaluation-harness tasks on the checkpoint."""
    from ..bench.evaluate_run import evaluate_tasks_run
    from ..evaluate.tasks import parse_limit, require_lm_eval, resolve_tasks, split_task_names

    require_lm_eval()  # before loading the model: a missing extra is the first thing to say
    limit = parse_limit(args.limit)
    selection = resolve_tasks(split_task_names(args.tasks), args.include_path)  # refused before the model loads
    if args.data is not None or args.max_batches is not None or args.split != "validation":
        raise ValueError("--data, --split and --max-batches apply to the bits/byte evaluation; drop them with --tasks")
    results = evaluate_tasks_run(args.run, selection, limit=limit, num_fewshot=args.num_fewshot,
                                 batch_size=args.batch_size, block_size=args.block_size, quantize=args.quantize,
                                 device=args.device)
    if args.json:
        print(dumps_finite({key: results[key] for key in ("checkpoint", "context", "results")}
                           | {"n-samples": results.get("n-samples", {})}, default=str))
        return 0
    from lm_eval.utils import make_table

    print(f"checkpoint {results['checkpoint']}, context {results['context']} tokens")
    print(make_table(results))
    if results.get("groups"):
        print(make_table(results, "groups"))
    return 0
