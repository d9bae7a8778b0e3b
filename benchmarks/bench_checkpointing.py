"""Gradient checkpointing: activation memory saved and step time paid, per family, at one size.

For each family the same model (same seed) trains one step (forward + backward + AdamW) on the same
batch with checkpointing off and on (``activation_checkpointing_enable()``, ``use_reentrant=False``:
every decoder layer keeps only its input and is recomputed in backward). Reported:

* activation memory: the peak resident memory of the step above the memory held just before it
  (weights, gradients and AdamW moments already allocated by a warm-up step), measured in a fresh
  process per run: Linux's ``VmHWM`` is reset through ``/proc/self/clear_refs`` before the step; on
  CUDA, ``torch.cuda.max_memory_allocated`` above the allocation before the step;
* step time: the median of ``--repeats`` steps, off and on timed in turns; on CPU the process's CPU
  time (all threads; robust to other processes sharing the cores), on CUDA wall time.

The anchor is the same model without checkpointing, run in the same way (the plain backward).

    python benchmarks/bench_checkpointing.py                      # lumen, 8x512 width, 8 layers, 4x1024 tokens
    python benchmarks/bench_checkpointing.py --family all --batch 4 --seq 512
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time

import torch

import slmlab
from common import timeit_interleaved

# one realistic small-LM size per family: width 512, 8 layers (the family's own field names)
SIZES = {
    "lumen": dict(hidden_dim=512, num_layers=8, num_heads=8, num_kv_heads=2, intermediate_dim=1408, max_seq_len=2048),
    "lfm2": dict(hidden_size=512, intermediate_size=2048, num_attention_heads=8, num_key_value_heads=2, num_layers=8,
                 max_position_embeddings=2048),
    "pgsm": dict(dim=512, layers=8, hidden=1024, block_size=2048, retrieval_dim=512, retrieval_heads=8),
    "nanohammer": dict(hidden_size=512, intermediate_size=1408, num_hidden_layers=8, num_attention_heads=8,
                       num_key_value_heads=2, num_state_heads=8, max_position_embeddings=2048, bos_token_id=None,
                       eos_token_id=None),
    "neollm": dict(hidden_size=512, intermediate_size=1536, num_hidden_layers=8, num_attention_heads=8,
                   num_key_value_heads=4, head_dim=64, max_position_embeddings=2048, use_spelling_bee_embeddings=False),
}


def build(family: str, vocab: int):
    torch.manual_seed(0)
    fam = slmlab.get_family(family)
    return fam.model_class(fam.config_class(vocab_size=vocab, **SIZES[family]))


def step_fn(model, ids):
    opt = torch.optim.AdamW(model.parameters(), lr=1e-4)

    def step() -> None:
        opt.zero_grad(set_to_none=False)
        model(input_ids=ids, labels=ids, use_cache=False).loss.backward()
        opt.step()

    return step


def rss_bytes(field: str) -> int:
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith(field + ":"):
                return int(line.split()[1]) * 1024
    raise RuntimeError(f"{field} not in /proc/self/status")


def measure_memory(family: str, checkpointed: bool, batch: int, seq: int, vocab: int, device: str) -> int:
    """Run in a child process: peak memory of one training step above what the step starts with."""
    model = build(family, vocab).to(device).train()
    if checkpointed:
        model.activation_checkpointing_enable()
    ids = torch.randint(0, vocab, (batch, seq), generator=torch.Generator().manual_seed(1)).to(device)
    step = step_fn(model, ids)
    step()  # warm-up: gradients and AdamW moments now exist
    if device.startswith("cuda"):
        torch.cuda.synchronize()
        before = torch.cuda.memory_allocated()
        torch.cuda.reset_peak_memory_stats()
        step()
        torch.cuda.synchronize()
        return torch.cuda.max_memory_allocated() - before
    before = rss_bytes("VmRSS")
    with open("/proc/self/clear_refs", "w") as f:
        f.write("5")  # reset VmHWM (the peak resident set) to the current RSS
    step()
    return rss_bytes("VmHWM") - before


def child_memory(args, family: str, checkpointed: bool) -> int:
    here = os.path.dirname(os.path.abspath(__file__))
    call = f"{family!r}, {checkpointed!r}, {args.batch}, {args.seq}, {args.vocab}, {args.device!r}"
    code = f"import sys, json; sys.path.insert(0, {here!r}); import bench_checkpointing as b; print(json.dumps(b.measure_memory({call})))"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    return int(json.loads(out.stdout.strip().splitlines()[-1]))


def time_steps(family: str, args) -> dict[str, float]:
    """Median step time with checkpointing off and on (two copies of the same model, timed in turns)."""
    ids = torch.randint(0, args.vocab, (args.batch, args.seq), generator=torch.Generator().manual_seed(1)).to(args.device)
    steps = {}
    for name, checkpointed in (("off", False), ("on", True)):
        model = build(family, args.vocab).to(args.device).train()
        if checkpointed:
            model.activation_checkpointing_enable()
        steps[name] = step_fn(model, ids)
    sync = torch.cuda.synchronize if args.device.startswith("cuda") else (lambda: None)
    clock = time.perf_counter if args.device.startswith("cuda") else time.process_time
    fns = {name: (lambda s=s: (s(), sync())) for name, s in steps.items()}
    return timeit_interleaved(fns, repeats=args.repeats, clock=clock)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--family", default="lumen", help="a family name or 'all'")
    p.add_argument("--batch", type=int, default=4)
    p.add_argument("--seq", type=int, default=1024)
    p.add_argument("--vocab", type=int, default=2048)
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    args = p.parse_args()
    families = list(SIZES) if args.family == "all" else [args.family]
    print(f"device {args.device}, torch threads {torch.get_num_threads()}, batch {args.batch} x {args.seq} tokens")
    clock = "CPU" if args.device == "cpu" else "wall"
    print(f"{'family':<11} {'params':>11} {'act. memory off':>16} {'on':>10} {'saved':>7} {'step off':>9} {'on':>8} {'cost':>6}  ({clock} s)")
    for family in families:
        mem_off, mem_on = child_memory(args, family, False), child_memory(args, family, True)
        times = time_steps(family, args)
        n = sum(q.numel() for q in {id(q): q for q in build(family, args.vocab).parameters()}.values())
        print(
            f"{family:<11} {n:>11,} {mem_off / 2**20:>12.0f} MiB {mem_on / 2**20:>6.0f} MiB {1 - mem_on / mem_off:>6.0%}"
            f" {times['off']:>8.2f}s {times['on']:>7.2f}s {times['on'] / times['off'] - 1:>+6.0%}"
        )


if __name__ == "__main__":
    main()
