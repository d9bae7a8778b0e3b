"""SAGE-Lumen vs transformers' LlamaForCausalLM on the same weights (CPU, fp32).

Prints generation tokens/s (our streaming loop through the model's forward, through the decode plan,
and through the compiled plan, vs ``LlamaForCausalLM.generate``: batch 1, 128-token prompt, 128 new
tokens, greedy; the compiled row also shows its first call, which compiles), llama.cpp on the same
weights exported to GGUF (f32 and q8_0) when llama-cpp-python is installed, and training tokens/s (forward + backward + AdamW, batch 8 x 256) with
achieved GFLOP/s against the measured fp32 matmul peak.

    .venv/bin/python benchmarks/bench_lumen.py [--threads 2] [--clock cpu]

``--clock cpu`` times by this process's CPU time (use with ``--threads 1`` on a shared machine: the
ratios then measure the code, not the neighbours); both sides always run interleaved.
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
import time

import torch
from transformers import LlamaConfig, LlamaForCausalLM

sys.path.insert(0, os.path.dirname(__file__))
from common import (  # noqa: E402
    adamw_step,
    gemv_row,
    generation_rows,
    matmul_peak_gflops,
    print_table,
    timeit_interleaved,
)
from llamacpp_anchor import available, llama_cpp_variants, name_agreement  # noqa: E402
from slmlab.generation import generate  # noqa: E402
from slmlab.layers import frozen_weights  # noqa: E402
from slmlab.models.lumen import LumenConfig, LumenForCausalLM  # noqa: E402


def twins(cfg: LumenConfig) -> tuple[LumenForCausalLM, LlamaForCausalLM]:
    torch.manual_seed(0)
    llama = LlamaForCausalLM(
        LlamaConfig(
            vocab_size=cfg.vocab_size, hidden_size=cfg.hidden_dim, intermediate_size=cfg.intermediate_dim,
            num_hidden_layers=cfg.num_layers, num_attention_heads=cfg.num_heads, num_key_value_heads=cfg.num_kv_heads,
            max_position_embeddings=cfg.max_seq_len, rms_norm_eps=cfg.rms_norm_eps, rope_theta=cfg.rope_theta,
            tie_word_embeddings=True,
        )
    )
    ours = LumenForCausalLM(cfg)
    ours.load_state_dict(llama.state_dict(), strict=True)
    return ours, llama


CLOCK = time.perf_counter


def bench_generation(ours, llama, prompt_len=128, new=128, repeats=3) -> list[dict]:
    """Our loop (through the model's forward, through the decode plan, and the plan compiled) vs
    ``LlamaForCausalLM.generate``; every side must produce the same greedy tokens. With llama-cpp-python
    installed, llama.cpp on the model exported to GGUF (f32, q8_0) runs in the same turns; its rows
    say how many of its greedy tokens equal ours."""
    ours.eval(), llama.eval()
    ids = torch.randint(0, ours.config.vocab_size, (1, prompt_len))

    def hf():
        with torch.inference_mode():
            return llama.generate(ids, max_new_tokens=new, min_new_tokens=new, do_sample=False)

    variants = {
        "slmlab generate (model forward)": lambda: generate(ours, ids, new, use_plan=False),
        "slmlab generate (decode plan)": lambda: generate(ours, ids, new),
        "slmlab generate (plan, compiled)": lambda: generate(ours, ids, new, compile=True),
    }
    with tempfile.TemporaryDirectory() as folder:
        anchors = llama_cpp_variants(ours, None, ids[0].tolist(), new, torch.get_num_threads(), folder) if available() else {}
        rows = generation_rows(hf, {**variants, **{name: run for name, (run, _) in anchors.items()}}, new, repeats,
                               "transformers Llama generate", clock=CLOCK, first_call_timed=("slmlab generate (plan, compiled)",))
        ref = hf()
        name_agreement(rows, anchors, ref[0, prompt_len:].tolist())
    rows.append(gemv_row(ours, 1 / rows[0]["tokens/s"], clock=CLOCK))
    for name, fn in variants.items():
        assert torch.equal(ref, fn()), f"greedy outputs differ: {name}"
    return rows


def train_flops_per_token(model, seq_len) -> float:
    cfg = model.config
    n = sum(p.numel() for p in model.parameters())
    return 6 * n + 12 * cfg.num_layers * cfg.hidden_dim * seq_len  # 6N + attention (fwd+bwd)


def bench_training(ours, llama, batch=8, seq=256, steps=3) -> list[dict]:
    ids = torch.randint(0, ours.config.vocab_size, (batch, seq))
    rows = []
    peak = matmul_peak_gflops(clock=CLOCK)
    sides = {"transformers Llama": adamw_step(llama, ids), "slmlab Lumen": adamw_step(ours, ids)}
    times = timeit_interleaved(sides, steps, clock=CLOCK)
    for name, sec in times.items():
        tps = batch * seq / sec
        gflops = tps * train_flops_per_token(ours, seq) / 1e9
        rows.append({"side": name, "tokens/s": tps, "ratio": times["transformers Llama"] / sec,
                     "GFLOP/s": gflops, "% of matmul peak": 100 * gflops / peak})
    print(f"\nmeasured fp32 matmul peak: {peak:,.1f} GFLOP/s (1024^3 GEMM, {torch.get_num_threads()} threads)")
    return rows


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__)
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--clock", choices=("wall", "cpu"), default="wall",
                   help="wall: elapsed time (default). cpu: this process's CPU time (with --threads 1)")
    args = p.parse_args()
    global CLOCK
    CLOCK = time.process_time if args.clock == "cpu" else time.perf_counter
    torch.set_num_threads(args.threads)
    ours, llama = twins(LumenConfig())
    with frozen_weights():  # fixed weights: decode plans and fused projections are arranged once, as in a server
        rows = bench_generation(ours, llama, repeats=args.repeats)
    print_table(rows, "Generation, batch 1, prompt 128, 128 new tokens, greedy (target ratio >= 5)")
    print_table(bench_training(ours, llama, steps=args.repeats), "Training step, batch 8 x 256, AdamW (target ratio >= 1.1)")


if __name__ == "__main__":
    main()
