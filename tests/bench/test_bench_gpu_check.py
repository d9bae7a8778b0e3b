"""benchmarks/gpu_check.py imports and plans its runs on a machine without CUDA."""

from __future__ import annotations

import importlib.util
from pathlib import Path

import pytest
import torch

SCRIPT = Path(__file__).resolve().parents[2] / "benchmarks" / "gpu_check.py"


def load():
    spec = importlib.util.spec_from_file_location("gpu_check", SCRIPT)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.mark.skipif(torch.cuda.is_available(), reason="plans only; on a GPU the script runs for real")
def test_gpu_check_plans_and_skips_without_cuda(capsys):
    gpu_check = load()
    rows = gpu_check.plan(batch=2, seq=64, steps=200)
    assert [r["family"] for r in rows[:-1]] == ["lumen", "lfm2", "pgsm", "nanohammer", "neollm"]
    assert rows[-1]["plan"].startswith("mqar:gpu,T=64,N=4|attn2-z[d_model=64]|") and "steps=200" in rows[-1]["plan"]
    assert gpu_check.main([]) == 0
    assert capsys.readouterr().out.startswith("no CUDA device: skipped")


def test_the_100m_configurations_build_on_the_meta_device():
    from slmlab.models import get_family

    gpu_check = load()
    for name, overrides in gpu_check.FAMILIES_100M.items():
        fam = get_family(name)
        with torch.device("meta"):
            model = fam.model_class(fam.make_config(None, **overrides))
        n = sum(p.numel() for p in {id(p): p for p in model.parameters()}.values())
        assert 5e7 < n < 2.5e8, (name, n)
