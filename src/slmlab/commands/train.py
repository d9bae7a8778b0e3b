"""``slmlab train``: argument parsing only; the run is built and trained by :mod:`slmlab.train.run`."""

from __future__ import annotations

from ._common import add_run_arguments, command_parser, run_overrides, split_items


def train_command(argv: list[str]) -> int:
    """Train a model: a YAML config plus key=value overrides (see docs/training.md).

    Examples:
      slmlab train configs/quickstart.yaml
      slmlab train --model lumen:lumen-tiny --data mqar:cpu max_steps=3000 optim.lr=3e-3
      slmlab train configs/quickstart.yaml --resume          # continue the run in out_dir
      torchrun --nproc_per_node=2 -m slmlab.cli train configs/quickstart.yaml   # DDP
      torchrun --nproc_per_node=8 -m slmlab.cli train configs/quickstart.yaml parallel=fsdp2   # FSDP2
      torchrun --nnodes=2 --nproc_per_node=8 --rdzv-backend=c10d --rdzv-endpoint=HOST:29500 -m slmlab.cli train ...
    Writes out_dir/{run.yaml, checkpoints/step_*/, metrics.jsonl, tb/, report.json, report.md}.
    parallel=fsdp2 shards the model over the ranks and its checkpoints, which --resume reads at any
    world size (keep batch_size x world_size; docs/training.md, "Scaling out"). One run holds out_dir
    at a time (out_dir/.lock). --resume refuses changes to the model, data, seed, tokenizer or
    sequence layout (see the diff it prints) unless --allow-change FIELD.
    max_steps is the run's budget; max_time (seconds of training, 0 = none) is only a safety cap: a run
    it stops early says "stopped by the max_time safety cap at step N of M" and its report is marked
    incomplete (raise max_time and --resume to finish).
    Exit status: 0 done; 1 the loss or weights diverged (the message names the step and the last
    good checkpoint); 2 an error in the input; 130 Ctrl-C / 143 SIGTERM (a checkpoint was saved).
    """
    p = command_parser(train_command, "train")
    p.add_argument("items", nargs="*", help="config.yaml files and key=value overrides (dotted keys: optim.lr=3e-4)")
    p.add_argument("--model", help="family, family:preset, preset, or saved model folder (= model=...)")
    p.add_argument("--data", help="corpus, files or synthetic task (= data=...)")
    add_run_arguments(p, "continue from the newest checkpoint of out_dir (fresh if none)",
                      "on resume, accept a change of this protected field (data, seed, block_size, ...); repeatable")
    args = p.parse_intermixed_args(argv)  # options may sit between config files and overrides
    from ..train.run import train_run

    files, overrides = split_items(args.items)
    overrides += [f"{key}={value}" for key, value in (("model", args.model), ("data", args.data)) if value is not None]
    overrides += run_overrides(args)
    return train_run(files, overrides, args.resume_from or args.resume, tuple(args.allow_change))
