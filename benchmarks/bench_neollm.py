"""NeoLLM throughput: the default stack vs a plain Llama-style model, per-component cost, cached decoding.

1. Training tokens/s (forward + backward + AdamW, same batch) of the default NeoLLM and of a plain
   Llama-style decoder of the same width/depth/heads built from ``slmlab.layers`` (the Lumen family,
   untied head), with their ratio (target: NeoLLM costs at most 2x the plain model).
2. The cost of each default component: the default stack with that one component switched off;
   ``cost = t(default) / t(without it) - 1``.
3. ``--sections residual-options`` (also part of ``options``): each residual-side option's training
   step vs its anchor, in alternating rounds (targets in ``RESIDUAL_OPTIONS``; run with ``--seq 256``).
4. Generation tokens/s at a 512-token context: ``slmlab.generation`` through the cache vs recomputing
   the whole prefix for every new token (target: >= 5x).
5. ``--sections embedding-options``: the input-parameter ratio of the Leviathan generator against the
   dense table (counted on the meta device), the training step with the generator and with generator
   + JTok-M against the dense-table step (targets 1.3x and 1.6x; run with ``--seq 256``), and the eval
   forward with each baked table against the dense table's eval forward (target 1.02x).
6. ``options``: the default stack with one attention option on vs the default stack, same batch
   (targets in ``OPTIONS``; affine also on its eager path, LUCID also at ``--long`` tokens with peak
   RSS), and cached generation with all five options on vs recomputing the prefix (target: >= 5x).

    .venv/bin/python benchmarks/bench_neollm.py --sections attention-options --vocab 8192 --seq 256 --threads 1 --clock cpu
    .venv/bin/python benchmarks/bench_neollm.py --sections embedding-options --seq 256   # vocab 64402

    .venv/bin/python benchmarks/bench_neollm.py [--vocab 64402] [--batch 2] [--seq 128] [--sections train,components,generate]
    .venv/bin/python benchmarks/bench_neollm.py --vocab 8192 --threads 1 --clock cpu   # on a shared CPU box

Width/depth/heads default to the seed's config (512 wide, 12 layers, 8/4 heads of 64, MLP 1536).
Pass ``--vocab`` to shrink the embedding/head (identical for both models) on a small machine.
"""

from __future__ import annotations

import argparse
import os
import sys
import time

import torch

sys.path.insert(0, os.path.dirname(__file__))
from common import adamw_step, print_table  # noqa: E402
from slmlab.generation import generate  # noqa: E402
from slmlab.models.lumen import LumenConfig, LumenForCausalLM  # noqa: E402
from slmlab.models.neollm import NeoLLMConfig, NeoLLMForCausalLM  # noqa: E402

# One default component switched off per row (the output gate has no flag and stays on).
TOGGLES = {
    "FAN_attn (fan_ratio)": dict(fan_ratio=0.0),
    "FAN_ffn (fan_ratio_ffn)": dict(fan_ratio_ffn=0.0),
    "IHA (P=2, LLLLG)": dict(use_iha=False),
    "REPO + GRAPE": dict(use_repo=False, use_repo_grape=False),
    "momentum attention": dict(use_momentum_attention=False),
    "XSA": dict(use_xsa=False),
    "Hadamard o_proj (vs dense)": dict(use_hadamard_o_proj=False),
    "learnable multipliers": dict(use_learnable_multipliers=False),
    "SiameseNorm (vs pre-norm)": dict(use_siamesenorm=False),
    "Spelling Bee": dict(use_spelling_bee_embeddings=False),
    "xIELU (vs SiLU)": dict(hidden_act="silu"),
    "dropout (both)": dict(dropout_rate=0.0, attention_dropout=0.0),
}

# Residual-side options: (option, its config, the anchor it is measured against, target ratio).
# The flows need use_siamesenorm=False, so they are compared with the standard pre-norm topology.
STANDARD = dict(use_siamesenorm=False)
RESIDUAL_OPTIONS = [
    ("A/A: default vs default (noise floor)", {}, {}, None),
    ("LAUREL-RW", dict(STANDARD, use_laurel=True, use_laurel_rw=True), STANDARD, 1.02),
    ("LAUREL-LR (r=32)", dict(STANDARD, use_laurel=True, use_laurel_lr=True), STANDARD, 1.08),
    ("AttnRes block (N=4)", dict(STANDARD, use_attn_res=True), STANDARD, 1.10),
    ("AttnRes full (N=0)", dict(STANDARD, use_attn_res=True, attn_res_num_blocks=0), STANDARD, 1.25),
    ("StackMemory", dict(STANDARD, use_stack_memory=True), STANDARD, 1.15),
    ("LNS", dict(use_lns=True), {}, 1.03),
    ("GPAS", dict(use_gpas=True), {}, 1.03),
    ("PolyNorm (vs xIELU)", dict(polynorm_exclusive=True), {}, 1.05),
]


