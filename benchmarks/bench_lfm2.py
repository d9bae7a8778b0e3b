"""LFM2Small vs transformers' Lfm2ForCausalLM on the same weights (CPU, fp32, seed-size config, vocab 2048).

Prints three tables, both sides measured in this one process:
  1. generation tokens/s: our streaming loop (``slmlab.generation.generate``) vs
     ``Lfm2ForCausalLM.generate`` (batch 1, 128-token prompt, 128 new tokens, greedy; target >= 5x),
     with llama.cpp on the same weights exported to GGUF (f32, q8_0) when llama-cpp-python is installed;
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
import tempfile
import time
from collections.abc import Callable

import torch
from transformers import Lfm2ForCausalLM

sys.path.insert(0, os.path.dirname(__file__))
from common import adamw_step, gemv_row, generation_rows, print_table, timeit_interleaved  # noqa: E402
from llamacpp_anchor import available, llama_cpp_variants, name_agreement  # noqa: E402
from slmlab.generation import build_plan, generate  # noqa: E402
from slmlab.layers import frozen_weights  # noqa: E402
from slmlab.models.lfm2 import Lfm2SmallConfig, config_to_transformers, from_transformers  # noqa: E402


def twins(cfg: Lfm2SmallConfig):
    torch.manual_seed(0)
    hf = Lfm2ForCausalLM(config_to_transformers(cfg))
    return from_transformers(hf), hf


def bench_generation(ours, hf, prompt_len=128, new=128, repeats=3) -> list[dict]:
    """Our loop (through the model's forward, through the decode plan, and the plan compiled), and
    our model under HF ``generate()``, vs ``Lfm2ForCausalLM.generate``; all must agree (greedy). With
    llama-cpp-python installed, llama.cpp on the model exported to GGUF (f32, q8_0) runs in the same
    turns; its rows say how many of its greedy tokens equal ours."""
    ours.eval(), hf.eval()
    ids = torch.randint(0, ours.config.vocab_size, (1, prompt_len))
    kw = dict(max_new_tokens=new, min_new_tokens=new, do_sample=False)

    def run_hf(model):
        def run():
            with torch.inference_mode():
                return model.generate(ids, **kw)

        return run

    variants = {
        "slmlab LFM2 under HF .generate()": run_hf(ours),
        "slmlab generate (model forward)": lambda: generate(ours, ids, new, use_plan=False),
        "slmlab generate (decode plan)": lambda: generate(ours, ids, new),
        "slmlab generate (plan, compiled)": lambda: generate(ours, ids, new, compile=True),
    }
    with tempfile.TemporaryDirectory() as folder:
        anchors = llama_cpp_variants(ours, None, ids[0].tolist(), new, torch.get_num_threads(), folder) if available() else {}
        rows = generation_rows(run_hf(hf), {**variants, **{name: run for name, (run, _) in anchors.items()}}, new, repeats,
                               "transformers Lfm2 .generate()", CLOCK, first_call_timed=("slmlab generate (plan, compiled)",))
        ref = run_hf(hf)()
        name_agreement(rows, anchors, ref[0, prompt_len:].tolist())
    rows.append(gemv_row(ours, 1 / rows[0]["tokens/s"], clock=CLOCK))
    for name, fn in variants.items():
        assert torch.equal(ref, fn()), f"greedy outputs differ: {name}"
    return rows


def decode_step_timer(model, context: int, steps: int = 64, plan: bool = False) -> Callable[[], float]:
    """A function that prefills ``context`` tokens, times ``steps`` single-token steps (through the
    model's forward and cache, or through its decode plan) and returns seconds per token (the
    prefill is not timed)."""
    ids = torch.randint(0, model.config.vocab_size, (1, context))

    @torch.inference_mode()
    def run() -> float:
        cache = model(input_ids=ids, use_cache=True, logits_to_keep=1).cache
        nxt = ids[:, -1:]
        if plan:
            decode = build_plan(model, context + steps)
            decode.start(cache)
            position = torch.tensor([context])
        t0 = CLOCK()
        for _ in range(steps):
            if plan:
                logits = decode.step(nxt, position)
                position += 1
            else:
                logits = model(input_ids=nxt, cache=cache, use_cache=True).logits[:, -1]
            nxt = logits.argmax(-1, keepdim=True)
        return (CLOCK() - t0) / steps

    return run


def bench_decode_latency(ours, repeats=3) -> list[dict]:
    ours.eval()
    timers = {(path, ctx): decode_step_timer(ours, ctx, plan=path == "decode plan")
              for path in ("model forward", "decode plan") for ctx in (128, 2048)}
    per_token: dict = {key: [] for key in timers}
    for _ in range(repeats):
        for key, timer in timers.items():  # in turns, so load changes hit every row alike
            per_token[key].append(timer())
    ms = {key: 1e3 * statistics.median(v) for key, v in per_token.items()}
    return [{"path": path, "context": ctx, "ms/token": v, "ratio to 128": v / ms[(path, 128)]} for (path, ctx), v in ms.items()]


CLOCK: Callable[[], float] = time.perf_counter


def bench_training(ours, hf, batch=8, seq=256, steps=3) -> list[dict]:
    ids = torch.randint(0, ours.config.vocab_size, (batch, seq))

    times = timeit_interleaved({"transformers Lfm2": adamw_step(hf, ids), "slmlab LFM2": adamw_step(ours, ids)}, steps, clock=CLOCK)
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
        with frozen_weights():  # fixed weights: decode plans and fused projections are arranged once, as in a server
            rows = bench_generation(ours, hf, repeats=args.repeats)
        print_table(rows,
                    "Generation, batch 1, prompt 128, 128 new tokens, greedy (target ratio >= 5)")
    if args.only in (None, "latency"):
        print_table(bench_decode_latency(ours, repeats=args.repeats),
                    "Per-token decode latency, batch 1 (target: 2048 within 1.5x of 128)")
    if args.only in (None, "training"):
        print_table(bench_training(ours, hf, steps=args.repeats),
                    "Training step, batch 8 x 256, AdamW (target ratio >= 1.1)")


if __name__ == "__main__":
    main()
