"""Why attention plateaus on single-query associative recall (the published T2, ``ar:cpu,layout=single``), and
that it solves the suite's multi-query T2 (``ar:cpu``): learning curves of the bench's ``attn2-z`` on both and
on MQAR with one or all queries scored (``docs/results/bench.md``, the T2 diagnosis).

Every case trains on fresh rows every step (AdamW β (0.9, 0.98), weight decay 0.1 on matrices, clip 1.0,
10% warm-up then cosine) and prints validation accuracy at the scored positions every ``--eval-every``
steps. ``mqar-one`` keeps one randomly chosen query of each MQAR row scored (same rows, one label).

    .venv/bin/python benchmarks/bench_t2_recall.py --case mqar-all --steps 1500     # solved by step 500
    .venv/bin/python benchmarks/bench_t2_recall.py --case mqar-one --steps 1500     # plateau at ~0.32
    .venv/bin/python benchmarks/bench_t2_recall.py --case ar --task ar:cpu,layout=single,T=16 --steps 12000
    .venv/bin/python benchmarks/bench_t2_recall.py --case ar --train-on all --steps 2000
    .venv/bin/python benchmarks/bench_t2_recall.py --case t2 --steps 1500                # the suite's T2: solved
    .venv/bin/python benchmarks/bench_t2_recall.py --case t2 --model shortconv4 --steps 1500   # stays at 1/19
"""

from __future__ import annotations

import argparse
import math
import time

import numpy as np
import torch

from slmlab.bench.models import build_model
from slmlab.data.tasks import IGNORE_INDEX, TaskBatch, parse_task_spec, to_hf_labels
from slmlab.train.config import OptimConfig
from slmlab.train.optim import build_optimizer

CASES = {"ar": "ar:cpu,layout=single", "t2": "ar:cpu", "mqar-all": "mqar:cpu,V=40,T=16,N=4",
         "mqar-one": "mqar:cpu,V=40,T=16,N=4"}


def one_query(batch: TaskBatch, rng: np.random.Generator) -> TaskBatch:
    """``batch`` with one randomly chosen scored position per row (the others unlabelled)."""
    rows = np.arange(len(batch.labels))[:, None]
    keep = np.take_along_axis(batch.retrieval_positions, rng.integers(0, batch.retrieval_positions.shape[1], (len(rows), 1)), 1)
    labels = np.full_like(batch.labels, IGNORE_INDEX)
    labels[rows, keep] = batch.labels[rows, keep]
    return TaskBatch(batch.inputs, labels, keep, batch.meta)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--case", choices=sorted(CASES), default="ar")
    p.add_argument("--task", default=None, help="task spec (default: the case's)")
    p.add_argument("--model", default="attn2-z")
    p.add_argument("--train-on", choices=("scored", "all"), default="scored")
    p.add_argument("--lr", type=float, default=3e-3)
    p.add_argument("--batch-size", type=int, default=64)
    p.add_argument("--steps", type=int, default=3000)
    p.add_argument("--eval-every", type=int, default=250)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--threads", type=int, default=1)
    args = p.parse_args()
    torch.set_num_threads(args.threads)
    spec = args.task or CASES[args.case]
    task = parse_task_spec(spec)
    model = build_model(args.model, task.vocab_size, task.seq_len, {}, args.seed)
    opt = build_optimizer(model, OptimConfig(lr=args.lr, betas=(0.9, 0.98), weight_decay=0.1, grad_clip=1.0))
    val = task.make(1000, args.seed, "validation")
    if args.case == "mqar-one":
        val = one_query(val, np.random.default_rng(1))
    val_ids, val_labels = torch.from_numpy(val.inputs), torch.from_numpy(to_hf_labels(val.labels))
    rng = np.random.default_rng(np.random.SeedSequence([args.seed, 99]))
    warm = max(1, args.steps // 10)
    print(f"{args.case} {spec} {args.model} train_on={args.train_on} lr={args.lr:g} batch={args.batch_size}")
    t0 = time.perf_counter()
    for step in range(1, args.steps + 1):
        s = step - 1
        factor = s / warm if s < warm else 0.5 * (1 + math.cos(math.pi * (s - warm) / max(1, args.steps - warm)))
        for group in opt.param_groups:
            group["lr"] = group["base_lr"] * factor
        batch = task._generate(args.batch_size, np.random.default_rng(np.random.SeedSequence([args.seed, task.task_id, 0, s])))
        if args.case == "mqar-one":
            batch = one_query(batch, rng)
        ids = torch.from_numpy(batch.inputs)
        labels = ids.clone() if args.train_on == "all" else torch.from_numpy(to_hf_labels(batch.labels))
        loss = model(input_ids=ids, labels=labels).loss
        opt.zero_grad()
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        if step % args.eval_every == 0 or step == args.steps:
            model.eval()
            with torch.no_grad():
                pred = model(input_ids=val_ids).logits[:, :-1].argmax(-1)
            model.train()
            target = val_labels[:, 1:]
            scored = target != IGNORE_INDEX
            acc = (pred[scored] == target[scored]).float().mean().item()
            print(f"step {step:>6}  train loss {loss.item():.3f}  val acc {acc:.3f}  {time.perf_counter() - t0:.0f} s", flush=True)


if __name__ == "__main__":
    main()