# Embedding-side options against the dense-table default: (option, its config, target step-time ratio).
GENERATOR = dict(use_token_generator=True)
EMBEDDING_OPTIONS = [
    ("Leviathan generator", GENERATOR, 1.3),
    ("generator + JTok-M", dict(GENERATOR, use_jtokm=True), 1.6),
]


# One attention option switched on per row (docs/neollm-attention.md): overrides, target step-time ratio.
OPTIONS = {
    "MEA (H_c = H_kv)": (dict(use_mea_attention=True), 1.05),
    "directional routing": (dict(use_directional_routing=True), 1.05),
    "REPO-GOAT prior": (dict(use_repo_goat_prior=True), 1.15),
    "affine-scaled (fused identity)": (dict(use_affine_scaled_attention=True), 1.10),
    "affine-scaled (eager)": (dict(use_affine_scaled_attention=True, _eager=True), None),
    "LUCID": (dict(use_lucid_attention=True), 1.6),
}
ALL_OPTIONS = dict(
    use_mea_attention=True, use_lucid_attention=True, use_affine_scaled_attention=True,
    use_directional_routing=True, use_repo_goat_prior=True,
)


def sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize()


CLOCK = {"wall": time.perf_counter, "cpu": time.process_time}
clock = time.perf_counter


def timed(fn, device, repeats: int, warmup: int = 1) -> float:
    """Fastest of ``repeats`` timed runs after ``warmup`` runs: on a shared machine the minimum is
    the least disturbed estimate."""
    for _ in range(warmup):
        fn()
    sync(device)
    times = []
    for _ in range(repeats):
        t0 = clock()
        fn()
        sync(device)
        times.append(clock() - t0)
    return min(times)


def neollm(args, **overrides) -> NeoLLMForCausalLM:
    torch.manual_seed(0)
    cfg = NeoLLMConfig(vocab_size=args.vocab, iha_sliding_window=args.window, **overrides)
    model = NeoLLMForCausalLM(cfg)
    if cfg.use_spelling_bee_embeddings:
        model.model.spelling_bee.set_byte_table_from_bytes([bytes([t % 256]) * (1 + t % 6) for t in range(args.vocab)])
    return model.to(args.device)


def plain_llama(args) -> LumenForCausalLM:
    ref = NeoLLMConfig()
    torch.manual_seed(0)
    cfg = LumenConfig(
        vocab_size=args.vocab, hidden_dim=ref.hidden_size, num_layers=ref.num_hidden_layers,
        num_heads=ref.num_attention_heads, num_kv_heads=ref.num_key_value_heads,
        intermediate_dim=ref.intermediate_size, max_seq_len=4096, tie_word_embeddings=False,
    )
    return LumenForCausalLM(cfg).to(args.device)


def train_step(model, args):
    """A closure running one forward + backward + AdamW step on a fixed batch."""
    return adamw_step(model, torch.randint(1, args.vocab, (args.batch, args.seq), device=args.device))


def train_step_time(model, args) -> float:
    return timed(train_step(model, args), args.device, args.repeats)


def interleaved_times(steps, args) -> list[float]:
    """Time several step closures in alternating rounds (A B A B ...) so machine noise hits all alike."""
    for step in steps:
        step()
    sync(args.device)
    best = [float("inf")] * len(steps)
    for _ in range(args.repeats):
        for i, step in enumerate(steps):
            t0 = clock()
            step()
            sync(args.device)
            best[i] = min(best[i], clock() - t0)
    return best


