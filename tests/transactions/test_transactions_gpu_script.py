"""benchmarks/gpu_transactions.py, the GPU recipe, runs end to end on the CPU at toy size (in a subprocess, as it
is run on the GPU machine) and writes a report whose structure and values are checked, so the script cannot rot
while no GPU is at hand."""

from __future__ import annotations

import importlib.util
import json
import math
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

pytest.importorskip("pandas")
pytest.importorskip("sklearn")

from slmlab.transactions.evaluation.evaluate import any_verdict, verdict  # noqa: E402

SCRIPT = Path(__file__).resolve().parents[2] / "benchmarks" / "gpu_transactions.py"
MODELS = {"hgb_raw", "hgb_rolling", "hgb_rolling_risk", "token_lr", "hgb_rolling_encoder", "sequence", "stacked",
          "joint", *(f"lf_{arm}_s{k}" for arm in ("pretrained", "scratch") for k in range(3))}


def load():
    spec = importlib.util.spec_from_file_location("gpu_transactions", SCRIPT)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.fixture(scope="module")
def toy_run(tmp_path_factory):
    out = tmp_path_factory.mktemp("gpu_toy")
    proc = subprocess.run([sys.executable, str(SCRIPT), "--out", str(out), "--toy", "--threads", "1",
                           "--precision", "bf16"], capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr[-3000:]
    return out, proc.stdout, json.loads((out / "report.json").read_text())


@pytest.mark.slow  # the toy run: about 110 s of CPU
def test_the_toy_run_says_which_device_and_dtype_ran(toy_run):
    out, stdout, report = toy_run
    env = report["environment"]
    assert env["device"] == "cpu" and env["precision"] == "bf16" and env["autocast_dtype"] == "bfloat16"
    assert env["dtype"] == "bf16 autocast (weights fp32)" and env["cpu_threads"] == 1
    assert stdout.startswith("gpu_transactions: device cpu (") and "| dtype bf16 autocast (weights fp32) |" in stdout
    assert stdout.rstrip().splitlines()[-1].startswith("gpu_transactions: device cpu | dtype bf16 autocast")
    markdown = (out / "report.md").read_text()
    assert markdown.startswith("# Transactions GPU recipe") and "dtype **bf16 autocast (weights fp32)**" in markdown


@pytest.mark.slow  # the toy run: about 110 s of CPU
def test_the_toy_run_trains_every_stage_by_steps(toy_run):
    out, _, report = toy_run
    bank, stages = report["bank"], report["stages"]
    assert bank["customers"] == 100 and bank["rows"] == stages["generate"]["rows"] > 10_000
    assert 1 <= bank["test_frauds"] == report["n_test_fraud"] and bank["test_rows"] == report["n_test"]
    for name, steps in (("pretrain", 3), ("finetune", 3), ("joint", 3)):
        s = stages[name]
        assert s["steps_done"] == s["steps_asked"] == steps, name
        assert s["stop_reason"] == "max_steps reached" and s["stopped_by_time_cap"] is False and s["max_time_s"] == 0
        assert s["tokens_per_s"] > 0 and s["batch_size"] == 8
    assert math.isfinite(stages["pretrain"]["val_loss"]) and stages["pretrain"]["val_loss"] > 0
    for name in ("finetune", "joint"):  # evaluated at steps 2 and 3 (the end); the best validation step kept
        s = stages[name]
        best = out / ("finetune" if name == "finetune" else "finetune-joint") / "checkpoints" / "best"
        if math.isfinite(s["val_pr_auc_last"]):  # a fraud in validation: the best of the two evaluations is kept
            assert s["kept_step"] in (2, 3) and s["kept_because"] == "best validation PR-AUC", name
            assert best.is_dir() and s["kept_val_pr_auc"] >= s["val_pr_auc_last"], name
        else:
            assert s["kept_step"] == 3 and s["kept_because"].startswith("last step (validation PR-AUC undefined"), name
        assert "train_pr_auc_last" in s and s["train_pr_auc_last"] is not None, name
    assert stages["joint"]["features"] >= 20
    assert stages["label_fraction"]["fraction"] == 0.2 and stages["label_fraction"]["steps_asked"] == 2
    assert report["time_cap"] == {"seconds": 0.0, "elapsed_s": report["time_cap"]["elapsed_s"], "exceeded": False,
                                  "stages_stopped_by_cap": []}
    for folder in ("pretrain", "finetune", "finetune-joint", *(f"evaluate/label_fraction/{arm}-s{k}"
                                                               for arm in ("pretrained", "scratch") for k in range(3))):
        assert (out / folder / "schema.fitted.json").is_file(), folder
    assert (out / "evaluate" / "report.md").is_file() and (out / "evaluate" / "pr_curve.png").is_file()


@pytest.mark.slow  # the toy run: about 110 s of CPU
def test_the_toy_report_holds_every_model_and_the_verdicts(toy_run):
    out, _, report = toy_run
    metrics = json.loads((out / "evaluate" / "metrics.json").read_text())
    assert set(report["models"]) == MODELS == set(metrics["models"])
    for name, m in report["models"].items():
        assert m["pr_auc"] == metrics["models"][name]["pr_auc"], name  # the evaluation's own figures
        assert 0 <= m["pr_auc"] <= 1 and 0 <= m["roc_auc"] <= 1, name
        lo, hi = m["pr_auc_ci"]
        assert [lo, hi] == metrics["bootstrap"][name]["pr_auc"], name  # the evaluation's own CI, copied
        assert lo < hi or lo == hi == m["pr_auc"], name  # resamples vary, unless every one ranks perfectly
    assert 0 < report["resamples"] <= 20
    assert {"sequence - hgb_rolling", "hgb_rolling - hgb_raw", "stacked - hgb_rolling",
            "lf_pretrained - lf_scratch"} <= set(report["paired"])
    criteria = {c["criterion"]: c for c in report["criteria"]}
    assert list(criteria) == ["1 parity", "2 useful", "2 useful, secondary (hgb_rolling_encoder)",
                              "2 useful, secondary (joint)", "3 strong", "4 pretraining pays"]
    assert [c["counted"] for c in criteria.values()] == [True, True, False, False, True, True]
    assert criteria["2 useful"]["difference"] == "stacked - hgb_rolling" == metrics["primary"]
    assert "joint - hgb_rolling" in report["paired"]
    for name, margin in (("1 parity", -0.01), ("3 strong", 0.03), ("4 pretraining pays", 0.05)):
        c = criteria[name]
        assert c["verdict"] == verdict(c["pr_auc_ci"], margin) == c["verdicts"]["pr_auc"], name
    assert criteria["2 useful"]["verdict"] == any_verdict(criteria["2 useful"]["verdicts"].values())
    arms = metrics["arms"]  # criterion 4 compares the arms' seed means
    assert criteria["4 pretraining pays"]["pr_auc_diff"] == pytest.approx(
        np.mean(arms["lf_pretrained"]["pr_auc_by_seed"]) - np.mean(arms["lf_scratch"]["pr_auc_by_seed"]))
    assert len(arms["lf_pretrained"]["pr_auc_by_seed"]) == 3
    table = (out / "report.md").read_text()
    for name in MODELS:
        assert f"| {name} | {report['models'][name]['pr_auc']:.3f} [" in table, name
    assert "| 4 pretraining pays | lf_pretrained - lf_scratch |" in table


def test_gpu_defaults_and_explicit_sizes():
    script = load()
    gpu = script.parse_args(["--out", "x"])
    assert (gpu.bank_preset, gpu.model_preset, gpu.precision) == ("large", "lfm2_small", "bf16")
    assert (gpu.pretrain_steps, gpu.finetune_steps, gpu.lf_steps, gpu.batch_size) == (1500, 600, 300, 64)
    assert (gpu.joint_steps, gpu.val_windows, gpu.eval_every) == (600, 4000, 150)
    assert (gpu.label_fraction, gpu.time_cap, gpu.hgb_threads) == (0.1, 540.0, 0)
    toy = script.parse_args(["--out", "x", "--toy", "--pretrain-steps", "7", "--bank-override", "n_days=30"])
    assert (toy.bank_preset, toy.model_preset, toy.pretrain_steps, toy.finetune_steps) == ("tiny", "lfm2_tiny", 7, 3)
    assert toy.bank_overrides == ["n_days=30"] and toy.time_cap == 0.0
    with pytest.raises(SystemExit):
        script.parse_args(["--out", "x", "--label-fraction", "1.5"])


def test_the_safety_cap_leaves_the_evaluation_its_reserve():
    script = load()
    clock = script.Clock(cap=100.0, reserve=40.0)
    clock.t0 -= 20.0  # 20 s have passed
    assert clock.max_time() == pytest.approx(40.0, abs=0.5)  # 100 - 40 - 20
    assert clock.max_time(0.5) == pytest.approx(20.0, abs=0.5)
    clock.t0 -= 100.0
    assert clock.max_time() == 1.0  # over the cap: one second, so the stage still takes a step and says so
    assert script.Clock(cap=0.0, reserve=40.0).max_time() == 0.0  # no cap
