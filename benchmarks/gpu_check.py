"""The CUDA path, checked once per family on a GPU: one bf16 training step, throughput, MFU, memory,
decode == prefill in bf16, and the ``gpu-paper`` tier's first task for 200 steps.

For each family at a ~100M configuration (and NeoLLM's default, ``neollm-113m``): one training step
under bf16 autocast (forward + backward + fused AdamW) after a warm-up, tokens/s, model FLOPs
utilisation ``6·N·tokens / time / peak`` against a measured bf16 matmul peak, peak memory; the last
position's logits after a prefill of ``T-1`` tokens and one decode step against a full forward
(tolerance 5e-2 absolute on bf16 logits, stated per family). Then the first run of ``gpu-paper``
(MQAR, attn2-z) for 200 steps through the bench runner. On a machine without CUDA it prints
"no CUDA device: skipped" and exits 0 (a test checks that it imports and plans the runs).

    .venv/bin/python benchmarks/gpu_check.py [--batch 8 --seq 1024 --steps 200]
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import time

import torch

DECODE_ATOL = 5e-2  # bf16 logits, decode vs full forward

FAMILIES_100M = {  # family -> config overrides of its default preset (~100M parameters at V 32,768)
    "lumen": dict(vocab_size=32768, hidden_dim=768, num_layers=12, num_heads=12, num_kv_heads=4, intermediate_dim=2048,
                  max_seq_len=2048),
    "lfm2": dict(vocab_size=32768, hidden_size=768, num_layers=12, num_attention_heads=12, num_key_value_heads=4,
                 intermediate_size=3072, max_position_embeddings=2048,
                 layer_types=["conv", "conv", "full_attention"] * 4),
    "pgsm": dict(vocab_size=32768, block_size=2048, dim=768, layers=12, hidden=2048, kernel_size=25, retrieval_dim=1024,
                 retrieval_heads=8),
    "nanohammer": dict(vocab_size=32768, hidden_size=768, num_hidden_layers=12, num_attention_heads=12,
                       num_key_value_heads=4, intermediate_size=2048, max_position_embeddings=2048,
                       bos_token_id=None, eos_token_id=None),
    "neollm": {},  # the default (neollm-113m)
}


def plan(batch: int = 8, seq: int = 1024, steps: int = 200) -> list[dict]:
    """What the check runs: one row per family configuration, then the first gpu-paper run."""
    from slmlab.bench.tier_file import tier_plans

    rows = [{"check": "train_step+decode", "family": f, "overrides": o, "batch": batch, "seq": seq}
            for f, o in FAMILIES_100M.items()]
    first = dataclasses.replace(tier_plans("gpu-paper")[0], max_steps=steps, max_time=300.0)
    rows.append({"check": "gpu-paper first run", "plan": first.key})
    return rows


def bf16_peak_tflops(n: int = 8192, repeats: int = 10) -> float:
    a = torch.randn(n, n, device="cuda", dtype=torch.bfloat16)
    b = torch.randn(n, n, device="cuda", dtype=torch.bfloat16)
    a @ b
    torch.cuda.synchronize()
    t0 = time.perf_counter()
    for _ in range(repeats):
        a @ b
    torch.cuda.synchronize()
    return 2 * n**3 * repeats / (time.perf_counter() - t0) / 1e12


def check_family(name: str, overrides: dict, batch: int, seq: int, peak: float) -> dict:
    from slmlab.models import get_family

    fam = get_family(name)
    config = fam.make_config(None, **overrides)
    torch.manual_seed(0)
    model = fam.model_class(config).cuda()
    n_params = sum(p.numel() for p in {id(p): p for p in model.parameters()}.values())
    opt = torch.optim.AdamW(model.parameters(), lr=1e-4, fused=True)
    ids = torch.randint(0, config.vocab_size, (batch, seq), device="cuda")

    def step():
        opt.zero_grad(set_to_none=True)
        with torch.autocast("cuda", dtype=torch.bfloat16):
            loss = model(input_ids=ids, labels=ids, use_cache=False).loss
        loss.backward()
        opt.step()
        return loss

    step()
    torch.cuda.synchronize()
    torch.cuda.reset_peak_memory_stats()
    t0 = time.perf_counter()
    loss = step()
    torch.cuda.synchronize()
    seconds = time.perf_counter() - t0
    tokens = batch * seq
    model.eval()
    with torch.no_grad(), torch.autocast("cuda", dtype=torch.bfloat16):
        full = model(input_ids=ids[:2], use_cache=False).logits[:, -1].float()
        out = model(input_ids=ids[:2, :-1], use_cache=True)
        step_logits = model(input_ids=ids[:2, -1:], cache=out.cache, use_cache=True).logits[:, -1].float()
    diff = float((full - step_logits).abs().max())
    return {"family": name, "params": n_params, "loss": round(float(loss), 3), "step_s": round(seconds, 3),
            "tokens_per_s": round(tokens / seconds), "mfu": round(6 * n_params * tokens / seconds / (peak * 1e12), 3),
            "peak_mem_gib": round(torch.cuda.max_memory_allocated() / 2**30, 2), "decode_vs_prefill_max_abs": diff,
            "decode_ok": diff <= DECODE_ATOL}


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--batch", type=int, default=8)
    p.add_argument("--seq", type=int, default=1024)
    p.add_argument("--steps", type=int, default=200)
    p.add_argument("--out", default="runs/gpu-check")
    args = p.parse_args(argv)
    rows = plan(args.batch, args.seq, args.steps)
    if not torch.cuda.is_available():
        print("no CUDA device: skipped")
        for row in rows:
            print(f"  planned: {json.dumps(row)}")
        return 0
    peak = bf16_peak_tflops()
    print(f"device {torch.cuda.get_device_name()} | measured bf16 matmul peak {peak:.0f} TFLOP/s")
    for row in rows[:-1]:
        try:
            print(json.dumps(check_family(row["family"], row["overrides"], args.batch, args.seq, peak)))
        except Exception as err:  # report every family, even when one fails
            print(json.dumps({"family": row["family"], "error": f"{type(err).__name__}: {err}"}))
        torch.cuda.empty_cache()
    from slmlab.bench.run import run_plans
    from slmlab.bench.tier_file import tier_plans

    first = dataclasses.replace(tier_plans("gpu-paper")[0], max_steps=args.steps, max_time=300.0)
    run_plans([first], "gpu-paper", args.out, device="cuda")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
