"""``slmlab eval``: validation loss, perplexity, bits per byte and task accuracy of a checkpoint
(the numbers come from :func:`slmlab.evaluate.evaluate_source`), or lm-evaluation-harness tasks
with ``--tasks`` (:func:`slmlab.evaluate.tasks.run_tasks`; lm-eval is imported only then)."""

from __future__ import annotations

from pathlib import Path

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
    from ..evaluate.lm import count_eval_batches, evaluate_source, family_forward_inputs
    from ..models.quantize import apply_quantization
    from ..train.precision import autocast_factory
    from ..train.run import open_data
    from ..train.saved import load_for_inference

    loaded = load_for_inference(args.run, args.device)
    ckpt, model, tokenizer, dev = loaded.checkpoint, loaded.model, loaded.tokenizer, loaded.device
    apply_quantization(model, args.quantize, dev)
    run_cfg = loaded.run_config
    data = args.data or run_cfg.get("data")
    if not data:
        raise ValueError(f"{ckpt} has no run.yaml naming its data; pass --data")
    if tokenizer is None:
        raise ValueError(f"{ckpt} has no tokenizer.json; evaluation needs the tokenizer the model was trained with")
    block = loaded.context(args.block_size)
    cache = run_cfg.get("data_cache")
    source = open_data(data, tokenizer, block, Path(cache) if cache else None, run_cfg.get("data_errors", "strict"),
                       run_cfg.get("seed", 0))
    progress = eval_progress(count_eval_batches(source, args.split, args.batch_size, args.max_batches),
                             not args.no_progress)
    progress.write(f"slmlab eval: {ckpt} on {data} ({args.split}): {progress.total} batches of {args.batch_size}"
                   f" sequences of {source.seq_len} tokens on {dev}")
    try:
        result = evaluate_source(model, source, args.split, args.batch_size, args.max_batches,
                                 family_forward_inputs(model), dev, autocast_factory(dev), progress=progress.advance)
    finally:
        progress.close()
    result = {"checkpoint": str(ckpt), "data": data, "split": args.split, **result}
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


def eval_progress(total: int, enabled: bool = True):
    """The progress display of an evaluation of ``total`` batches, on stderr (stdout holds the result):
    the training display (:class:`slmlab.train.progress.Progress`) counting batches, a line every
    tenth of them (or 30 s) off a terminal."""
    import sys

    from ..train.progress import Progress

    return Progress(total, enabled=enabled, every_steps=max(1, total // 10), stream=sys.stderr, desc="eval",
                    unit="batch", label="eval batch")


def _tasks_command(args) -> int:
    """``slmlab eval RUN --tasks ...``: lm-evaluation-harness tasks on the checkpoint."""
    from ..evaluate.tasks import parse_limit, require_lm_eval, resolve_tasks, run_tasks, split_task_names
    from ..models.quantize import apply_quantization
    from ..train.precision import autocast_factory
    from ..train.saved import load_for_inference

    require_lm_eval()  # before loading the model: a missing extra is the first thing to say
    limit = parse_limit(args.limit)
    selection = resolve_tasks(split_task_names(args.tasks), args.include_path)  # refused before the model loads
    if args.data is not None or args.max_batches is not None or args.split != "validation":
        raise ValueError("--data, --split and --max-batches apply to the bits/byte evaluation; drop them with --tasks")
    loaded = load_for_inference(args.run, args.device)
    ckpt, model, tokenizer, dev = loaded.checkpoint, loaded.model, loaded.tokenizer, loaded.device
    apply_quantization(model, args.quantize, dev)
    if tokenizer is None:
        raise ValueError(f"{ckpt} has no tokenizer.json; lm-eval tasks need the tokenizer the model was trained with")
    context = loaded.context(args.block_size)
    results = run_tasks(model, tokenizer, selection, max_length=context, limit=limit,
                        num_fewshot=args.num_fewshot, batch_size=args.batch_size, device=dev,
                        autocast=autocast_factory(dev))
    if args.json:
        print(dumps_finite({"checkpoint": str(ckpt), "context": context, "results": results["results"],
                          "n-samples": results.get("n-samples", {})}, default=str))
        return 0
    from lm_eval.utils import make_table

    print(f"checkpoint {ckpt}, context {context} tokens")
    print(make_table(results))
    if results.get("groups"):
        print(make_table(results, "groups"))
    return 0
