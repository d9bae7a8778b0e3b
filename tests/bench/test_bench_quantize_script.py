"""benchmarks/bench_quantize.py runs a family end to end at the quickstart size (rows, agreement, the
profile split), and benchmarks/llamacpp_anchor.py imports and stands aside without llama-cpp-python."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path

import pytest

BENCHMARKS = Path(__file__).resolve().parents[2] / "benchmarks"


def load(name: str):
    spec = importlib.util.spec_from_file_location(name, BENCHMARKS / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_the_anchor_imports_without_llama_cpp():
    anchor = load("llamacpp_anchor")
    if anchor.available():
        pytest.skip("llama-cpp-python is installed: the benchmarks run it")
    assert "llama_cpp" not in sys.modules
    assert anchor.agreement([1, 2, 3], [1, 2, 4]) == "2/3"
    assert "q8_0" not in anchor.UNQUANTIZED  # q8_0 files load without weight repacking


def test_bench_quantize_measures_a_family_side_by_side(tmp_path):
    bench = load("bench_quantize")
    rows, split = bench.bench_family("lumen", "quickstart", new=4, repeats=1, use_compile=False, folder=tmp_path)
    assert [r["side"] for r in rows[:2]] == ["fp32", "int8"] and rows[1]["path"] == "plan"
    assert rows[0]["x fp32"] == 1.0 and rows[1]["greedy = fp32"].endswith("/4")
    assert 0 < rows[1]["logit rel err"] < 0.1 and 0 <= rows[1]["forced top-1 = fp32"] <= 1
    assert split["int8 linears"] == 4 * 7 + 1 and split["float linears"] == 0  # lumen-3m: 4 x 7 projections + the head
    assert 0 < split["profiled: kernel %"] < 100 and split["kernel calls/tok"] >= 4 * 4 + 1  # plan: qkv, o, gate|up, down + head
    assert split["int8 products ms"] > 0 and split["int8 GB/s"] > 0 and split["fp32 GB/s"] > 0


def test_the_target_table_compares_best_paths_with_llama_cpp():
    bench = load("bench_quantize")
    rows = [{"family": "lumen", "params": "2.8M", "side": side, "tokens/s": tps} for side, tps in
            [("fp32", 100.0), ("int8", 150.0), ("fp32 compiled", 200.0), ("int8 compiled", 300.0),
             ("llama.cpp f32 (GGUF, 1 threads; plain)", 250.0), ("llama.cpp q8_0 (GGUF, 1 threads; plain)", 400.0)]]
    rows.append({"family": "pgsm", "params": "2.1M", "side": "fp32", "tokens/s": 10.0})
    rows.append({"family": "pgsm", "params": "2.1M", "side": "int8", "tokens/s": 30.0})
    lumen, pgsm = bench.target_rows(rows)
    assert lumen["int8 / fp32"] == 1.5 and lumen["fp32 / llama.cpp f32"] == 0.8 and lumen["int8 / llama.cpp q8_0"] == 0.75
    assert pgsm["int8 / fp32"] == 3.0 and pgsm["llama.cpp f32"] != pgsm["llama.cpp f32"]  # NaN: no llama.cpp row


def test_bench_quantize_adds_int4_beside_int8(tmp_path):
    bench = load("bench_quantize")
    rows, _ = bench.bench_family("lumen", "quickstart", new=4, repeats=1, use_compile=False, folder=tmp_path, int4=True)
    by_side = {r["side"]: r for r in rows}
    assert by_side["int4"]["path"] == "plan" and by_side["int4"]["greedy = fp32"].endswith("/4")
    assert by_side["int8"]["logit rel err"] < by_side["int4"]["logit rel err"] < 0.5
    [target] = bench.target_rows(rows)
    assert target["int4 tok/s"] == by_side["int4"]["tokens/s"] and target["int4 / fp32"] > 0
