"""Where one decoded token's time goes: the decode plan eager, under ``torch.compile`` and packaged by
AOTInductor (``slmlab generate --compile``), side by side in one process.

Batch 1, greedy, ``--new`` tokens after a ``--prompt-len``-token prompt, one thread, this process's CPU
time (best of ``--repeats``, the paths timed in turns). Per path, one token splits into:

* **matrix products**: every projection of the plan once through the same kernel the step calls
  (``x @ W``, or the int8 kernel), timed alone and uninstrumented, less the same number of calls on
  16 x 16 matrices (the cost of calling from Python): the kernels' own time, which no wrapper removes;
* **attention kernels** and **K/V cache update** (eager: ``scaled_dot_product_attention`` and the
  two ``index_copy_`` per attention layer), **norms, RoPE, residuals** (the other operators), and
  **Python and dispatch** (what is left of the step: the interpreter between operators, the
  dispatcher's per-call work). Eager, these come from torch.profiler's self times over the step,
  as shares of the unprofiled step time; the profiler cannot see inside a compiled graph, so there
* **guards and wrappers** (``torch.compile``: dynamo's frame evaluation and guard checks, the
  AOTAutograd prologue, from the profiler) and **generated kernels** (the rest of the compiled
  step: inductor's fused C++ kernels for norms, RoPE, attention and the cache write, and the C++
  wrapper between them);
* **sampling** (``argmax`` of the logits, timed alone) and **loop** (the rest of a token in
  ``generate``: the prompt's prefill and the plan's set-up spread over the tokens, the callback, the
  position counter). Everything runs inside one ``frozen_weights()`` block, as a server does: the
  plan's arranged weights are built once and reused by every generation.

Then the start-up cost of each compiled path, cold (nothing cached) and warm (a second start: the
package loaded from the cache folder; ``torch.compile`` with inductor's own caches warm), in CPU
seconds of this process and its compiler subprocesses, each in a fresh subprocess.

    nice -n 10 .venv/bin/python benchmarks/profile_decode.py [--family lumen|lfm2] [--size quickstart|100m]
        [--int8] [--new 128] [--repeats 5] [--no-startup]
"""

from __future__ import annotations

import argparse
import copy
import json
import os
import resource
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import torch

sys.path.insert(0, os.path.dirname(__file__))
from common import print_table  # noqa: E402
from slmlab.generation import build_plan, generate  # noqa: E402
from slmlab.generation.loop import compiled_capacity, frozen_plan  # noqa: E402
from slmlab.generation.packaged import packaged_step  # noqa: E402
from slmlab.generation.plan import Int8Columns, project  # noqa: E402
from slmlab.layers import frozen_weights  # noqa: E402
from slmlab.models import get_family  # noqa: E402
from slmlab.models.quantize import quantize_int8  # noqa: E402

SIZES = {  # family -> size -> (preset, overrides)
    "lumen": {"quickstart": ("lumen-3m", {}), "100m": (None, None)},
    "lfm2": {"quickstart": ("lfm2-small", {"vocab_size": 2048}), "100m": (None, None)},
}
PRODUCTS = ("aten::mm", "aten::addmm", "aten::matmul", "aten::_weight_int8pack_mm", "aten::linear")
ATTENTION = ("aten::scaled_dot_product_attention", "aten::_scaled_dot_product_flash_attention_for_cpu", "aten::bmm",
             "aten::_softmax", "aten::softmax")
CACHE = ("aten::index_copy_",)
FRAMEWORK = ("TorchDynamo Cache Lookup", "Pregraph bytecode", "AOTDispatcher Runtime Wrapper Prologue", "Torch-Compiled Region")


def build(family: str, size: str, int8: bool):
    fam = get_family(family)
    preset, overrides = SIZES[family][size]
    if overrides is None:
        from gpu_check import FAMILIES_100M

        overrides = FAMILIES_100M[family]
    torch.manual_seed(0)
    model = fam.model_class(fam.make_config(preset, **overrides)).eval()
    if int8:
        model = copy.deepcopy(model)
        quantize_int8(model)
    return model


def cpu_seconds() -> float:
    """CPU time of this process and its finished children (the C++ compiler)."""
    own, kids = resource.getrusage(resource.RUSAGE_SELF), resource.getrusage(resource.RUSAGE_CHILDREN)
    return own.ru_utime + own.ru_stime + kids.ru_utime + kids.ru_stime


def best(fns: dict, repeats: int) -> dict[str, float]:
    """Best CPU time of each function, timed in turns after one warm-up call each."""
    for fn in fns.values():
        fn()
    times = {name: float("inf") for name in fns}
    for _ in range(repeats):
        for name, fn in fns.items():
            t0 = time.process_time()
            fn()
            times[name] = min(times[name], time.process_time() - t0)
    return times


