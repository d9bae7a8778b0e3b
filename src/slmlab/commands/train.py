"""``slmlab train``: argument parsing only; the run is built and trained by :mod:`slmlab.train.run`."""

from __future__ import annotations

import sys

from ._common import command_parser, split_items


def train_command(argv: list[str]) -> int:
    """Train a model: a YAML config plus key=value overrides (see docs/training.md).

    Examples:
      slmlab train configs/quickstart.yaml
      slmlab train --model lumen:lumen-tiny --data mqar:cpu max_steps=3000 optim.lr=3e-3
      slmlab train configs/quickstart.yaml --resume          # continue the run in out_dir
      torchrun --nproc_per_node=2 -m slmlab.cli train configs/quickstart.yaml   # DDP
    Writes out_dir/{run.yaml, checkpoints/step_*/, metrics.jsonl, tb/, report.json, report.md}.
    Exit status 1 if the loss diverged (the message names the step and the last good checkpoint).
    """
    from ..train.config import load_config
    from ..train.distributed import shutdown
    from ..train.run import build_trainer, format_report, write_report
    from ..train.trainer import TrainingDiverged

    p = command_parser(train_command, "train")
    p.add_argument("items", nargs="*", help="config.yaml files and key=value overrides (dotted keys: optim.lr=3e-4)")
    p.add_argument("--model", help="family, family:preset, preset, or saved model folder (= model=...)")
    p.add_argument("--data", help="corpus, files or synthetic task (= data=...)")
    p.add_argument("--out", help="run folder (= out_dir=...)")
    p.add_argument("--steps", type=int, help="optimiser steps (= max_steps=...)")
    p.add_argument("--resume", action="store_true", help="continue from the newest checkpoint of out_dir (fresh if none)")
    p.add_argument("--resume-from", metavar="PATH", help="continue from this run or checkpoint folder")
    args = p.parse_intermixed_args(argv)  # options may sit between config files and overrides
    files, overrides = split_items(args.items)
    for key, value in (("model", args.model), ("data", args.data), ("out_dir", args.out), ("max_steps", args.steps)):
        if value is not None:
            overrides.append(f"{key}={value}")
    cfg = load_config(files, overrides)
    trainer = build_trainer(cfg, resume=args.resume_from or args.resume)
    try:
        if trainer.dist.is_main:
            print(f"slmlab train: {cfg.model} ({trainer.n_params:,} parameters) on {cfg.data}, "
                  f"{cfg.max_steps} steps x {cfg.batch_size * cfg.grad_accum * trainer.dist.world_size} sequences -> {cfg.out_dir}")
        try:
            trainer.train()
        except TrainingDiverged as err:
            print(f"slmlab train: {err}", file=sys.stderr)
            return 1
        report = write_report(trainer)
        if trainer.dist.is_main:
            print(format_report(report))
    finally:
        shutdown(trainer.dist)
    return 0
