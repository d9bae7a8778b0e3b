"""Transaction encoder costs, both sides measured in this one process (CPU fp32 unless CUDA is asked for).

Prints three tables:
  1. the heads + loss (on fixed backbone states) through the strided ``forward_targets`` (head g only
     where it predicts) vs every head at every position then a gather (the seed's ``forward``),
     forward + backward, with the
     peak memory of each (CUDA: ``max_memory_allocated``; CPU: the largest logits tensor); target >= 5x;
  2. one pretraining step (forward + backward + AdamW) of the encoder vs ``Lfm2SmallForCausalLM`` on the
     same backbone config with a 6,590-token vocabulary, at the same tokens per step; target >= 0.8x;
  3. generator throughput in rows/s (target: 1M rows in <= 90 s on 2 cores).

    .venv/bin/python benchmarks/bench_transactions.py [--preset lfm2_small] [--batch 32] [--T 64] [--threads 1]
"""

from __future__ import annotations

import argparse
import os
import sys
import time

import torch

sys.path.insert(0, os.path.dirname(__file__))
from common import adamw_step, print_table, timeit_interleaved  # noqa: E402
from slmlab.models.lfm2 import Lfm2SmallConfig, Lfm2SmallForCausalLM  # noqa: E402
from slmlab.transactions import TransactionEncoder, TxnEncoderConfig  # noqa: E402
from slmlab.transactions.data.synth import SynthConfig, generate  # noqa: E402


def every_head_loss(model: TransactionEncoder, hidden: torch.Tensor, ids: torch.Tensor) -> torch.Tensor:
    """The seed's way: all F heads at all T*F positions, then pick head (p+1) % F at each p."""
    logits = model.lm_heads(hidden)
    B, T, F = ids.shape
    flat = ids.reshape(B, T * F)
    losses = []
    for g, lg in enumerate(logits):
        pos = torch.arange(T * F - 1, device=ids.device)
        pos = pos[(pos + 1) % F == g]
        tgt = flat[:, pos + 1]
        ce = torch.nn.functional.cross_entropy(lg[:, pos].reshape(-1, lg.shape[-1]), tgt.reshape(-1))
        losses.append(ce)
    return torch.stack(losses).mean()


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--preset", default="lfm2_small")
    ap.add_argument("--batch", type=int, default=32)
    ap.add_argument("--T", type=int, default=64)
    ap.add_argument("--threads", type=int, default=0)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--device", default="cpu")
    ap.add_argument("--customers", type=int, default=300, help="generator benchmark size")
    args = ap.parse_args()
    if args.threads:
        torch.set_num_threads(args.threads)
    dev = torch.device(args.device)
    torch.manual_seed(0)
    model = TransactionEncoder(TxnEncoderConfig.from_preset(args.preset)).to(dev)
    vs = model.embedding.vocab_sizes
    ids = torch.stack([torch.randint(4, v, (args.batch, args.T)) for v in vs], -1).to(dev)

    # the heads and the loss only, on fixed backbone states (the backbone costs the same either way)
    with torch.no_grad():
        states = model.backbone_forward(ids)
    hidden = states.clone().requires_grad_(True)

    def strided():
        model.zero_grad(set_to_none=True)
        hidden.grad = None
        model.lm_heads.lm_loss(hidden, ids)[0].backward()

    def every():
        model.zero_grad(set_to_none=True)
        hidden.grad = None
        every_head_loss(model, hidden, ids).backward()

    with torch.no_grad():  # same loss value both ways (sanity)
        a, b = float(model.lm_heads.lm_loss(states, ids)[0]), float(every_head_loss(model, states, ids))
    times = timeit_interleaved({"strided": strided, "every": every}, repeats=args.repeats)
    S = args.T * len(vs)
    every_bytes = args.batch * S * sum(vs) * 4
    strided_bytes = args.batch * args.T * sum(vs) * 4
    peak = {}
    if dev.type == "cuda":
        for name, fn in (("strided", strided), ("every", every)):
            torch.cuda.reset_peak_memory_stats(dev)
            fn()
            peak[name] = torch.cuda.max_memory_allocated(dev) / 2**20
    print_table([
        {"path": "every head, every position + gather", "seconds": times["every"], "logits MiB": every_bytes / 2**20,
         "peak MiB": peak.get("every", float("nan")), "loss": b},
        {"path": "strided forward_targets", "seconds": times["strided"], "logits MiB": strided_bytes / 2**20,
         "peak MiB": peak.get("strided", float("nan")), "loss": a},
    ], f"1. heads + loss fwd+bwd on fixed backbone states, {args.preset}, batch {args.batch} x {args.T} transactions"
       f" ({S} tokens each); speed-up {times['every'] / times['strided']:.2f}x (target >= 5x)")

    bb = model.config.backbone_config()
    lm_cfg = Lfm2SmallConfig(**{**model.config.backbone, "vocab_size": sum(vs),
                                "max_position_embeddings": max(4096, S)})
    lm = Lfm2SmallForCausalLM(lm_cfg).to(dev)
    tok = torch.randint(0, sum(vs), (args.batch, S), device=dev)
    enc_step = adamw_step(model, ids)
    lm_step = adamw_step(lm, tok)
    t = timeit_interleaved({"encoder": enc_step, "lm": lm_step}, repeats=args.repeats)
    tokens = args.batch * S
    print_table([
        {"model": "Lfm2SmallForCausalLM (vocab 6,590)", "s/step": t["lm"], "tokens/s": tokens / t["lm"]},
        {"model": f"TransactionEncoder ({args.preset})", "s/step": t["encoder"], "tokens/s": tokens / t["encoder"]},
    ], f"2. one AdamW step at {tokens:,} tokens, hidden {bb.hidden_size}; encoder/LM throughput"
       f" {t['lm'] / t['encoder']:.2f}x (target >= 0.8x)")

    cfg = SynthConfig.from_preset("tiny", n_customers=args.customers)
    t0 = time.perf_counter()
    n = len(generate(cfg).transactions)
    s = time.perf_counter() - t0
    print_table([{"rows": n, "seconds": s, "rows/s": n / s, "s per 1M rows": 1e6 / (n / s)}],
                "3. synthetic bank generator (target: 1M rows in <= 90 s)")


if __name__ == "__main__":
    main()
