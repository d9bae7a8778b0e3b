"""One GPU check per claim, each a section bounded by steps (wall time only a safety cap), each writing
``<out>/<section>.json`` and ``<out>/<section>.md`` (docs/gpu.md says what each claims and its figures).

    python benchmarks/gpu_check.py                          # every section on the GPU (~100M parameters)
    python benchmarks/gpu_check.py --section train decode   # some of them
    python benchmarks/gpu_check.py --toy --device cpu       # every section at a toy size (what the tests run)

Sections:
  train   one training step per family at ~100M parameters through slmlab's Trainer: bf16 autocast,
          fused AdamW, eager and torch.compile, then FSDP2 and DDP on the one GPU; tokens/s, MFU
          (model FLOPs counted from the forward's operations, benchmarks/flops.py, against a bf16
          matmul peak measured in the same run), peak memory.
  decode  tokens/s at batch 1 and 32 through slmlab.generation (the family's decode plan where it has
          one), and that plan's step replayed as a CUDA graph.
  parity  decode == prefill (last logits after a cached prefill + one step vs a full forward), and CPU vs
          GPU logits, in fp32 and bf16, with the tolerance each row is held to.
  paper   named cells of a named bench tier file through slmlab.bench (default: gpu-paper's MQAR cells
          where attention and gated convolutions part, TIER_CELLS); `--tier FILE.yaml --cells KEY...`
          runs any other.
"""

from __future__ import annotations

import argparse
import dataclasses
import datetime
import json
import os
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

from flops import matmul_peak_flops, mfu, model_flops_per_step  # noqa: E402

SECTIONS = ("train", "decode", "parity", "paper")
SAFETY_CAP_S = 540.0  # per section; a row it stops is marked, never measured

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


@dataclasses.dataclass(frozen=True)
class TierCells:
    """Cells of a bench tier: the runs whose key starts with one of ``cells`` (all runs when empty), each
    trained for at most ``max_steps`` (None: the tier's own budget)."""

    tier: str
    cells: tuple[str, ...] = ()
    max_steps: int | None = None


# gpu-paper: Zoology Figure 2's (T 256, N 16) at d 64, where attention is at 1.0 and the gated
# convolutions at 0.06-0.15 in the paper; 4,000 of the tier's 25,000 steps fit the window (attention
# stops early at 0.99). Another tier is one more line here, e.g. "gpu-claims": TierCells("gpu-claims") for
# every run of src/slmlab/bench/tiers/gpu-claims.yaml (or a path to any tier file).
TIER_CELLS = {
    "gpu-paper": TierCells("gpu-paper", tuple(f"mqar:gpu,T=256,N=16|{m}[d_model=64]|lr=0.0022|seed=0|"
                                              for m in ("attn2-z", "longconv4", "shortconv4")), max_steps=4000),
    "micro": TierCells("micro", ("ar:cpu,T=16,n_train=64,n_test=32|attn2-z|",), max_steps=2),
    # The seeds' claims at full size (gpu-claims.yaml is GPU-days): one device call each, seed 0, lr 1e-3,
    # 1,500 steps (96,000 rows, about one epoch), a first reading of each curve, never a verdict (one seed).
    # PGSM's retrieval_dim around the claimed 512 at block 1024 / distance 768:
    "gpu-claims-rd": TierCells("gpu-claims", tuple(f"t7:gpu|pgsm-small[retrieval_dim={rd}]|lr=0.001|seed=0|"
                                                   for rd in (256, 512, 768)), max_steps=1500),
    # NeoLLM with and without exclusive self-attention at Zoology's longest cell, (512, 64):
    "gpu-claims-xsa": TierCells("gpu-claims", tuple(f"mqar:gpu,T=512,N=64|neollm-gpu[use_xsa={x}]|lr=0.001|seed=0|"
                                                    for x in ("False", "True")), max_steps=1500),
}


@dataclasses.dataclass(frozen=True)
class Size:
    """Everything a run's size decides: models, batches, steps."""

    name: str
    models: dict  # family -> (preset or None, config overrides)
    batch: int = 8
    seq: int = 1024
    warmup: int = 3  # training steps before timing (compilation happens here)
    steps: int = 10  # timed training steps
    variants: tuple[str, ...] = ("eager", "compiled", "FSDP2", "DDP")  # of TRAIN_VARIANTS
    decode_batches: tuple[int, ...] = (1, 32)
    prompt: int = 128
    new_tokens: int = 128
    parity_seq: int = 128
    paper: str = "gpu-paper"


