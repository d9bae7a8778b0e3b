"""Costs of the bench's training path, as ratios measured in one process (no timed tests).

1. ``scored_only`` vs full logits: one AdamW training step of ``attn2-z`` (d 64) on T1 at the ``gpu``
   setting (V 8,192, T 64, N 4, batch 64): the LM head over 4 scored positions per row instead of 64.
   Target >= 1.5x.
2. Fresh data per step vs pre-built tensors: training tokens/s of ``attn2-rope`` on T4 ``cpu``
   (segment, T 64) fed by ``TaskSource(fresh=True)`` vs the same batches materialised beforehand,
   interleaved round by round. Target >= 0.95.
3. Each task's ``cpu`` train set: generation time / one training epoch on it (epoch = n_train / batch
   steps of a 2-layer d-64 control at that T, step time measured). Target <= 5%.

    .venv/bin/python benchmarks/bench_suite.py --threads 1
"""

from __future__ import annotations

import argparse
import itertools
import statistics
import time

import torch

from slmlab.bench.models import build_model
from slmlab.data.sources import TaskSource
from slmlab.data.tasks import TASKS, parse_task_spec


def train_step(model, opt, batch, scored_only: bool) -> None:
    opt.zero_grad(set_to_none=True)
    kwargs = {"scored_only": True} if scored_only else {}
    model(input_ids=batch["input_ids"], labels=batch["labels"], **kwargs).loss.backward()
    opt.step()


def scored_only_ratio(rounds: int, steps: int) -> dict:
    task = parse_task_spec("mqar:gpu,n_train=64,n_test=64")
    model = build_model("attn2-z", task.vocab_size, task.seq_len)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-4)
    batch = next(TaskSource("mqar:gpu", task).batches("train", 64, seed=0))
    times = {False: [], True: []}
    for flag in (False, True):
        train_step(model, opt, batch, flag)  # warm-up
    for r in range(rounds):
        for flag in (False, True) if r % 2 == 0 else (True, False):
            t0 = time.perf_counter()
            for _ in range(steps):
                train_step(model, opt, batch, flag)
            times[flag].append((time.perf_counter() - t0) / steps)
    full, scored = statistics.median(times[False]), statistics.median(times[True])
    return {"full_step_ms": round(1e3 * full, 2), "scored_only_step_ms": round(1e3 * scored, 2),
            "speedup": round(full / scored, 2)}


def fresh_ratio(rounds: int, steps: int) -> dict:
    task = parse_task_spec("t4:cpu,n_train=64,n_test=64")
    source = TaskSource("t4:cpu", task)
    model = build_model("attn2-rope", task.vocab_size, task.seq_len)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-4)
    prebuilt = list(itertools.islice(source.batches("train", 64, seed=0), steps))
    rates = {"fresh": [], "prebuilt": []}
    for r in range(rounds):
        for side in ("fresh", "prebuilt") if r % 2 == 0 else ("prebuilt", "fresh"):
            batches = itertools.islice(source.batches("train", 64, seed=0), steps) if side == "fresh" else iter(prebuilt)
            t0 = time.perf_counter()
            for batch in batches:
                train_step(model, opt, batch, True)
            rates[side].append(steps * 64 * task.seq_len / (time.perf_counter() - t0))
    ratio = statistics.median(a / b for a, b in zip(rates["fresh"], rates["prebuilt"]))
    return {"fresh_tokens_per_s": round(statistics.median(rates["fresh"])),
            "prebuilt_tokens_per_s": round(statistics.median(rates["prebuilt"])), "ratio": round(ratio, 3)}


def generation_share(batch: int = 64, probe_steps: int = 3) -> dict:
    out = {}
    for cls in sorted(set(TASKS.values()), key=lambda c: c.task_id):
        task = cls.from_spec("cpu")
        t0 = time.perf_counter()
        task.make(task.n_train, 0, "train")
        gen = time.perf_counter() - t0
        model = build_model("attn2-rope", task.vocab_size, task.seq_len)
        opt = torch.optim.AdamW(model.parameters(), lr=1e-4)
        b = next(TaskSource(cls.name, task, fresh=False).batches("train", batch, seed=0))
        train_step(model, opt, b, True)
        t0 = time.perf_counter()
        for _ in range(probe_steps):
            train_step(model, opt, b, True)
        epoch = (time.perf_counter() - t0) / probe_steps * task.n_train / batch
        out[f"T{cls.task_id} {cls.name}"] = {"n_train": task.n_train, "T": task.seq_len, "generate_s": round(gen, 2),
                                             "epoch_s": round(epoch, 1), "share": round(gen / epoch, 4)}
    return out


def main(argv=None) -> dict:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--rounds", type=int, default=6)
    p.add_argument("--steps", type=int, default=10)
    p.add_argument("--threads", type=int, default=1)
    args = p.parse_args(argv)
    torch.set_num_threads(args.threads)
    torch.manual_seed(0)
    result = {"threads": torch.get_num_threads(), "scored_only": scored_only_ratio(args.rounds, args.steps),
              "fresh_vs_prebuilt": fresh_ratio(args.rounds, args.steps), "generation_vs_epoch": generation_share()}
    print(f"scored_only vs full logits (attn2-z d64, V 8192, T 64, B 64): {result['scored_only']}")
    print(f"fresh per step vs pre-built (attn2-rope, T4 cpu, B 64): {result['fresh_vs_prebuilt']}")
    for name, row in result["generation_vs_epoch"].items():
        print(f"generation / epoch {name:<20} {row}")
    return result


if __name__ == "__main__":
    main()
