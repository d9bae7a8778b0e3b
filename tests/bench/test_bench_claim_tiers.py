"""The claims' tiers (issue 33): the CPU claim tiers and gpu-claims load, name their cells, and a cell of the GPU
tier runs end to end as a toy on the CPU (the full runs are GPU-days)."""

from __future__ import annotations

import dataclasses

import pytest

from slmlab import cli
from slmlab.bench.claims import CLAIMS
from slmlab.bench.run import run_one
from slmlab.bench.tier_file import builtin_tiers, load_tier_file, tier_plans

CELL = "t7:gpu|pgsm-small[retrieval_dim=512]|lr=0.001|seed=0|b=64|steps=31260|eval=1563|scored"


def test_every_claim_names_a_built_in_tier_with_runs():
    tiers = builtin_tiers()
    for claim in CLAIMS.values():
        assert claim.tier in tiers, claim.name
        _, _, plans = load_tier_file(tiers[claim.tier])
        assert plans and all(p.max_steps > 0 for p in plans)


def test_gpu_claims_loads_and_its_cells_are_named_by_their_keys(capsys):
    tier, _, plans = load_tier_file(builtin_tiers()["gpu-claims"])
    assert tier == "gpu-claims" and len(plans) == 5 * 3 * 3 + 3 * 2 * 3
    assert CELL in {p.key for p in plans}
    assert cli.main(["bench", "run", "--tier", "gpu-claims", "--dry-run"]) == 0
    assert CELL in capsys.readouterr().out


@pytest.mark.parametrize("cell", [CELL, "mqar:gpu,T=512,N=64|neollm-gpu[use_xsa=True]|lr=0.001|seed=0"])
def test_a_gpu_claims_cell_runs_as_a_toy_on_the_cpu(tmp_path, cell):
    plan = next(p for p in tier_plans("gpu-claims") if p.key.startswith(cell))
    toy = dataclasses.replace(plan, task=f"{plan.task},n_train=16,n_test=8", batch_size=2, max_steps=2, eval_every=2,
                              max_time=0.0)
    line = run_one(toy, "gpu-claims", tmp_path)
    assert line["complete"] and line["steps"] == 2 and line["stop"] == "max_steps: 2 of 2 steps"
    assert line["model_config"] == dict(plan.model_config) and line["examples"] == 8
    assert line["task_T"] == (1024 if plan.model == "pgsm-small" else 512)
