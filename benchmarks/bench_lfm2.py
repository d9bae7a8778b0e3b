"""LFM2Small vs transformers' Lfm2ForCausalLM on the same weights (CPU, fp32, seed-size config, vocab 2048).

Prints three tables, both sides measured in this one process:
  1. generation tokens/s: our streaming loop (``slmlab.generation.generate``) vs
     ``Lfm2ForCausalLM.generate`` (batch 1, 128-token prompt, 128 new tokens, greedy; target >= 5x);
  2. per-token decode latency after 128 and after 2048 tokens of context (target: 2048 within 1.5x
     of 128; conv layers cost O(kernel) per step, attention reads the cached K/V);
  3. training tokens/s: forward + backward + AdamW step, batch 8 x 256 (target >= 1.1x).

    .venv/bin/python benchmarks/bench_lfm2.py [--threads 2] [--repeats 3]
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time
from typing import Callable

import torch
from transformers import Lfm2ForCausalLM

sys.path.insert(0, os.path.dirname(__file__))
from common import print_table  # noqa: E402

from slmlab.generation import generate  # noqa: E402
from slmlab.models.lfm2 import Lfm2SmallConfig, config_to_transformers, from_transformers  # noqa: E402


def twins(cfg: Lfm2SmallConfig):
    torch.manual_seed(0)
    hf = Lfm2ForCausalLM(config_to_transformers(cfg))
    return from_transformers(hf), hf


def bench_generation(ours, hf, prompt_len=128, new=128, repeats=3) -> list[dict]:
    ours.eval(), hf.eval()
    ids = torch.randint(0, ours.config.vocab_size, (1, prompt_len))
    kw = dict(max_new_tokens=new, min_new_tokens=new, do_sample=False)
    ref = hf.generate(ids, **kw)
    got = generate(ours, ids, new)
    assert torch.equal(ref, got), "greedy outputs differ"
    assert torch.equal(ref, ours.generate(ids, **kw)), "our model under HF generate() differs"

    def run_hf(model):
        def run():
            with torch.inference_mode():
                model.generate(ids, **kw)

        return run

    times = interleaved(
        {
            "transformers Lfm2 .generate()": run_hf(hf),
            "slmlab LFM2 under HF .generate()": run_hf(ours),
            "slmlab LFM2 slmlab.generation": lambda: generate(ours, ids, new),
        },
        repeats,
    )
    base = times["transformers Lfm2 .generate()"]
    return [{"side": name, "tokens/s": new / sec, "ratio": base / sec} for name, sec in times.items()]


def decode_step_timer(model, context: int, steps: int = 64) -> Callable[[], float]:
    """A function that prefills ``context`` tokens, times ``steps`` single-token forwards through
    the cache and returns seconds per token (the prefill is not timed)."""
    ids = torch.randint(0, model.config.vocab_size, (1, context))

    @torch.inference_mode()
    def run() -> float:
        cache = model(input_ids=ids, use_cache=True, logits_to_keep=1).cache
        nxt = ids[:, -1:]
        t0 = CLOCK()
        for _ in range(steps):
            out = model(input_ids=nxt, cache=cache, use_cache=True)
            nxt = out.logits[:, -1].argmax(-1, keepdim=True)
        return (CLOCK() - t0) / steps

    return run


def bench_decode_latency(ours, repeats=3) -> list[dict]:
    ours.eval()
    timers = {ctx: decode_step_timer(ours, ctx) for ctx in (128, 2048)}
    per_token: dict[int, list[float]] = {ctx: [] for ctx in timers}
    for _ in range(repeats):
        for ctx, timer in timers.items():  # alternate the two contexts
            per_token[ctx].append(timer())
    ms = {ctx: 1e3 * statistics.median(v) for ctx, v in per_token.items()}
    return [{"context": ctx, "ms/token": v, "ratio to 128": v / ms[128]} for ctx, v in ms.items()]


CLOCK: Callable[[], float] = time.perf_counter


def interleaved(fns: dict[str, Callable[[], object]], repeats: int) -> dict[str, float]:
    """Median seconds per call of each function, alternating the sides every repeat so that load
    changes on a shared machine hit both sides alike."""
    for fn in fns.values():
        fn()  # warm-up
    times: dict[str, list[float]] = {name: [] for name in fns}
    for _ in range(repeats):
        for name, fn in fns.items():
            t0 = CLOCK()
            fn()
            times[name].append(CLOCK() - t0)
    return {name: statistics.median(ts) for name, ts in times.items()}


def bench_training(ours, hf, batch=8, seq=256, steps=3) -> list[dict]:
    ids = torch.randint(0, ours.config.vocab_size, (batch, seq))

    def make_step(model):
        model.train()
        opt = torch.optim.AdamW(model.parameters(), lr=1e-4)

        def step():
            opt.zero_grad(set_to_none=True)
            model(input_ids=ids, labels=ids).loss.backward()
            opt.step()

        return step

    times = interleaved({"transformers Lfm2": make_step(hf), "slmlab LFM2": make_step(ours)}, steps)
    return [
        {"side": name, "tokens/s": batch * seq / sec, "ratio": times["transformers Lfm2"] / sec}
        for name, sec in times.items()
    ]


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--only", choices=("generation", "latency", "training"), default=None)
    p.add_argument(
        "--clock", choices=("wall", "cpu"), default="wall",
        help="wall: elapsed time (default). cpu: this process's CPU time, which a busy shared machine"
        " inflates much less; with --threads 1 it approximates the wall time on an idle machine",
    )
    args = p.parse_args()
    global CLOCK
    CLOCK = time.process_time if args.clock == "cpu" else time.perf_counter
    torch.set_num_threads(args.threads)
    ours, hf = twins(Lfm2SmallConfig(vocab_size=2048))
    print(f"LFM2Small seed config, vocab 2048, {sum(q.numel() for q in ours.parameters()):,} parameters, "
          f"{torch.get_num_threads()} threads, {args.clock} clock, torch {torch.__version__}, "
          f"load average {os.getloadavg()[0]:.1f} on {os.cpu_count()} CPUs")
    if args.only in (None, "generation"):
        print_table(bench_generation(ours, hf, repeats=args.repeats),
                    "Generation, batch 1, prompt 128, 128 new tokens, greedy (target ratio >= 5)")
    if args.only in (None, "latency"):
        print_table(bench_decode_latency(ours, repeats=args.repeats),
                    "Per-token decode latency, batch 1 (target: 2048 within 1.5x of 128)")
    if args.only in (None, "training"):
        print_table(bench_training(ours, hf, steps=args.repeats),
                    "Training step, batch 8 x 256, AdamW (target ratio >= 1.1)")


if __name__ == "__main__":
    main()
