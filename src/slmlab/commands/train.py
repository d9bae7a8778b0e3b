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
    p.add_argument("--out", help="run folder (= out_dir=...)")
    p.add_argument("--steps", type=int, help="optimiser steps (= max_steps=...)")
    p.add_argument("--resume", action="store_true", help="continue from the newest checkpoint of out_dir (fresh if none)")
    p.add_argument("--resume-from", metavar="PATH", help="continue from this run or checkpoint folder")
    p.add_argument("--allow-change", metavar="FIELD", action="append", default=[],
                   help="on resume, accept a change of this protected field (data, seed, block_size, ...); repeatable")
    args = p.parse_intermixed_args(argv)  # options may sit between config files and overrides
    import os

    from ..train.config import load_config
    from ..train.distributed import shutdown
    from ..train.lock import RunLock
    from ..train.run import build_trainer, format_report, write_report
    from ..train.signals import exit_status, sigterm_as_interrupt
    from ..train.trainer import TIME_CAP_ADVICE, TrainingDiverged, stopped_by_time_cap

    files, overrides = split_items(args.items)
    for key, value in (("model", args.model), ("data", args.data), ("out_dir", args.out), ("max_steps", args.steps)):
        if value is not None:
            overrides.append(f"{key}={value}")
    cfg = load_config(files, overrides)
    with RunLock(cfg.out_dir, enabled=int(os.environ.get("RANK", "0")) == 0), sigterm_as_interrupt():
        trainer = build_trainer(cfg, resume=args.resume_from or args.resume, allow_change=tuple(args.allow_change),
                                given=given_keys(files, overrides))
        try:
            if trainer.dist.is_main:
                print(f"slmlab train: {cfg.model} ({trainer.n_params:,} parameters) on {cfg.data}, "
                      f"{cfg.max_steps} steps x {cfg.batch_size * cfg.grad_accum * trainer.dist.world_size} sequences"
                      f" -> {cfg.out_dir}")
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
    status = exit_status(trainer.state.stop_reason)
    if status:
        print(f"slmlab train: {trainer.state.stop_reason}; resume with --resume", file=sys.stderr)
    elif stopped_by_time_cap(trainer.state.stop_reason):
        print(f"slmlab train: {trainer.state.stop_reason}; {TIME_CAP_ADVICE}", file=sys.stderr)
    return status


def given_keys(files: list[str], overrides: list[str]) -> frozenset[str]:
    """The top-level config keys the user set (in a config file or an override)."""
    from pathlib import Path

    import yaml

    from ..train.config import parse_overrides

    keys = set(parse_overrides(list(overrides)))
    for path in files:
        loaded = yaml.safe_load(Path(path).read_text()) or {}
        keys |= set(loaded) if isinstance(loaded, dict) else set()
    return frozenset(keys)
