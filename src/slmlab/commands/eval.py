"""``slmlab eval``: validation loss, perplexity, bits per byte and task accuracy of a checkpoint
(the numbers come from :func:`slmlab.evaluate.evaluate_source`)."""

from __future__ import annotations

import json
from pathlib import Path

from ._common import command_parser, load_for_inference


def eval_command(argv: list[str]) -> int:
    """Evaluate a run or checkpoint on a data split: loss, perplexity, bits per byte, accuracy.

    Examples:
      slmlab eval runs/quickstart --data shakespeare
      slmlab eval runs/mqar/checkpoints/step_003000 --data mqar:cpu --split test --json
    The tokenizer saved with the checkpoint is used; block size and data cache default to the
    run's own (run.yaml beside the weights). Synthetic tasks also print accuracy per group.
    """
    from ..evaluate.lm import evaluate_source, family_forward_inputs
    from ..train.precision import autocast_factory
    from ..train.run import open_data, saved_run_config

    p = command_parser(eval_command, "eval")
    p.add_argument("run")
    p.add_argument("--data", default=None, help="data spec (default: the run's own)")
    p.add_argument("--split", default="validation")
    p.add_argument("--batch-size", type=int, default=16)
    p.add_argument("--max-batches", type=int, default=None)
    p.add_argument("--block-size", type=int, default=None)
    p.add_argument("--device", default="auto")
    p.add_argument("--json", action="store_true", help="print one JSON line instead of a table")
    args = p.parse_args(argv)
    ckpt, model, tokenizer, dev = load_for_inference(args.run, args.device)
    run_cfg = saved_run_config(ckpt)
    data = args.data or run_cfg.get("data")
    if not data:
        raise ValueError(f"{ckpt} has no run.yaml naming its data; pass --data")
    if tokenizer is None:
        raise ValueError(f"{ckpt} has no tokenizer.json; evaluation needs the tokenizer the model was trained with")
    block = args.block_size or run_cfg.get("block_size") or 256
    cache = run_cfg.get("data_cache")
    source = open_data(data, tokenizer, block, Path(cache) if cache else None, run_cfg.get("data_errors", "strict"),
                       run_cfg.get("seed", 0))
    result = evaluate_source(model, source, args.split, args.batch_size, args.max_batches,
                             family_forward_inputs(model), dev, autocast_factory(dev))
    result = {"checkpoint": str(ckpt), "data": data, "split": args.split, **result}
    if args.json:
        print(json.dumps(result))
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