def binders(plan) -> dict:
    """``{path: bind(plan) -> step(tokens, position)}``: each path's step over a started plan of
    ``plan``'s layout (the compiled ones compiled here, once)."""
    compiled = torch.compile(plan.step_fn, dynamic=False, fullgraph=True, options={"cpp_wrapper": True})
    packaged = packaged_step(plan.step_fn, plan.weights, plan.states, 1)
    return {
        "plan (eager)": lambda p: p.step,
        "torch.compile": lambda p: (lambda tokens, position: compiled(p.weights, p.states, tokens, position)),
        "AOTInductor package": lambda p: packaged.bind(p.weights, p.states),
    }


def products_alone(plan, tiny: bool = False):
    """Every projection of the plan once, through the kernel the step uses (``tiny``: the same number
    of calls on 16 x 16 matrices of the same kind, which measures the cost of a call from Python)."""
    mats = _projections(plan.weights)
    if tiny:
        mats = [Int8Columns(torch.zeros(16, 16, dtype=torch.int8), torch.ones(16, dtype=w.scale.dtype))
                if isinstance(w, Int8Columns) else torch.randn(16, 16) for w in mats]
    vectors = [torch.randn(1, w.qweight.shape[1] if isinstance(w, Int8Columns) else w.shape[0]) for w in mats]

    def run():
        for x, w in zip(vectors, mats):
            project(x, w)

    return run


def _projections(tree):
    import dataclasses

    if isinstance(tree, Int8Columns) or (isinstance(tree, torch.Tensor) and tree.dim() == 2 and tree.dtype.is_floating_point):
        return [tree]
    if dataclasses.is_dataclass(tree):
        return [p for f in dataclasses.fields(tree) if f.name not in ("embed", "rope", "slots", "qk_norm", "conv")
                for p in _projections(getattr(tree, f.name))]
    if isinstance(tree, (list, tuple)):
        return [p for item in tree for p in _projections(item)]
    return []


def profile_shares(step, tokens, position, steps: int = 64) -> dict[str, float]:
    """Profiler self-time shares of one path's step by category (of the profiled total)."""
    from torch.profiler import ProfilerActivity, profile

    with profile(activities=[ProfilerActivity.CPU]) as prof:
        t0 = time.perf_counter()
        for _ in range(steps):
            step(tokens, position)
        total = time.perf_counter() - t0
    shares = dict.fromkeys(("products", "attention", "cache", "framework", "compiled graph", "other ops"), 0.0)
    for event in prof.key_averages():
        sec = event.self_cpu_time_total / 1e6
        if event.key in PRODUCTS:
            shares["products"] += sec
        elif event.key in ATTENTION:
            shares["attention"] += sec
        elif event.key in CACHE:
            shares["cache"] += sec
        elif event.key in FRAMEWORK:
            shares["framework"] += sec
        elif event.key.startswith("## Call CompiledFxGraph"):
            shares["compiled graph"] += sec
        else:
            shares["other ops"] += sec
    return {k: v / total for k, v in shares.items()}


def split_table(model, prompt_len: int, new: int, repeats: int) -> list[dict]:
    ids = torch.randint(1, model.config.vocab_size, (1, prompt_len), generator=torch.Generator().manual_seed(1))
    capacity = compiled_capacity(prompt_len + new, model.max_positions())
    with torch.inference_mode(), frozen_weights():  # fixed weights: the plan's arranged weights are reused, as in generate
        cache = model(input_ids=ids, use_cache=True).cache
        plan = build_plan(model, capacity)
        plan.start(cache)
        bind = binders(plan)
        paths = {name: b(plan) for name, b in bind.items()}
        tokens = ids[:, -1:]

        def steps(step):
            def run():
                position = torch.tensor([prompt_len])
                for _ in range(new):
                    step(tokens, position)
                    position.add_(1)
            return run

        def loop(step):  # what generate does per token on this path, prompt and plan set-up included
            def run():
                out = model(input_ids=ids, use_cache=True)
                p = frozen_plan(model, capacity)
                p.start(out.cache)
                position, nxt = torch.tensor([prompt_len]), out.logits[:, -1].argmax(-1)
                bound = step(p)
                for _ in range(new - 1):
                    nxt = bound(nxt[:, None], position).argmax(-1)
                    position.add_(1)
            return run

        logits = plan.step(tokens, torch.tensor([prompt_len]))
        fns = {f"step {name}": steps(fn) for name, fn in paths.items()}
        fns |= {f"token {name}": loop(bind[name]) for name in paths}
        products, calls = products_alone(plan), products_alone(plan, tiny=True)
        fns |= {"products": lambda: [products() for _ in range(new)], "calls": lambda: [calls() for _ in range(new)],
                "sampling": lambda: [logits.argmax(-1) for _ in range(new)],
                "generate (plan)": lambda: generate(model, ids, new),
                "generate (compile=True)": lambda: generate(model, ids, new, compile=True)}
        times = {k: 1e3 * v / new for k, v in best(fns, repeats).items()}  # ms per token
        shares = {name: profile_shares(step, tokens, torch.tensor([prompt_len])) for name, step in paths.items()
                  if name != "AOTInductor package"}
    rows = []
    for name in paths:
        step, token = times[f"step {name}"], times[f"token {name}"]
        products, sampling = times["products"] - times["calls"], times["sampling"]
        row = {"path": name, "token ms": token, "tokens/s": 1e3 / token, "step ms": step, "matrix products": products}
        if name == "plan (eager)":
            s = shares[name]
            row |= {"attention kernels": s["attention"] * step, "K/V cache update": s["cache"] * step,
                    "norms, RoPE, residuals": s["other ops"] * step}
            row["Python and dispatch"] = step - products - sum(row[k] for k in ("attention kernels", "K/V cache update",
                                                                                 "norms, RoPE, residuals"))
        elif name == "torch.compile":
            s = shares[name]
            row["guards and wrappers"] = s["framework"] * step
            row["generated kernels"] = step - products - row["guards and wrappers"]
        else:
            row["generated kernels"] = step - products
        row |= {"sampling": sampling, "loop": token - step - sampling}
        rows.append(row)
    columns = ["path", "token ms", "tokens/s", "step ms", "matrix products", "attention kernels", "K/V cache update",
               "norms, RoPE, residuals", "Python and dispatch", "guards and wrappers", "generated kernels", "sampling", "loop"]
    table = [{c: r.get(c, float("nan")) for c in columns} for r in rows]
    for name in ("generate (plan)", "generate (compile=True)"):
        print(f"slmlab {name}: {times[name]:.3f} ms per token ({1e3 / times[name]:,.0f} tokens/s)")
    return table