FULL = Size("full", {f: (None, o) for f, o in FAMILIES_100M.items()})
TOY = Size("toy", {f: (p, {"vocab_size": 64}) for f, p in (("lumen", "lumen-tiny"), ("lfm2", "lfm2-tiny"),
                                                            ("pgsm", "pgsm-tiny"), ("nanohammer", "nanohammer-tiny"),
                                                            ("neollm", "neollm-tiny"))},
           batch=2, seq=32, warmup=1, steps=2, variants=("eager", "FSDP2", "DDP"), decode_batches=(1, 2), prompt=8,
           new_tokens=4, parity_seq=12, paper="micro")  # compiling takes minutes on a CPU: not in the toy run


class Deadline:
    """The safety cap of a section: ``over()`` once it has run ``seconds``."""

    def __init__(self, seconds: float) -> None:
        self.end = time.perf_counter() + seconds

    def over(self) -> bool:
        return time.perf_counter() > self.end


def sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def build(family: str, size: Size, device: torch.device, seed: int = 0):
    """The family's model at this size, fp32, on ``device`` (NeoLLM's Spelling Bee table filled)."""
    from slmlab.models import get_family

    fam = get_family(family)
    preset, overrides = size.models[family]
    torch.manual_seed(seed)
    model = fam.model_class(fam.make_config(preset, **overrides))
    bee = getattr(getattr(model, "model", None), "spelling_bee", None)
    if bee is not None and hasattr(bee, "set_byte_table_from_bytes"):
        bee.set_byte_table_from_bytes([bytes([t % 256]) for t in range(model.config.vocab_size)])
    return model.to(device)


def n_params(model) -> int:
    return sum(p.numel() for p in {id(p): p for p in model.parameters()}.values())


class RandomTokens:
    """Uniform random token rows: a DataSource for timing the trainer (``batches`` only)."""

    is_synthetic = False

    def __init__(self, vocab: int, seq_len: int) -> None:
        self.vocab, self.seq_len, self.min_vocab_size = vocab, seq_len, vocab

    def batches(self, split: str, batch_size: int, *, seed: int, step: int = 0, rank: int = 0, world_size: int = 1):
        gen = torch.Generator().manual_seed(seed * 1_000_003 + step)
        while True:
            ids = torch.randint(0, self.vocab, (batch_size, self.seq_len), generator=gen)
            yield {"input_ids": ids, "labels": ids}


# -- train --------------------------------------------------------------------------------------------
TRAIN_VARIANTS = {"eager": (), "compiled": ("compile=true",), "FSDP2": ("parallel=fsdp2",), "DDP": ()}  # overrides


def train_row(family: str, variant: str, extra: tuple, size: Size, device: torch.device, peak: float, info,
              out: Path) -> dict:
    from slmlab.train import Trainer, load_config
    from slmlab.train.parallel import DDP

    model = build(family, size, device)
    ids = torch.randint(0, model.config.vocab_size, (size.batch, size.seq), device=device)
    flops = model_flops_per_step(model, {"input_ids": ids, "labels": ids})
    cfg = load_config([], [f"batch_size={size.batch}", f"max_steps={size.warmup + size.steps}", f"device={device}",
                           "precision=auto", "progress=false", "tensorboard=false", f"out_dir={out / 'scratch'}", *extra])
    strategy = DDP(info, device) if variant == "DDP" else None  # DDP in a group of one, beside FSDP2
    trainer = Trainer(cfg, model, RandomTokens(model.config.vocab_size, size.seq), None, out / "scratch", info, device,
                      parallel=strategy)
    stream = trainer.source.batches("train", size.batch, seed=0)
    t0 = time.perf_counter()
    for _ in range(size.warmup):
        trainer.train_step(stream)
    sync(device)
    warm = time.perf_counter() - t0
    if device.type == "cuda":
        torch.cuda.reset_peak_memory_stats(device)
    t0 = time.perf_counter()
    for _ in range(size.steps):
        loss = trainer.train_step(stream).loss
    sync(device)
    step_s = (time.perf_counter() - t0) / size.steps
    mem = torch.cuda.max_memory_allocated(device) / 2**30 if device.type == "cuda" else None
    return {"family": family, "variant": variant, "parallel": trainer.parallel.name, "params": n_params(trainer.model),
            "tokens/step": size.batch * size.seq, "model GFLOP/step": round(flops / 1e9, 3),
            "step ms": round(step_s * 1e3, 2), "tokens/s": round(size.batch * size.seq / step_s),
            "MFU": round(mfu(flops, step_s, peak), 4), "peak GiB": None if mem is None else round(mem, 2),
            "warm-up s": round(warm, 1), "loss": round(loss, 4)}