def generation_rates(model, args) -> tuple[float, float]:
    """(cached tokens/s, recompute tokens/s) for ``--new`` tokens after a prompt filling ``--context``."""
    model.eval()
    prompt = torch.randint(1, args.vocab, (1, args.context - args.new), device=args.device)
    cached = timed(lambda: generate(model, prompt, args.new), args.device, 1)

    @torch.inference_mode()
    def recompute():
        ids = prompt
        for _ in range(args.new):
            nxt = model(input_ids=ids, use_cache=False).logits[:, -1].argmax(-1, keepdim=True)
            ids = torch.cat([ids, nxt], dim=1)

    full = timed(recompute, args.device, 1, warmup=0)
    return args.new / cached, args.new / full


def option_model(args, overrides: dict) -> NeoLLMForCausalLM:
    """The default stack with ``overrides``; ``_eager`` puts affine-scaled attention on its eager entry."""
    from slmlab.models.neollm.components.attention import ATTENTION_FUNCTIONS

    overrides = dict(overrides)
    eager = overrides.pop("_eager", False)
    model = neollm(args, **overrides)
    if eager:
        for layer in model.model.layers:
            layer.self_attn.core.attend = ATTENTION_FUNCTIONS["affine_eager"]
    return model


def peak_rss_mib() -> float:
    import resource

    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


def options_section(args) -> None:
    """Each attention option alone vs the default stack (same batch, interleaved rounds), then LUCID at
    ``--long`` tokens and cached generation with all five options on."""
    ids = torch.randint(1, args.vocab, (args.batch, args.seq), generator=torch.Generator().manual_seed(0))
    ids = ids.to(args.device)
    rows = []
    for name, (overrides, target) in OPTIONS.items():
        t_base, t_opt = interleaved_times([adamw_step(neollm(args), ids), adamw_step(option_model(args, overrides), ids)], args)
        ratio = t_opt / t_base
        rows.append({"option on": name, "step s": t_opt, "default s": t_base, "x default": ratio,
                     "target": "-" if target is None else f"<= {target:.2f}"})
        verdict = "" if target is None else (" ok" if ratio <= target else " MISSED")
        print(f"RATIO option {name} / default step time = {ratio:.3f}x{'' if target is None else f' (target <= {target})'}{verdict}", flush=True)
    print_table(rows, f"Training step with one option on, batch {args.batch}x{args.seq}, vocab {args.vocab}, {args.clock} clock")
    long_ids = torch.randint(1, args.vocab, (args.batch, args.long), generator=torch.Generator().manual_seed(1)).to(args.device)
    t_base = timed(adamw_step(neollm(args), long_ids), args.device, 1)
    rss_base = peak_rss_mib()
    t_lucid = timed(adamw_step(option_model(args, OPTIONS["LUCID"][0]), long_ids), args.device, 1)
    print(
        f"RATIO option LUCID / default step time at T={args.long} = {t_lucid / t_base:.3f}x; "
        f"peak RSS {rss_base:.0f} MiB after the default step, {peak_rss_mib():.0f} MiB after LUCID",
        flush=True,
    )
    cached, full = generation_rates(neollm(args, **ALL_OPTIONS), args)
    print(f"RATIO generation cache/recompute, all five options = {cached / full:.1f}x (target >= 5x)", flush=True)


