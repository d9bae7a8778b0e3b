"""benchmarks/bench_matmul_peak.py, the machine's matrix-product peak per format: its GFLOP/s are the
operations it ran over the CPU time it took, and every format is read against fp32 at the same size."""

from __future__ import annotations

import importlib.util
from pathlib import Path

import pytest

BENCHMARKS = Path(__file__).resolve().parents[2] / "benchmarks"


def load():
    spec = importlib.util.spec_from_file_location("bench_matmul_peak", BENCHMARKS / "bench_matmul_peak.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_peaks_are_operations_over_cpu_time_and_ratios_to_fp32():
    bench = load()
    rows = bench.peaks(m=48, sizes=(16, 32), seconds=0.01)
    assert [(r["format"], r["n"]) for r in rows] == [(f, n) for n in (16, 32) for f in ("fp32", "bf16", "int8")]
    for r in rows:
        if r["gflops"] is None:  # a format this torch has no CPU kernel for is said, not guessed
            assert r["products"] == 0 and r["x fp32"] is None
            continue
        assert r["products"] >= 2 and r["cpu_s"] > 0
        assert r["gflops"] == pytest.approx(2 * 48 * r["n"] ** 2 * r["products"] / r["cpu_s"] / 1e9)
        fp32 = next(x for x in rows if x["n"] == r["n"] and x["format"] == "fp32")
        assert r["x fp32"] == pytest.approx(r["gflops"] / fp32["gflops"])
    assert all(r["x fp32"] == 1.0 for r in rows if r["format"] == "fp32")


def test_int8_operands_are_int8_and_products_accumulate_exactly():
    bench = load()
    a, b = bench.operands("int8", 4, 8)
    assert a.dtype == b.dtype == __import__("torch").int8
    try:
        out = bench.product("int8")(a, b)
    except (RuntimeError, NotImplementedError):
        pytest.skip("this torch has no CPU int8 product")
    assert out.dtype.is_floating_point is False and out.tolist() == (a.int() @ b.int()).tolist()


def test_cpu_facts_name_only_known_flags():
    facts = load().cpu_facts()
    assert set(facts) == {"cpu", "torch capability", "flags"} and set(facts["flags"]) <= set(load().FLAGS)