def section_train(size: Size, device: torch.device, out: Path, deadline: Deadline) -> tuple[dict, list[dict]]:
    from slmlab.train.distributed import init_distributed, shutdown
    from slmlab.train.precision import uses_bf16

    dtype = torch.bfloat16 if uses_bf16(device, "auto") else torch.float32
    peak = matmul_peak_flops(device, dtype, n=8192 if device.type == "cuda" else 512)
    info = init_distributed(device, group=True)  # FSDP2 and DDP shard / replicate over a group of one
    rows = []
    try:
        for family in size.models:
            for variant in size.variants:
                rows += guarded(deadline, {"family": family, "variant": variant}, train_row, family, variant,
                                TRAIN_VARIANTS[variant], size, device, peak, info, out)
                free(device)
    finally:
        shutdown(info)
    return {"peak TFLOP/s": round(peak / 1e12, 3), "peak dtype": str(dtype).replace("torch.", "")}, rows


# -- decode -------------------------------------------------------------------------------------------
def timed_generate(model, ids: torch.Tensor, new: int, device: torch.device) -> tuple[float, str]:
    """Decode tokens/s after the first new token (the prefill excluded) and the path that ran."""
    from slmlab.generation import generate

    marks = []
    generate(model, ids, 2)  # warm-up
    sync(device)
    out = generate(model, ids, new, callback=lambda tok: (sync(device), marks.append(time.perf_counter())))
    return ids.shape[0] * (new - 1) / (marks[-1] - marks[0]), out.decode_path


def graphed_decode(model, ids: torch.Tensor, new: int) -> float | None:
    """Decode tokens/s with the family's plan step replayed as one CUDA graph per token; None without a plan."""
    from slmlab.layers.fused import frozen_weights

    if not hasattr(model, "decode_plan"):
        return None
    with torch.inference_mode(), frozen_weights():
        plan = model.decode_plan(ids.shape[1] + new)
        if plan is None:
            return None
        out = model(input_ids=ids, use_cache=True)
        plan.start(out.cache)
        tokens = out.logits[:, -1].argmax(-1, keepdim=True)
        position = torch.tensor([ids.shape[1]], device=ids.device)
        side = torch.cuda.Stream()
        side.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(side):  # warm-up writes the state at this position, which replay rewrites
            for _ in range(2):
                plan.step(tokens, position)
        torch.cuda.current_stream().wait_stream(side)
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph):
            logits = plan.step(tokens, position)
        torch.cuda.synchronize()
        t0 = time.perf_counter()
        for _ in range(new - 1):
            graph.replay()
            tokens.copy_(logits.argmax(-1, keepdim=True))
            position.add_(1)
        torch.cuda.synchronize()
        return ids.shape[0] * (new - 1) / (time.perf_counter() - t0)


def decode_rows(family: str, size: Size, device: torch.device) -> list[dict]:
    model = build(family, size, device).eval()
    rows = []
    for batch in size.decode_batches:
        ids = torch.randint(0, model.config.vocab_size, (batch, size.prompt), device=device)
        rate, path = timed_generate(model, ids, size.new_tokens, device)
        rows.append({"family": family, "batch": batch, "path": path, "tokens/s": round(rate, 1)})
        if device.type == "cuda":
            graphed = graphed_decode(model, ids, size.new_tokens)
            rows.append({"family": family, "batch": batch, "path": "plan + CUDA graph" if graphed else
                         "no decode plan: no CUDA graph", "tokens/s": None if graphed is None else round(graphed, 1)})
    return rows


def section_decode(size: Size, device: torch.device, out: Path, deadline: Deadline) -> tuple[dict, list[dict]]:
    rows = []
    for family in size.models:
        rows += guarded(deadline, {"family": family}, decode_rows, family, size, device)
        free(device)
    return {"prompt": size.prompt, "new tokens": size.new_tokens, "weights": "fp32"}, rows


