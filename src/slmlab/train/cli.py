"""``slmlab train``, ``slmlab generate`` and ``slmlab tokenizer``: argument parsing only; the work
is in :mod:`slmlab.train.run`, :mod:`slmlab.generation` and :mod:`slmlab.data`."""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path


def _parser(func, prog: str) -> argparse.ArgumentParser:
    doc = (func.__doc__ or "").strip()
    head, _, rest = doc.partition("\n")
    return argparse.ArgumentParser(prog=f"slmlab {prog}", description=head, epilog=rest.strip() or None,
                                   formatter_class=argparse.RawDescriptionHelpFormatter)


def split_items(items: list[str]) -> tuple[list[str], list[str]]:
    """Positional words -> (YAML config files, ``key=value`` overrides)."""
    files, overrides = [], []
    for item in items:
        if "=" in item:
            overrides.append(item)
        elif item.endswith((".yaml", ".yml")):
            files.append(item)
        else:
            raise ValueError(f"expected a .yaml config file or key=value, got {item!r}")
    return files, overrides


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
    from .config import load_config
    from .distributed import shutdown
    from .run import build_trainer, format_report, write_report
    from .trainer import TrainingDiverged

    p = _parser(train_command, "train")
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


def _load_for_inference(path: str, device: str):
    import torch
    from transformers import AutoModelForCausalLM, PreTrainedTokenizerFast

    import slmlab  # noqa: F401  (registers the families with the Auto classes)

    from .checkpoint import _quiet_hf_progress, check_checkpoint, resolve_checkpoint
    from .trainer import resolve_device

    ckpt = resolve_checkpoint(path)
    check_checkpoint(ckpt, need_trainer=False)
    dev = resolve_device(device)
    with _quiet_hf_progress():
        model = AutoModelForCausalLM.from_pretrained(str(ckpt), dtype=torch.float32).to(dev).eval()
    tokenizer = PreTrainedTokenizerFast.from_pretrained(str(ckpt)) if (ckpt / "tokenizer.json").is_file() else None
    return ckpt, model, tokenizer, dev


def generate_command(argv: list[str]) -> int:
    """Stream a continuation from a trained run or checkpoint (works for every family).

    RUN is a run folder (its newest checkpoint is used), a checkpoint folder, or any saved model.
    Examples:
      slmlab generate runs/quickstart --prompt "ROMEO:" --max-new-tokens 200
      slmlab generate runs/mqar --prompt-ids 5,600,7,700 --temperature 0
    """
    import torch

    from ..generation import SamplingConfig, generate

    p = _parser(generate_command, "generate")
    p.add_argument("run")
    p.add_argument("--prompt", default=None, help="text prompt (needs the tokenizer saved with the model)")
    p.add_argument("--prompt-ids", default=None, help="comma-separated token ids instead of text")
    p.add_argument("--max-new-tokens", type=int, default=200)
    p.add_argument("--temperature", type=float, default=0.8, help="0 = greedy")
    p.add_argument("--top-k", type=int, default=50)
    p.add_argument("--top-p", type=float, default=1.0)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--device", default="auto")
    p.add_argument("--compile", action="store_true",
                   help="compile the decode step with torch.compile (Lumen, LFM2; ~10 s once, then faster per token)")
    args = p.parse_args(argv)
    ckpt, model, tokenizer, dev = _load_for_inference(args.run, args.device)
    if args.prompt_ids is not None:
        ids = [int(x) for x in args.prompt_ids.replace(" ", "").split(",") if x]
    elif tokenizer is not None:
        ids = tokenizer(args.prompt or "", add_special_tokens=False)["input_ids"]
        if not ids and tokenizer.bos_token_id is not None:
            ids = [tokenizer.bos_token_id]
    else:
        raise ValueError(f"{ckpt} has no tokenizer.json; pass --prompt-ids")
    if not ids:
        raise ValueError("the prompt is empty; give --prompt text or --prompt-ids")
    input_ids = torch.tensor([ids], device=dev)
    max_pos = model.max_positions()
    n_new = args.max_new_tokens if max_pos is None else max(0, min(args.max_new_tokens, max_pos - len(ids)))
    new: list[int] = []
    printed = 0
    if tokenizer is not None and args.prompt_ids is None:
        print(args.prompt or "", end="", flush=True)

    def stream(token: torch.Tensor) -> None:
        nonlocal printed
        new.append(int(token[0]))
        if tokenizer is None or args.prompt_ids is not None:
            print(new[-1], end=" ", flush=True)
            return
        text = tokenizer.decode(new, skip_special_tokens=True)
        if not text.endswith("\ufffd"):  # wait for the rest of a multi-byte character
            print(text[printed:], end="", flush=True)
            printed = len(text)

    stops = [tokenizer.eos_token_id] if tokenizer is not None and tokenizer.eos_token_id is not None else []
    gen = torch.Generator(device=dev).manual_seed(args.seed)
    generate(model, input_ids, n_new, SamplingConfig(args.temperature, args.top_k, args.top_p),
             stop_tokens=stops, callback=stream, generator=gen, compile=args.compile)
    print()
    return 0


def tokenizer_command(argv: list[str]) -> int:
    """Train, inspect or apply a tokenizer.

      slmlab tokenizer train --data shakespeare --vocab-size 2048 --out tok/   (ByteLevel BPE)
      slmlab tokenizer encode tok/ "To be, or not to be"                       (prints ids)
      slmlab tokenizer decode tok/ 310 42 7                                    (prints text)
    A tokenizer is `byte`, `bpe`, a tokenizer.json or a saved tokenizer folder (a run checkpoint too).
    """
    p = _parser(tokenizer_command, "tokenizer")
    sub = p.add_subparsers(dest="action", required=True)
    tr = sub.add_parser("train", help="train a ByteLevel BPE on a corpus and save it")
    tr.add_argument("--data", required=True, help="corpus spec (shakespeare, pystdlib, files)")
    tr.add_argument("--vocab-size", type=int, default=2048)
    tr.add_argument("--out", required=True)
    tr.add_argument("--errors", default="strict", choices=["strict", "replace"])
    enc = sub.add_parser("encode", help="text -> ids")
    enc.add_argument("tokenizer")
    enc.add_argument("text")
    dec = sub.add_parser("decode", help="ids -> text")
    dec.add_argument("tokenizer")
    dec.add_argument("ids", nargs="+", type=int)
    args = p.parse_args(argv)
    from ..data import get_source, get_tokenizer

    if args.action == "train":
        probe = get_source(args.data, get_tokenizer("byte"), 64, errors=args.errors)
        texts = list(probe.train_texts())
        if not texts:
            raise ValueError(f"data {args.data!r} yields no training texts")
        tok = get_tokenizer("bpe", texts=texts, vocab_size=args.vocab_size)
        tok.save_pretrained(args.out)
        print(json.dumps({"out": str(Path(args.out)), "vocab_size": len(tok), "bos": tok.bos_token,
                          "eos": tok.eos_token, "pad": tok.pad_token}))
        return 0
    tok = get_tokenizer(args.tokenizer)
    if args.action == "encode":
        print(" ".join(str(i) for i in tok(args.text, add_special_tokens=False)["input_ids"]))
    else:
        bad = [i for i in args.ids if not 0 <= i < len(tok)]
        if bad:
            raise ValueError(f"token ids {bad} are outside the vocabulary [0, {len(tok)})")
        print(tok.decode(args.ids))
    return 0
