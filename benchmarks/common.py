"""Helpers shared by the benchmark scripts: timing, a matmul peak, table printing."""

from __future__ import annotations

import statistics
import time
from typing import Callable

import torch


def timeit(fn: Callable[[], object], repeats: int = 3, warmup: int = 1) -> float:
    """Median wall time of ``fn()`` over ``repeats`` runs, after ``warmup`` runs."""
    for _ in range(warmup):
        fn()
    times = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t0)
    return statistics.median(times)


def matmul_peak_gflops(n: int = 1024, repeats: int = 5) -> float:
    """Measured fp32 GEMM throughput of this machine (GFLOP/s), the reference for achieved FLOP/s."""
    a, b = torch.randn(n, n), torch.randn(n, n)
    sec = timeit(lambda: a @ b, repeats=repeats, warmup=2)
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
