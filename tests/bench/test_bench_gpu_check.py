"""benchmarks/gpu_check.py: every section runs on the CPU at a toy size (so none can rot before a GPU
runs it), the model-FLOPs count equals a hand count, and the paper section runs named cells of any tier."""

from __future__ import annotations

import dataclasses
import importlib.util
import json
import sys
from pathlib import Path

import pytest
import torch

BENCHMARKS = Path(__file__).resolve().parents[2] / "benchmarks"


def load(name: str):
    if str(BENCHMARKS) not in sys.path:
        sys.path.insert(0, str(BENCHMARKS))  # gpu_check imports its neighbour flops.py, as when it runs
    spec = importlib.util.spec_from_file_location(name, BENCHMARKS / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module  # its dataclasses look their module up by name
    spec.loader.exec_module(module)
    return module


@pytest.fixture(scope="module")
def gpu_check():
    return load("gpu_check")


def run_toy(gpu_check, name: str, out: Path, **size) -> dict:
    result = gpu_check.run_section(name, dataclasses.replace(gpu_check.TOY, **size), torch.device("cpu"), out)
    assert json.loads((out / f"{name}.json").read_text())["rows"] == json.loads(json.dumps(result["rows"], default=str))
    assert (out / f"{name}.md").read_text().startswith(f"# gpu_check {name}")
    assert not result["incomplete"], result["rows"]
    return result


def test_train_section_runs_eager_fsdp2_and_ddp_on_the_cpu(gpu_check, tmp_path):
    lumen = {"lumen": gpu_check.TOY.models["lumen"]}
    result = run_toy(gpu_check, "train", tmp_path, models=lumen)
    assert [r["variant"] for r in result["rows"]] == ["eager", "FSDP2", "DDP"]
    assert [r["parallel"] for r in result["rows"]] == ["single process", "FSDP2", "DDP"]
    assert result["peak dtype"] == "float32" and result["peak TFLOP/s"] > 0  # the CPU trains in fp32: its fp32 peak
    losses = {r["loss"] for r in result["rows"]}
    assert len(losses) == 1  # the same model, data and steps in every layout
    for row in result["rows"]:
        assert row["tokens/s"] > 0 and 0 < row["MFU"] < 1 and row["model GFLOP/step"] > 0


def test_decode_and_parity_sections_run_for_every_family_on_the_cpu(gpu_check, tmp_path):
    decode = run_toy(gpu_check, "decode", tmp_path)
    paths = {r["family"]: r["path"] for r in decode["rows"]}
    assert paths == {"lumen": "plan", "lfm2": "plan", "pgsm": "model forward", "nanohammer": "model forward",
                     "neollm": "model forward"}
    assert all(r["tokens/s"] > 0 for r in decode["rows"])
    parity = run_toy(gpu_check, "parity", tmp_path)
    assert len(parity["rows"]) == 5 * 2 * 2 and all(r["ok"] for r in parity["rows"])


def test_paper_section_runs_named_cells_of_a_tier(gpu_check, tmp_path):
    paper = run_toy(gpu_check, "paper", tmp_path)
    [row] = paper["rows"]
    assert row["cell"].startswith("ar:cpu,T=16") and row["steps"] == 2 and row["tier budget"] == 5 and row["complete"]
    assert "\\|attn2-z\\|" in (tmp_path / "paper.md").read_text()  # keys keep their bars inside a table cell


def test_the_gpu_paper_cells_are_the_zoology_separation_and_any_tier_plugs_in(gpu_check):
    plans, budgets = gpu_check.cell_plans(gpu_check.TIER_CELLS["gpu-paper"], max_time=300)
    assert [p.model for p in plans] == ["attn2-z", "longconv4", "shortconv4"]
    assert {p.task for p in plans} == {"mqar:gpu,T=256,N=16"} and {p.model_config for p in plans} == {(("d_model", 64),)}
    assert all(p.max_steps == 4000 and p.max_time == 300 and budgets[p.key] == 25000 for p in plans)
    every, _ = gpu_check.cell_plans(gpu_check.TierCells("micro"), max_time=60)  # a tier in one line: all its runs
    assert len(every) == 2
    with pytest.raises(ValueError, match="no run's key starts with"):
        gpu_check.cell_plans(gpu_check.TierCells("micro", ("mqar:nope|",)), max_time=60)


def test_the_gpu_claims_cells_name_runs_of_the_claims_tier(gpu_check):
    plans, budgets = gpu_check.cell_plans(gpu_check.TIER_CELLS["gpu-claims-rd"], max_time=300)
    assert [dict(p.model_config)["retrieval_dim"] for p in plans] == [256, 512, 768]
    assert {(p.task, p.model, p.lr, p.seed) for p in plans} == {("t7:gpu", "pgsm-small", 1e-3, 0)}
    xsa, _ = gpu_check.cell_plans(gpu_check.TIER_CELLS["gpu-claims-xsa"], max_time=300)
    assert [dict(p.model_config)["use_xsa"] for p in xsa] == [False, True]
    assert {(p.task, p.model) for p in xsa} == {("mqar:gpu,T=512,N=64", "neollm-gpu")}
    assert all(p.max_steps == 1500 for p in plans + xsa) and set(budgets.values()) == {31260}


def test_model_flops_equal_a_hand_count():
    """One forward's matmuls and attention for tiny Lumen and LFM2 configs, counted by hand; a training
    step is 3 forwards (the backward of a matmul is two matmuls); MFU is achieved over peak FLOP/s."""
    flops = load("flops")
    from test_train_fsdp import toy_model

    B, T = 2, 16
    ids = torch.randint(0, 61, (B, T))
    batch = {"input_ids": ids, "labels": ids}
    # lumen-tiny: d 64, 2 layers, 4 heads of 16, 2 KV heads, SwiGLU 128, V 61, tied head
    d, layers, heads, hd, kv, inter, vocab = 64, 2, 4, 16, 2, 128, 61
    per_layer = 2 * d * heads * hd + 2 * 2 * d * kv * hd + 2 * heads * hd * d + 3 * 2 * d * inter
    attention = 2 * 2 * T * heads * hd  # q·kᵀ and p·v for every query over all T keys (no causal discount)
    lumen = B * T * (layers * (per_layer + attention) + 2 * d * vocab)
    assert flops.forward_flops(toy_model("lumen"), batch) == lumen
    assert flops.model_flops_per_step(toy_model("lumen"), batch) == 3 * lumen
    # lfm2-tiny: conv, attention, conv, attention (same d, heads, KV heads); conv: in 64 -> 3·64, depthwise
    # kernel 3 (2·k per channel and token), out 64; SwiGLU 128 in every layer
    conv_layer = 2 * d * 3 * d + 2 * d * 3 + 2 * d * d
    attn_layer = 2 * d * heads * hd + 2 * 2 * d * kv * hd + 2 * heads * hd * d + attention
    lfm2 = B * T * (2 * conv_layer + 2 * attn_layer + 4 * 3 * 2 * d * inter + 2 * d * vocab)
    assert flops.forward_flops(toy_model("lfm2"), batch) == lfm2
    assert flops.mfu(6e12, 2.0, 1e13) == pytest.approx(0.3)
    assert flops.matmul_peak_flops("cpu", torch.float32, n=64, repeats=2, trials=1) > 0


def test_full_sizes_need_a_gpu_and_the_100m_configurations_build(gpu_check, capsys):
    from slmlab.models import get_family

    if not torch.cuda.is_available():
        assert gpu_check.main([]) == 0
        assert capsys.readouterr().out.startswith("no CUDA device: skipped")
    for name, (preset, overrides) in gpu_check.FULL.models.items():
        fam = get_family(name)
        with torch.device("meta"):
            model = fam.model_class(fam.make_config(preset, **overrides))
        n = sum(p.numel() for p in {id(p): p for p in model.parameters()}.values())
        assert 5e7 < n < 2.5e8, (name, n)
