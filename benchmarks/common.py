"""Helpers shared by the benchmark scripts: timing, a matmul peak, table printing."""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable

import torch


def timeit(fn: Callable[[], object], repeats: int = 3, warmup: int = 1, clock: Callable[[], float] = time.perf_counter) -> float:
    """Median time of ``fn()`` over ``repeats`` runs, after ``warmup`` runs (wall time unless ``clock``
    says otherwise, e.g. ``time.process_time``)."""
    for _ in range(warmup):
        fn()
    times = []
    for _ in range(repeats):
        t0 = clock()
        fn()
        times.append(clock() - t0)
    return statistics.median(times)


def adamw_step(model: torch.nn.Module, ids: torch.Tensor) -> Callable[[], None]:
    """A closure running one forward + backward + AdamW step of ``model`` on the batch ``ids``."""
    model.train()
    opt = torch.optim.AdamW(model.parameters(), lr=1e-4)

    def step() -> None:
        opt.zero_grad(set_to_none=True)
        model(input_ids=ids, labels=ids).loss.backward()
        opt.step()

    return step


def timeit_interleaved(
    fns: dict[str, Callable[[], object]], repeats: int = 3, warmup: int = 1, clock: Callable[[], float] = time.perf_counter
) -> dict[str, float]:
    """Median time of each function, timed in turns (A B C A B C ...) so that a change in machine
    load hits every side alike. ``clock=time.process_time`` measures CPU time instead of wall time."""
    for fn in fns.values():
        for _ in range(warmup):
            fn()
    times: dict[str, list[float]] = {name: [] for name in fns}
    for _ in range(repeats):
        for name, fn in fns.items():
            t0 = clock()
            fn()
            times[name].append(clock() - t0)
    return {name: statistics.median(ts) for name, ts in times.items()}


def generation_rows(baseline: Callable[[], object], ours: dict[str, Callable[[], object]], new_tokens: int,
                    repeats: int, baseline_name: str, clock: Callable[[], float] = time.perf_counter,
                    first_call_timed: tuple[str, ...] = ()) -> list[dict]:
    """Tokens/s of a baseline and of our generation variants, timed in turns, as table rows.

    The first call of each variant named in ``first_call_timed`` (e.g. one that compiles) is timed apart.
    """
    compile_s = {}
    for name in first_call_timed:
        t0 = time.perf_counter()
        ours[name]()
        compile_s[name] = time.perf_counter() - t0
    times = timeit_interleaved({baseline_name: baseline, **ours}, repeats, clock=clock)
    rows = []
    for name, sec in times.items():
        row = {"side": name, "tokens/s": new_tokens / sec, "ratio": times[baseline_name] / sec}
        row["first call s"] = compile_s.get(name, float("nan"))
        rows.append(row)
    return rows


def torch_gemv_time(model: torch.nn.Module, repeats: int = 50, clock: Callable[[], float] = time.perf_counter) -> tuple[float, float]:
    """What torch takes for the matrix-vector products of one batch-1 decode step of ``model`` in its
    dtype: one vector-matrix product over every 2-D weight (the LM head included), and nothing else.
    Returns ``(seconds per token, megabytes of weights per token)``.

    This is the cost of torch's GEMV dispatches on this machine, not a limit any implementation must
    respect: llama.cpp decodes the same weights faster than this row (2.0x for lumen-3m, 1.6x for
    the lfm2 seed config, one thread; see the llama.cpp rows, ``benchmarks/llamacpp_anchor.py``)."""
    mats = [p.detach().t().contiguous() for name, p in model.named_parameters() if p.dim() == 2 and "embed" not in name]
    head, table = model.get_output_embeddings(), model.get_input_embeddings()
    if head is not None and head.weight is table.weight:  # tied: the table is also read as the LM head
        mats.append(head.weight.detach().t().contiguous())
    vectors = {m.shape[0]: torch.randn(1, m.shape[0], dtype=m.dtype) for m in mats}

    def one_token():
        for m in mats:
            vectors[m.shape[0]] @ m

    return timeit(one_token, repeats=repeats, warmup=5, clock=clock), sum(m.numel() * m.element_size() for m in mats) / 1e6


def gemv_row(model: torch.nn.Module, baseline_seconds_per_token: float, clock: Callable[[], float] = time.perf_counter) -> dict:
    """A table row: torch's GEMVs alone (:func:`torch_gemv_time`) as tokens/s, and its ratio."""
    sec, mb = torch_gemv_time(model, clock=clock)
    return {"side": f"torch GEMVs alone ({mb:.1f} MB of weights per token)", "tokens/s": 1 / sec,
            "ratio": baseline_seconds_per_token / sec, "first call s": float("nan")}


def matmul_peak_gflops(n: int = 1024, repeats: int = 5, clock: Callable[[], float] = time.perf_counter) -> float:
    """Measured fp32 GEMM throughput of this machine (GFLOP/s), the reference for achieved FLOP/s."""
    a, b = torch.randn(n, n), torch.randn(n, n)
    sec = timeit(lambda: a @ b, repeats=repeats, warmup=2, clock=clock)
    return 2 * n**3 / sec / 1e9


def print_table(rows: list[dict], title: str) -> None:
    cols = list(rows[0])
    widths = {c: max(len(c), *(len(_fmt(r[c])) for r in rows)) for c in cols}
    print(f"\n{title}")
    print("  ".join(c.ljust(widths[c]) for c in cols))
    for r in rows:
        print("  ".join(_fmt(r[c]).ljust(widths[c]) for c in cols))


def _fmt(v) -> str:
    if isinstance(v, float):
        return f"{v:,.3f}" if abs(v) < 100 else f"{v:,.1f}"
    return str(v)