# -- parity -------------------------------------------------------------------------------------------
PARITY_TOL = {"fp32": 1e-4, "bf16": 5e-2}  # max abs logit difference a row is held to


def last_logits(model, ids: torch.Tensor, bf16: bool) -> tuple[torch.Tensor, torch.Tensor]:
    """``(full, stepped)``: last-position logits of a full forward, and of a cached prefill of all but the
    last token followed by one decode step."""
    ctx = torch.autocast(ids.device.type, dtype=torch.bfloat16) if bf16 else torch.autocast(ids.device.type, enabled=False)
    with torch.no_grad(), ctx:
        full = model(input_ids=ids, use_cache=False).logits[:, -1].float()
        pre = model(input_ids=ids[:, :-1], use_cache=True)
        step = model(input_ids=ids[:, -1:], cache=pre.cache, use_cache=True).logits[:, -1].float()
    return full, step


def parity_rows(family: str, size: Size, device: torch.device) -> list[dict]:
    model = build(family, size, torch.device("cpu")).eval()
    ids = torch.randint(0, model.config.vocab_size, (2, size.parity_seq))
    reference = {p: last_logits(model, ids, p == "bf16")[0] for p in PARITY_TOL}  # CPU
    model = model.to(device)
    rows = []
    for precision, tol in PARITY_TOL.items():
        full, step = last_logits(model, ids.to(device), precision == "bf16")
        for check, diff in (("decode == prefill", (full - step).abs().max()),
                            (f"{device.type} vs cpu", (full.cpu() - reference[precision]).abs().max())):
            rows.append({"family": family, "precision": precision, "check": check, "max abs": float(diff),
                         "tolerance": tol, "ok": bool(diff <= tol)})
    return rows


def section_parity(size: Size, device: torch.device, out: Path, deadline: Deadline) -> tuple[dict, list[dict]]:
    old = torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32
    torch.backends.cuda.matmul.allow_tf32 = torch.backends.cudnn.allow_tf32 = False  # fp32 means fp32 here
    rows = []
    try:
        for family in size.models:
            rows += guarded(deadline, {"family": family}, parity_rows, family, size, device)
            free(device)
    finally:
        torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32 = old
    return {"sequence": size.parity_seq, "batch": 2}, rows


# -- paper --------------------------------------------------------------------------------------------
def cell_plans(cells: TierCells, max_time: float) -> tuple[list, dict[str, int]]:
    """``(plans, budgets)``: the runs of ``cells`` (each cell must name at least one run of its tier) with
    their steps capped and ``max_time`` as a safety cap, and each one's step budget in the tier."""
    from slmlab.bench.tier_file import tier_plans

    plans = tier_plans(cells.tier)
    missing = [c for c in cells.cells if not any(p.key.startswith(c) for p in plans)]
    if missing:
        raise ValueError(f"tier {cells.tier}: no run's key starts with {missing}; `slmlab bench list --yaml"
                         f" {cells.tier}` shows its runs")
    chosen = [p for p in plans if not cells.cells or any(p.key.startswith(c) for c in cells.cells)]
    capped = [dataclasses.replace(p, max_steps=min(p.max_steps, cells.max_steps or p.max_steps), max_time=max_time)
              for p in chosen]
    return capped, {c.key: p.max_steps for c, p in zip(capped, chosen)}


def section_paper(size: Size, device: torch.device, out: Path, deadline: Deadline, cells: TierCells | None = None
                  ) -> tuple[dict, list[dict]]:
    from slmlab.bench.run import read_results, run_plans

    cells = cells or TIER_CELLS[size.paper]
    plans, budgets = cell_plans(cells, max_time=max(1.0, deadline.end - time.perf_counter()))
    run_plans(plans, cells.tier, out / "paper", device=str(device), log=print)  # skips cells already there
    records = {r["key"]: r for r in read_results(out / "paper" / "results.jsonl") if r["key"] in budgets}
    rows = [{"cell": key.split("|seed=")[0], "acc": r["acc"], "95% CI": (r["ci"] or {}).get("acc"), "steps": r["steps"],
             "tier budget": budgets[key], "stop": r["stop"], "complete": r["complete"], "wall s": r["wall_s"]}
            for key, r in records.items()]
    return {"tier": cells.tier, "cells": list(cells.cells) or "all", "max steps": cells.max_steps}, rows


