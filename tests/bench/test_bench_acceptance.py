"""Suite acceptance at reduced cpu-smoke size through the bench runner (slow): R1 attention learns
T7 cpu, R2 the short-convolution control stays at chance on T1. R3 needs cpu-full (docs/bench.md);
R4 is the generator tests of tests/data/test_data_tasks.py."""

from __future__ import annotations

import pytest

from slmlab.bench.run import run_one
from slmlab.bench.suite import RunPlan

pytestmark = pytest.mark.slow


def test_r1_attention_solves_t7_cpu(tmp_path):
    plan = RunPlan("t7:cpu", "attn2-rope", 2e-3, batch_size=32, max_steps=500, max_time=0.0, eval_every=250)
    line = run_one(plan, "acceptance", tmp_path)
    assert line["acc"] >= 0.5, line["acc"]  # measured 1.000 after 250 steps (early stop)
    assert line["ci"]["acc"][0] <= line["acc"] <= line["ci"]["acc"][1]


def test_r2_short_conv_control_stays_at_chance_on_mqar(tmp_path):
    plan = RunPlan("mqar:cpu,n_train=10000", "shortconv4", 3e-3, max_steps=100, max_time=0.0, eval_every=100)
    line = run_one(plan, "acceptance", tmp_path)
    assert line["acc"] <= 0.05, line["acc"]  # receptive field 9 tokens: no key-value read
