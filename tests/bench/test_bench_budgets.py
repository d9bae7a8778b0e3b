"""Budgets that do not depend on the machine: every tier run is bounded by its steps; ``max_time`` is
only a safety cap, and a run it stops is written ``"complete": false`` and kept out of every table."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from slmlab import cli
from slmlab.bench.run import read_results
from slmlab.bench.tier_file import builtin_tiers, load_tier_file

TINY = ("tier: tiny\ngroups:\n  - {tasks: ['ar:cpu,T=16,n_train=64,n_test=32'], models: [attn2-z, shortconv4],"
        " lrs: [1.0e-3], seeds: [0], batch_size: 8, max_steps: 6, eval_every: 3, max_time: 120}\n")
TIME_FIELDS = {"wall_s"}  # the only fields a machine's speed may change


def tiny_tier(tmp_path: Path) -> Path:
    path = tmp_path / "bench-tiny.yaml"
    path.write_text(TINY)
    return path


@pytest.mark.parametrize("tier", ["cpu-smoke", "cpu-full", "gpu-paper", "micro"])
def test_every_built_in_group_names_its_step_budget_and_a_larger_time_cap(tier):
    """Each group (or the file's defaults) states max_steps; max_time is a cap well above the steps' cost."""
    raw = yaml.safe_load(builtin_tiers()[tier].read_text())
    defaults = raw.get("defaults") or {}
    for number, group in enumerate(raw["groups"], 1):
        merged = {**defaults, **group}
        assert "max_steps" in merged, f"{tier} group {number} has no max_steps: its budget would be the clock"
        assert merged.get("max_time", 0) == 0 or merged["max_time"] >= 60, (tier, number)


# Idle 2-core seconds per step (evaluations included) the CPU tiers were sized with: the wall-clock cpu-full runs
# (the git history of docs/results/bench-cpu-full/results.jsonl before its step-budget run), those measured at
# load 4-8 (runs 5-25) halved (tier file comments); the step-budget seed 0 then took 91 minutes at load 2-4;
# the multi-query T2 (ar:cpu, T 32): CPU seconds of a training step plus 15% for the evaluations.
STEP_COST = {
    ("mqar:cpu", "attn2-z"): 0.032, ("mqar:cpu", "shortconv4"): 0.050, ("mqar:cpu", "longconv4"): 0.074,
    ("mqar:cpu", "lfm2-hyb-cpu"): 0.227, ("mqar:cpu,T=128,N=8", "attn2-z"): 0.105,
    ("mqar:cpu,T=128,N=8", "shortconv4"): 0.130, ("mqar:cpu,T=128,N=8", "longconv4"): 0.179,
    ("mqar:cpu,T=128,N=8", "lfm2-hyb-cpu"): 0.427, ("ar:cpu", "attn2-z"): 0.016, ("ar:cpu", "shortconv4"): 0.028,
    ("ar:cpu", "longconv4"): 0.048, ("ar:cpu", "lfm2-hyb-cpu"): 0.092, ("ar:cpu", "attn2-rope"): 0.038,
    ("ar:cpu", "pgsm-cpu"): 0.082, ("t3:cpu", "attn2-rope"): 0.221, ("t3:cpu", "shortconv4"): 0.109,
    ("t3:cpu", "longconv4"): 0.201, ("t4:cpu", "attn2-rope"): 0.065, ("t5:cpu", "attn2-rope"): 0.175,
    ("t5:cpu", "shortconv4"): 0.077, ("t5:cpu,variant=multikey", "attn2-rope"): 0.165,
    ("t5:cpu,variant=multikey", "shortconv4"): 0.113, ("t7:cpu", "attn2-rope"): 0.142, ("t7:cpu", "pgsm-cpu"): 0.180,
    ("t7:cpu", "pgsm-cpu-noret"): 0.066,
}


@pytest.mark.parametrize(("tier", "minutes"), [("cpu-smoke", 10), ("cpu-full", 240)])
def test_cpu_tiers_step_budgets_fit_their_documented_time(tier, minutes):
    """Per seed, the step budgets cost at most the documented CPU time on an idle 2-core machine, and every
    run's max_time cap is about 3x its expected time (at least 2.5x: a cap, not the budget)."""
    _, _, plans = load_tier_file(builtin_tiers()[tier])
    one_seed = [p for p in plans if p.seed == 0]
    expected = {p: p.max_steps * STEP_COST[(p.task, p.model)] for p in one_seed}
    assert 0.75 * minutes * 60 <= sum(expected.values()) <= minutes * 60, (tier, sum(expected.values()) / 60)
    for plan, seconds in expected.items():
        assert plan.max_time >= 2.5 * seconds, (plan.key, plan.max_time, seconds)


def test_a_group_without_max_steps_is_refused(tmp_path):
    path = tmp_path / "bench-nosteps.yaml"
    path.write_text("groups: [{tasks: [t7:cpu], models: [attn2-z], lrs: [1.0e-3], max_time: 60}]\n")
    with pytest.raises(ValueError, match="group 1 has no max_steps"):
        load_tier_file(path)


def test_a_run_the_time_cap_stops_is_incomplete_and_no_figure(tmp_path, capsys):
    """max_time 1e-9 s: the cap fires after the first step (no clock reading is asserted)."""
    out = tmp_path / "out"
    argv = ["bench", "run", "--tier", str(tiny_tier(tmp_path)), "--out", str(out), "--threads", "1"]
    assert cli.main([*argv, "--models", "shortconv4", "--max-time", "1e-9"]) == 0
    assert cli.main([*argv, "--models", "attn2-z"]) == 0
    capped, full = sorted(read_results(out), key=lambda x: x["model"], reverse=True)
    assert capped["model"] == "shortconv4" and capped["complete"] is False and capped["steps"] == 1
    assert capped["stop"] == "max_time safety cap at step 1 of 6" and capped["max_steps"] == 6
    assert full["complete"] is True and full["stop"] == "max_steps: 6 of 6 steps" and full["max_time"] == 120
    capsys.readouterr()
    assert cli.main(["bench", "report", str(out)]) == 0
    text = capsys.readouterr().out
    table = text.split("\n\n")[0]
    row = next(x for x in table.splitlines() if "shortconv4" in x)
    assert "attn2-z" in table and " — (1 incomplete" in row and "0." not in row  # flagged, never a figure
    assert "1 of 2 runs incomplete" in text and "shortconv4" in text.split("1 of 2 runs incomplete")[1]
    # a rerun with the same --out redoes the incomplete run (the cap is not part of the run's key)
    assert cli.main([*argv, "--models", "shortconv4"]) == 0
    lines = read_results(out)
    assert len(lines) == 3 and lines[-1]["model"] == "shortconv4" and lines[-1]["complete"] is True
    capsys.readouterr()
    assert cli.main(["bench", "report", str(out)]) == 0
    text = capsys.readouterr().out
    assert "shortconv4" in text.split("\n\n")[0] and "incomplete" not in text


def test_results_do_not_depend_on_the_load_of_the_machine(tmp_path):
    """The same tiny tier twice, the second time beside a CPU hog: the lines differ only in wall time."""
    path = tiny_tier(tmp_path)
    base = ["bench", "run", "--tier", str(path), "--threads", "1"]
    assert cli.main([*base, "--out", str(tmp_path / "quiet")]) == 0
    hog = subprocess.Popen([sys.executable, "-c", "import time\nend = time.time() + 120\nwhile time.time() < end: pass"])
    try:
        assert cli.main([*base, "--out", str(tmp_path / "loaded")]) == 0
    finally:
        hog.kill()
        hog.wait()
    quiet, loaded = read_results(tmp_path / "quiet"), read_results(tmp_path / "loaded")
    assert len(quiet) == len(loaded) == 2 and all(x["complete"] for x in quiet + loaded)
    strip = [[{k: v for k, v in line.items() if k not in TIME_FIELDS} for line in lines] for lines in (quiet, loaded)]
    assert strip[0] == strip[1]
