"""NanoHammer: our T-query layer vs the seed's 2T-query way, cached generation, cache size.

Both sides of every comparison run in this one process on the same weights, alternated; on CPU with
one thread (the default) each run is timed by the process's CPU time, so the load of other processes
on a shared machine does not decide the ratio:
  1. prefill forward + backward of the decoder stack at T=512: ours (T hidden queries over the
     2T interleaved state/hidden keys, MLP on T tokens) vs the seed's way (2T queries over the
     concatenated [state tokens, hidden tokens], MLP on 2T, state half discarded), same SDPA kernel;
     the hidden outputs are checked identical first (target >= 1.8x);
  2. generation tokens/s after a 512-token prompt (16 new tokens, prefill included on both sides): our cache vs
     recomputing the whole prefix every step, greedy, same tokens checked (target >= 5x);
  3. cache bytes per token vs a plain K/V cache of the same attention, and the seed's layout.

    .venv/bin/python benchmarks/bench_nanohammer.py [--threads 1] [--repeats 3] [--device cpu|cuda] [--dtype float32|bfloat16]
        [--parts prefill,generation,cache] [--json]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time

import torch
import torch.nn.functional as F
from torch.utils.flop_counter import FlopCounterMode

sys.path.insert(0, os.path.dirname(__file__))
from common import print_table  # noqa: E402
from slmlab.generation import generate  # noqa: E402
from slmlab.layers import apply_rotary  # noqa: E402
from slmlab.models.nanohammer import NanoHammerConfig, NanoHammerForCausalLM, cache_nbytes  # noqa: E402
from slmlab.models.nanohammer.holographic import shift_right  # noqa: E402

# the seed's default proportions (d : I : S = 1 : 4 : 1/4, 4 query heads per K/V head), scaled down
BENCH_CONFIG = dict(
    vocab_size=8192,
    hidden_size=512,
    intermediate_size=2048,
    num_hidden_layers=4,
    num_attention_heads=8,
    num_key_value_heads=2,
    num_state_heads=8,
    max_position_embeddings=4096,
    bos_token_id=None,
    eos_token_id=None,
)


def seed_way_backbone(model: NanoHammerForCausalLM, ids: torch.Tensor) -> torch.Tensor:
    """The same maths computed as the seed does: per layer the 2T sequence [state tokens, hidden
    tokens] goes through attention with 2T queries and through the MLP; the state half is dropped."""
    inner = model.model
    b, t = ids.shape
    pos = torch.arange(t, device=ids.device).expand(b, t)
    x = inner.embed_tokens(ids)
    state = inner.holographic_rope.rotate(inner.token_to_state(x), pos).float().cumsum(1).to(x.dtype)
    cos, sin = inner.rotary_emb(torch.cat((pos, pos), 1))
    i = torch.arange(t, device=ids.device)
    causal = i[None, :] <= i[:, None]
    own = causal if model.config.hidden_attends_self else i[None, :] < i[:, None]
    mask = torch.cat((torch.cat((causal, torch.zeros_like(causal)), 1), torch.cat((causal, own), 1)), 0)
    for layer in inner.layers:
        state = layer.state_cell(state)
        tokens = layer.state_projection(inner.holographic_rope.unrotate(shift_right(state, None), pos))
        both = torch.cat((tokens, x), 1)
        attn = layer.self_attn
        a = layer.input_layernorm(both)
        q = attn.q_proj(a).view(b, 2 * t, attn.num_heads, attn.head_dim).transpose(1, 2)
        k = attn.k_proj(a).view(b, 2 * t, attn.num_kv_heads, attn.head_dim).transpose(1, 2)
        v = attn.v_proj(a).view(b, 2 * t, attn.num_kv_heads, attn.head_dim).transpose(1, 2)
        q, k = apply_rotary(q, cos, sin), apply_rotary(k, cos, sin)
        out = F.scaled_dot_product_attention(q, k, v, attn_mask=mask, enable_gqa=True)
        both = both + attn.o_proj(out.transpose(1, 2).reshape(b, 2 * t, -1))
        both = both + layer.mlp(layer.post_attention_layernorm(both))
        x = both[:, t:]
    return inner.norm(x)


def paired_times(base, ours, repeats: int, device: torch.device) -> tuple[float, float, float]:
    """Run ``base`` and ``ours`` alternately (after one warm-up each) so load changes on a shared
    machine hit both sides alike; return the best time of each side (noise only adds time) and the
    median of the per-pair ratios."""

    # one CPU thread: count this process's CPU time, which other processes' load on a shared machine
    # hardly changes; otherwise wall time (synchronised on CUDA)
    now = time.process_time if device.type == "cpu" and torch.get_num_threads() == 1 else time.perf_counter

    def clock(fn) -> float:
        if device.type == "cuda":
            torch.cuda.synchronize()
        t0 = now()
        fn()
        if device.type == "cuda":
            torch.cuda.synchronize()
        return now() - t0

    clock(base), clock(ours)
    pairs = [(clock(base), clock(ours)) for _ in range(repeats)]
    t_base = min(p[0] for p in pairs)
    t_ours = min(p[1] for p in pairs)
    return t_base, t_ours, statistics.median(p[0] / p[1] for p in pairs)


def bench_prefill(model, t, batch, repeats, device) -> tuple[list[dict], float]:
    ids = torch.randint(0, model.config.vocab_size, (batch, t), device=device)
    with torch.no_grad():
        ours = model.model(input_ids=ids, use_cache=False).last_hidden_state
        seed = seed_way_backbone(model, ids)
    diff = (ours.float() - seed.float()).abs().max().item()

    def fwd_bwd(fn):
        model.zero_grad(set_to_none=True)
        fn().float().pow(2).mean().backward()

    flops = []  # FlopCounterMode counts the projections/MLP; it has no formula for CPU SDPA (attention: T x 2T vs 2T x 2T)
    for fn in (lambda: seed_way_backbone(model, ids), lambda: model.model(input_ids=ids, use_cache=False).last_hidden_state):
        with FlopCounterMode(display=False) as counter:
            fwd_bwd(fn)
        flops.append(counter.get_total_flops())

    t_seed, t_ours, ratio = paired_times(
        lambda: fwd_bwd(lambda: seed_way_backbone(model, ids)),
        lambda: fwd_bwd(lambda: model.model(input_ids=ids, use_cache=False).last_hidden_state),
        repeats,
        device,
    )
    rows = [
        {"side": "seed way (2T queries, MLP on 2T)", "matmul GFLOP": flops[0] / 1e9, "best ms": 1e3 * t_seed,
         "tokens/s": batch * t / t_seed, "ratio (best)": 1.0, "ratio (median pair)": 1.0, "matmul FLOP ratio": 1.0},
        {"side": "slmlab (T queries, MLP on T)", "matmul GFLOP": flops[1] / 1e9, "best ms": 1e3 * t_ours,
         "tokens/s": batch * t / t_ours, "ratio (best)": t_seed / t_ours, "ratio (median pair)": ratio,
         "matmul FLOP ratio": flops[0] / flops[1]},
    ]
    return rows, diff


@torch.inference_mode()
def recompute_generate(model, ids, new):
    for _ in range(new):
        logits = model(input_ids=ids, use_cache=False, logits_to_keep=1).logits[:, -1]
        ids = torch.cat((ids, logits.argmax(-1, keepdim=True)), 1)
    return ids


def bench_generation(model, context, new, repeats, device) -> list[dict]:
    ids = torch.randint(0, model.config.vocab_size, (1, context), device=device)
    cached = generate(model, ids, new)
    again = recompute_generate(model, ids, new)
    agree = (cached == again).float().mean().item()
    t_recompute, t_cache, ratio = paired_times(
        lambda: recompute_generate(model, ids, new), lambda: generate(model, ids, new), repeats, device
    )
    # steady state: one new token at 512 tokens of context, cached step vs full recompute
    cache = model(input_ids=ids, use_cache=True).cache
    nxt = ids[:, -1:]

    @torch.inference_mode()
    def cached_step():
        model(input_ids=nxt, cache=cache, use_cache=True)

    t_full, t_step, step_ratio = paired_times(lambda: recompute_generate(model, ids, 1), cached_step, repeats, device)
    return [
        {"side": "recompute prefix every step", "what": f"{new} tokens incl. prefill", "tokens/s": new / t_recompute,
         "ratio (best)": 1.0, "ratio (median pair)": 1.0, "same tokens": f"{agree:.0%}"},
        {"side": "slmlab cache (slmlab.generation)", "what": f"{new} tokens incl. prefill", "tokens/s": new / t_cache,
         "ratio (best)": t_recompute / t_cache, "ratio (median pair)": ratio, "same tokens": f"{agree:.0%}"},
        {"side": "recompute prefix every step", "what": "one step at this context", "tokens/s": 1 / t_full,
         "ratio (best)": 1.0, "ratio (median pair)": 1.0, "same tokens": ""},
        {"side": "slmlab cache", "what": "one step at this context", "tokens/s": 1 / t_step,
         "ratio (best)": t_full / t_step, "ratio (median pair)": step_ratio, "same tokens": ""},
    ]


@torch.inference_mode()
def bench_cache(model, context, device) -> list[dict]:
    cfg = model.config
    ids = torch.randint(0, cfg.vocab_size, (1, context), device=device)
    cache = model(input_ids=ids, use_cache=True).cache
    item = next(model.parameters()).element_size()
    size = cache_nbytes(cache)
    plain = 2 * cfg.num_hidden_layers * cfg.num_key_value_heads * cfg.head_dim * item
    # the seed's decode cache per layer: state tokens [T, d], K/V of 2T tokens, int64 positions [T]
    seed_layout = cfg.num_hidden_layers * (cfg.hidden_size * item + 2 * plain // cfg.num_hidden_layers + 8)
    return [
        {"cache": "plain K/V cache of the same attention", "bytes/token": float(plain), "x plain": 1.0},
        {"cache": "slmlab NanoHammer (filled)", "bytes/token": size["filled"] / context, "x plain": size["filled"] / context / plain},
        {"cache": "slmlab NanoHammer (allocated)", "bytes/token": size["allocated"] / context, "x plain": size["allocated"] / context / plain},
        {"cache": "seed's layout (state tokens + 2T K/V)", "bytes/token": float(seed_layout), "x plain": seed_layout / plain},
    ]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--threads", type=int, default=1, help="1 (default): timed by process CPU time")
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--seq-len", type=int, default=512)
    parser.add_argument("--batch", type=int, default=1)
    parser.add_argument("--new-tokens", type=int, default=16)
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--dtype", default="float32", choices=["float32", "bfloat16"])
    parser.add_argument("--parts", default="prefill,generation,cache", help="comma-separated subset to run")
    parser.add_argument("--json", action="store_true", help="also print one JSON line with the ratios")
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    device = torch.device(args.device)
    torch.manual_seed(0)
    model = NanoHammerForCausalLM(NanoHammerConfig(**BENCH_CONFIG)).to(device, getattr(torch, args.dtype))
    clock = "process CPU time" if device.type == "cpu" and args.threads == 1 else "wall time"
    print(f"config: {BENCH_CONFIG}  device={device} dtype={args.dtype} threads={args.threads} clock={clock}")

    parts = set(args.parts.split(","))
    result = {}
    if "prefill" in parts:
        rows, diff = bench_prefill(model.train(), args.seq_len, args.batch, args.repeats, device)
        print_table(rows, f"1. prefill forward+backward of the decoder stack, batch {args.batch} x T={args.seq_len} (target >= 1.8x)")
        print(f"   max |hidden(ours) - hidden(seed way)| = {diff:.2e}")
        result.update(prefill_ratio_best=rows[1]["ratio (best)"], prefill_ratio_median_pair=rows[1]["ratio (median pair)"],
                      prefill_matmul_flop_ratio=rows[1]["matmul FLOP ratio"], hidden_max_diff=diff)
    if "generation" in parts:
        gen = bench_generation(model.eval(), args.seq_len, args.new_tokens, args.repeats, device)
        print_table(gen, f"2. generation after {args.seq_len} tokens of context, {args.new_tokens} new tokens, greedy (target >= 5x)")
        result.update(generation_ratio_best=gen[1]["ratio (best)"], generation_ratio_median_pair=gen[1]["ratio (median pair)"],
                      decode_step_ratio_best=gen[3]["ratio (best)"])
    if "cache" in parts:
        cache = bench_cache(model.eval(), args.seq_len, device)
        print_table(cache, f"3. cache size after {args.seq_len} tokens ({args.dtype})")
        result.update(cache_x_plain_kv=cache[1]["x plain"])
    if args.json:
        print(json.dumps(result))


if __name__ == "__main__":
    main()