STARTUP = """
import json, resource, sys, time, torch
sys.path.insert(0, {bench!r})
torch.set_num_threads(1)
from profile_decode import build
from slmlab.generation import build_plan, generate
model = build({family!r}, {size!r}, {int8!r})
ids = torch.randint(1, model.config.vocab_size, (1, 8), generator=torch.Generator().manual_seed(1))
generate(model, ids, 2)  # imports and first-call work outside the timed part
def cpu():
    a, b = resource.getrusage(resource.RUSAGE_SELF), resource.getrusage(resource.RUSAGE_CHILDREN)
    return a.ru_utime + a.ru_stime + b.ru_utime + b.ru_stime
c0, w0 = cpu(), time.perf_counter()
if {path!r} == "torch.compile":
    with torch.inference_mode():
        plan = build_plan(model, 256)
        plan.start(model(input_ids=ids, use_cache=True).cache)
        step = torch.compile(plan.step_fn, dynamic=False, fullgraph=True, options={{"cpp_wrapper": True}})
        step(plan.weights, plan.states, ids[:, -1:], torch.tensor([8]))
else:
    generate(model, ids, 2, compile=True)
print(json.dumps({{"cpu": cpu() - c0, "wall": time.perf_counter() - w0}}))
"""


def startup_rows(family: str, size: str, int8: bool) -> list[dict]:
    """Cold and warm start of each compiled path, each in a fresh process with its own empty caches."""
    rows = []
    for path in ("torch.compile", "AOTInductor package"):
        with tempfile.TemporaryDirectory() as cache:
            env = dict(os.environ, SLMLAB_CACHE=cache, TORCHINDUCTOR_CACHE_DIR=str(Path(cache) / "inductor"))
            code = STARTUP.format(bench=os.path.dirname(os.path.abspath(__file__)), family=family, size=size, int8=int8,
                                  path=path)
            for start in ("cold", "warm"):
                out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, check=True)
                got = json.loads(out.stdout.strip().splitlines()[-1])
                rows.append({"path": path, "start": start, "CPU s": got["cpu"], "wall s": got["wall"]})
    return rows


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--family", choices=tuple(SIZES), default="lumen")
    p.add_argument("--size", choices=("quickstart", "100m"), default="quickstart")
    p.add_argument("--int8", action="store_true", help="the model's int8 copy (slmlab.models.quantize)")
    p.add_argument("--prompt-len", type=int, default=5)
    p.add_argument("--new", type=int, default=128)
    p.add_argument("--repeats", type=int, default=5)
    p.add_argument("--no-startup", action="store_true", help="skip the cold/warm start-up measurement")
    args = p.parse_args()
    torch.set_num_threads(1)
    model = build(args.family, args.size, args.int8)
    n = sum(q.numel() for q in {id(q): q for q in model.parameters()}.values())
    print(f"{args.family} {args.size} ({n / 1e6:.2f}M parameters{', int8' if args.int8 else ''}); torch {torch.__version__};"
          f" 1 thread; CPU clock; best of {args.repeats}; prompt {args.prompt_len}, {args.new} greedy tokens;"
          f" load average {os.getloadavg()[0]:.1f} on {os.cpu_count()} CPUs")
    print_table(split_table(model, args.prompt_len, args.new, args.repeats),
                "Where one token's time goes (ms per token, CPU time; see the module docstring for each column)")
    if not args.no_startup:
        print_table(startup_rows(args.family, args.size, args.int8),
                    "Start-up of the compiled step (this process and its compiler subprocesses, CPU seconds)")
    print(f"\nload average at the end {os.getloadavg()[0]:.1f}")


if __name__ == "__main__":
    main()