# -- the frame ----------------------------------------------------------------------------------------
def guarded(deadline: Deadline, row: dict, fn, *args) -> list[dict]:
    """The rows of ``fn(*args)`` (one dict or a list), or ``row`` marked as stopped by the safety cap (never
    run) or with the error it raised: every family is reported, even when one fails."""
    if deadline.over():
        return [{**row, "skipped": "section safety cap reached before this row"}]
    try:
        got = fn(*args)
    except Exception as err:  # noqa: BLE001 - a failing row is a result to report
        return [{**row, "error": f"{type(err).__name__}: {err}"}]
    return got if isinstance(got, list) else [got]


def free(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.empty_cache()


RUNNERS = {"train": section_train, "decode": section_decode, "parity": section_parity, "paper": section_paper}


def cell(value) -> str:
    """A markdown table cell: thousands separators, 4 significant digits, ``|`` escaped."""
    if value is None:
        return ""
    if isinstance(value, int) and not isinstance(value, bool):
        return f"{value:,}"
    if isinstance(value, float):
        return f"{value:,.4g}"
    return str(value).replace("|", "\\|")


def markdown(name: str, meta: dict, rows: list[dict]) -> str:
    cols = list(dict.fromkeys(k for r in rows for k in r))
    lines = [f"# gpu_check {name}", "", ", ".join(f"{k}: {v}" for k, v in meta.items()), "",
             "| " + " | ".join(cols) + " |", "|" + "---|" * len(cols)]
    lines += ["| " + " | ".join(cell(r.get(c)) for c in cols) + " |" for r in rows]
    return "\n".join(lines) + "\n"


def run_section(name: str, size: Size, device: torch.device, out: Path, cap_s: float = SAFETY_CAP_S, **kwargs) -> dict:
    """Run one section and write ``<out>/<name>.json`` and ``.md``; returns the JSON object."""
    out.mkdir(parents=True, exist_ok=True)
    deadline = Deadline(cap_s)
    t0 = time.perf_counter()
    meta, rows = RUNNERS[name](size, device, out, deadline, **kwargs)
    result = {
        "section": name, "size": size.name, "device": str(device),
        "device_name": torch.cuda.get_device_name(device) if device.type == "cuda" else "cpu",
        "torch": torch.__version__, "date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
        "wall_s": round(time.perf_counter() - t0, 1), "safety_cap_s": cap_s,
        "incomplete": any("skipped" in r or "error" in r for r in rows), **meta, "rows": rows,
    }
    (out / f"{name}.json").write_text(json.dumps(result, indent=1, default=str) + "\n")
    (out / f"{name}.md").write_text(markdown(name, {k: v for k, v in result.items() if k != "rows"}, rows))
    return result


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--section", nargs="+", choices=SECTIONS, default=list(SECTIONS))
    p.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    p.add_argument("--toy", action="store_true", help="tiny models and steps: checks the sections run (e.g. on a CPU)")
    p.add_argument("--out", default="runs/gpu-check")
    p.add_argument("--cap-s", type=float, default=SAFETY_CAP_S, help="safety cap per section in seconds (steps bound it)")
    p.add_argument("--tier", help="paper: a tier of TIER_CELLS, or a tier name / FILE.yaml with --cells")
    p.add_argument("--cells", nargs="*", help="paper: run-key prefixes of the tier's runs (none: every run)")
    p.add_argument("--max-steps", type=int, help="paper: cap each cell's steps")
    args = p.parse_args(argv)
    device = torch.device(args.device)
    if device.type == "cpu" and not args.toy:
        print("no CUDA device: skipped (the full sizes are for a GPU; --toy --device cpu checks every section here)")
        return 0
    size = TOY if args.toy else FULL
    cells = None
    if args.tier:
        cells = TIER_CELLS.get(args.tier) or TierCells(args.tier)
        if args.cells is not None:
            cells = dataclasses.replace(cells, cells=tuple(args.cells))
    if args.max_steps:
        cells = dataclasses.replace(cells or TIER_CELLS[size.paper], max_steps=args.max_steps)
    for name in args.section:
        extra = {"cells": cells} if name == "paper" else {}
        result = run_section(name, size, device, Path(args.out), args.cap_s, **extra)
        print(markdown(name, {k: v for k, v in result.items() if k != "rows"}, result["rows"]))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