def embedding_section(args) -> None:
    """The generator's input parameters against the dense table, the training step with the generator
    (and JTok-M) against the dense-table step, and the baked eval forward against the dense eval forward."""
    with torch.device("meta"):
        dense = NeoLLMConfig(vocab_size=args.vocab)
        table = NeoLLMForCausalLM(dense).model.embed_tokens.weight.numel()
        gen = sum(p.numel() for p in NeoLLMForCausalLM(NeoLLMConfig(vocab_size=args.vocab, **GENERATOR)).model.token_generator.parameters())
    print(f"RATIO input parameters dense table {table:,} / generator {gen:,} = {table / gen:.2f}x fewer", flush=True)
    rows = []
    for name, overrides, target in EMBEDDING_OPTIONS:
        t_on, t_off = interleaved_times([train_step(neollm(args, **overrides), args), train_step(neollm(args), args)], args)
        rows.append({"option": name, "step s": t_on, "dense-table step s": t_off, "x dense": t_on / t_off, "target": target})
        verdict = "ok" if t_on / t_off <= target else "MISSED"
        print(f"RATIO train {name} / dense-table step time = {t_on / t_off:.3f}x (target <= {target}) {verdict}", flush=True)
    print_table(rows, f"Training step, batch {args.batch}x{args.seq}, vocab {args.vocab}, {args.device}, {args.clock} clock")
    ids = torch.randint(1, args.vocab, (args.batch, args.seq), generator=torch.Generator().manual_seed(2)).to(args.device)

    def baked_eval(overrides):
        model = neollm(args, **overrides).eval()
        model.bake_inference_table()
        return torch.inference_mode()(lambda: model(input_ids=ids, use_cache=False))

    evals = [("dense table, baked", {}), ("generator, baked", GENERATOR), ("generator + JTok-M, baked", dict(GENERATOR, use_jtokm=True))]
    times = interleaved_times([baked_eval(o) for _, o in evals], args)
    for (name, _), t in zip(evals[1:], times[1:]):
        goal = " (target <= 1.02)" if name == "generator, baked" else ""
        print(f"RATIO eval forward {name} / dense table, baked = {t / times[0]:.3f}x{goal}", flush=True)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--vocab", type=int, default=64402)
    p.add_argument("--batch", type=int, default=2)
    p.add_argument("--seq", type=int, default=128)
    p.add_argument("--window", type=int, default=None, help="iha_sliding_window (None = automatic)")
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--context", type=int, default=512)
    p.add_argument("--new", type=int, default=32)
    p.add_argument("--long", type=int, default=1024, help="options: the longer sequence for LUCID's cost and memory")
    p.add_argument("--threads", type=int, default=2)
    p.add_argument(
        "--clock", choices=sorted(CLOCK), default="wall",
        help="wall time, or process CPU time (use with --threads 1 on a shared, oversubscribed machine)",
    )
    p.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    p.add_argument("--sections", default="train,components,generate", help="comma-separated subset to run (also: options)")
    args = p.parse_args()
    args.device = torch.device(args.device)
    global clock
    clock = CLOCK[args.clock]
    torch.set_num_threads(args.threads)
    tokens = args.batch * args.seq
    sections = set(args.sections.split(","))

    if sections & {"train", "components"}:
        t_plain, t_neo = interleaved_times([train_step(plain_llama(args), args), train_step(neollm(args), args)], args)
        rows = [
            {"model": "plain Llama-style (slmlab.layers)", "step s": t_plain, "tokens/s": tokens / t_plain, "x plain": 1.0},
            {"model": "NeoLLM default stack", "step s": t_neo, "tokens/s": tokens / t_neo, "x plain": t_neo / t_plain},
        ]
        print_table(rows, f"Training, batch {args.batch}x{args.seq}, vocab {args.vocab}, {args.device}, {args.clock} clock")
        print(f"RATIO train NeoLLM/plain step time = {t_neo / t_plain:.2f}x (target <= 2x)", flush=True)

    if "components" in sections:
        comp = []
        for name, overrides in TOGGLES.items():
            t = train_step_time(neollm(args, **overrides), args)
            comp.append({"switched off": name, "step s": t, "x plain": t / t_plain, "cost of component": t_neo / t - 1})
            print(f"  {name}: {t:.3f} s/step", flush=True)
        print_table(comp, "Default stack with one component off (cost = t(default)/t(without) - 1)")

    if sections & {"options", "attention-options"}:
        options_section(args)

    if sections & {"options", "embedding-options"}:
        embedding_section(args)

    if sections & {"options", "residual-options"}:
        opts = []
        for name, overrides, anchor, target in RESIDUAL_OPTIONS:
            t_on, t_off = interleaved_times([train_step(neollm(args, **overrides), args), train_step(neollm(args, **anchor), args)], args)
            opts.append({"option": name, "step s": t_on, "anchor s": t_off, "x anchor": t_on / t_off, "target": target})
            goal = "the spread of identical runs" if target is None else f"target <= {target}x"
            print(f"RATIO option {name} = {t_on / t_off:.3f}x its anchor ({goal})", flush=True)
        print_table(opts, "Residual-side options, training step vs anchor (standard topology for the flows, default stack otherwise)")

    if "generate" in sections:
        cached, full = generation_rates(neollm(args), args)
        print_table(
            [{"decode": "cache (slmlab.generation)", "tokens/s": cached}, {"decode": "recompute prefix", "tokens/s": full}],
            f"Generation of {args.new} tokens reaching a {args.context}-token context, batch 1",
        )
        print(f"RATIO generation cache/recompute = {cached / full:.1f}x (target >= 5x)")


if __name__ == "__main__":
    main()
