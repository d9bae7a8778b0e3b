"""Batch-1 decode tokens/s at 1 and 2 torch threads: what `slmlab generate --threads` defaults to.

The default presets (``lumen-3m``, the quickstart's model, and ``lfm2-small``) decode through
``slmlab.generation.generate`` as ``slmlab generate`` does (greedy, 16-token prompt, 128 new
tokens): through the family's decode plan (the default path) and through the model's forward.
Thread counts are switched inside one process and timed in turns (wall clock: a thread count is
about elapsed time), so that a change in machine load hits both alike; the load average is printed
beside the table.

    .venv/bin/python benchmarks/bench_threads.py [--threads 1,2] [--repeats 5]
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time

import torch

sys.path.insert(0, os.path.dirname(__file__))
from common import print_table  # noqa: E402
from slmlab.generation import generate  # noqa: E402
from slmlab.models import get_family  # noqa: E402

MODELS = ("lumen:lumen-3m", "lfm2:lfm2-small")


def decode_runs(model, prompt_len: int, new: int) -> dict:
    prompt = torch.randint(0, model.config.vocab_size, (1, prompt_len))

    def run(use_plan: bool):
        with torch.no_grad():
            out = generate(model, prompt, new, use_plan=use_plan)
        if out.shape[1] != prompt_len + new:
            raise SystemExit(f"decoded {out.shape[1] - prompt_len} tokens, expected {new}")

    return {"plan": lambda: run(True), "model forward": lambda: run(False)}


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--threads", default="1,2", help="comma-separated thread counts")
    p.add_argument("--repeats", type=int, default=5)
    p.add_argument("--new", type=int, default=128)
    args = p.parse_args()
    counts = [int(x) for x in args.threads.split(",")]
    rows = []
    for spec in MODELS:
        family, preset = spec.split(":")
        fam = get_family(family)
        torch.manual_seed(0)
        model = fam.model_class(fam.make_config(preset)).eval()
        for path, run in decode_runs(model, 16, args.new).items():
            times: dict[int, list[float]] = {n: [] for n in counts}
            for n in counts:  # warm-up at each count
                torch.set_num_threads(n)
                run()
            for _ in range(args.repeats):
                for n in counts:
                    torch.set_num_threads(n)
                    t0 = time.perf_counter()
                    run()
                    times[n].append(time.perf_counter() - t0)
            base = statistics.median(times[counts[0]])
            for n in counts:
                sec = statistics.median(times[n])
                rows.append({"model": preset, "path": path, "threads": n, "tokens/s": args.new / sec,
                             f"vs {counts[0]} thread(s)": base / sec})
    print(f"torch {torch.__version__}, {os.cpu_count()} CPUs, load average {os.getloadavg()[0]:.1f} (1 min) at the end")
    print_table(rows, f"batch-1 greedy decode, {args.new} new tokens (wall clock, median of {args.repeats})")


if __name__ == "__main__":
    main()
