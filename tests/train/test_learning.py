"""Learning regressions: the shipped synthetic-task configs still learn, and the controls do not.

The spec's ``cpu-smoke`` tier (spec/benchmarks.md section 5), shortened: MQAR T1 (64, 4) with the
attention-only Lumen of ``configs/mqar-lumen.yaml`` on 10k training examples, and T7 ``cpu`` with
PGSM (``configs/t7-pgsm.yaml``) with and without its retrieval head. Each run takes well under a
minute on one core. Both configs once sat at a plateau (MQAR 0.25 with an MLP; PGSM at chance with
init_std 0.02), which is what these tests guard.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from slmlab.commands.train import train_command

pytestmark = pytest.mark.slow  # ~2 min on one core

CONFIGS = Path(__file__).resolve().parents[2] / "configs"
QUIET = ["progress=false", "tensorboard=false", "checkpoint_every=0", "sample_tokens=0", "log_every=100"]


def final_accuracy(tmp_path, config: str, *overrides: str) -> float:
    argv = [str(CONFIGS / config), "--out", str(tmp_path / "run"), *QUIET, *overrides]
    assert train_command(argv) == 0
    return json.loads((tmp_path / "run" / "report.json").read_text())["final_eval"]["acc"]


def test_attention_learns_mqar(tmp_path):
    # the config's schedule (3,000 steps, 300 warm-up) with an early stop at the spec's smoke threshold
    acc = final_accuracy(tmp_path, "mqar-lumen.yaml", "data=mqar:cpu,n_train=10000", "eval_every=100", "early_stop_acc=0.5")
    assert acc > 0.5, f"MQAR (64, 4) accuracy {acc:.3f} after 3,000 steps; the spec's smoke threshold is 0.5"


@pytest.mark.parametrize("retrieval", [True, False])
def test_pgsm_retrieval_head_solves_t7_and_the_conv_control_cannot(tmp_path, retrieval):
    flags = [] if retrieval else ["model_config.use_sparse_retrieval=false", "model_config.use_post_retrieval_block=false"]
    # with retrieval: the config's schedule (750 steps) stopping once accuracy passes 0.9
    budget = ["eval_every=125", "early_stop_acc=0.9"] if retrieval else ["max_steps=400", "eval_every=0"]
    acc = final_accuracy(tmp_path, "t7-pgsm.yaml", *budget, *flags)
    if retrieval:
        assert acc > 0.9, f"PGSM with retrieval reached only {acc:.3f} on T7 cpu after 750 steps"
    else:
        assert acc <= 0.05, f"conv-only PGSM reached {acc:.3f} on T7 (distance 96 > receptive field 49): the generator leaks"
