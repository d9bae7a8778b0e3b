"""The bench runner, results file, report, reproduce and the `slmlab bench` command."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from slmlab import cli
from slmlab.bench.anchors import ANCHORS
from slmlab.bench.run import RESULT_FIELDS, SCHEMA, read_results, run_one
from slmlab.bench.suite import RunPlan
from slmlab.bench.tier_file import tier_plans


def test_micro_tier_writes_one_line_per_run_with_every_field_and_skips_finished_runs(tmp_path, capsys):
    out = tmp_path / "bench"
    assert cli.main(["bench", "run", "--tier", "micro", "--out", str(out), "--threads", "1"]) == 0
    lines = read_results(out)
    assert len(lines) == 2 and {x["model"] for x in lines} == {"attn2-z", "shortconv4"}
    for line in lines:
        assert set(RESULT_FIELDS) <= set(line)
        assert line["schema"] == SCHEMA and line["steps"] == 5 and line["task"] == "ar" and line["task_T"] == 16
        lo, hi = line["ci"]["acc"]
        assert lo <= line["acc"] <= hi and line["examples"] == 32
        assert line["best_step"] == 5 and line["params_total"] > line["params_nonembedding"] > 0
    assert lines[1]["state_floats"] == 4 * 2 * 64  # shortconv4: (k-1)*d per layer
    run_dirs = list((out / "runs").iterdir())
    assert all((d / "checkpoints" / "best" / "config.json").is_file() for d in run_dirs)  # keep_best
    text = capsys.readouterr().out
    assert "[1/2]" in text and "[2/2]" in text and "ETA" in text
    assert cli.main(["bench", "run", "--tier", "micro", "--out", str(out)]) == 0
    assert "2 of 2 runs already in" in capsys.readouterr().out and len(read_results(out)) == 2


def fixture_lines() -> list[dict]:
    base = dict(schema=SCHEMA, tier="fixture", params_total=1000, params_nonembedding=500, n_layers=2, seed=0,
                batch_size=8, train_on="scored", steps=10, wall_s=1.0, stop_reason="max_steps reached", token_acc=0.5,
                exact=0.5, examples=10, best_step=10, best_val_acc=0.5, acc_by_group={}, exact_by_group={}, acc_by_length={},
                leakage={}, torch="x", numpy="y")
    lines = []
    for model, acc, floats in (("attn2-z", 0.99, 16384), ("longconv4", 0.4, 16896), ("shortconv4", 0.01, 512)):
        for d in (64, 128):
            for lr, bump in ((1e-3, 0.0), (3e-3, 0.01)):
                lines.append(dict(base, key=f"m{model}{d}{lr}", task="mqar", task_spec="mqar:cpu", model=model, d_model=d,
                                  lr=lr, acc=min(acc + bump, 1.0), best_val_acc=min(acc + bump, 1.0),  # val tracks test
                                  ci={"acc": [acc - 0.02, acc + 0.02]}, state_floats=floats,
                                  task_config={"T": 64, "N": 4}, task_T=64, task_N=4))
    lines.append(dict(base, key="ind", task="induction", task_spec="t4:cpu", model="attn2-rope", d_model=64, lr=1e-3,
                      acc=0.9, ci={"acc": [0.88, 0.92]}, state_floats=1, task_config={"T": 64},
                      acc_by_length={"128": 0.3, "256": None}))
    for T in (256, 512):
        lines.append(dict(base, key=f"niah{T}", task="niah", task_spec=f"t5:cpu,T={T}", model="attn2-rope", d_model=64,
                          lr=1e-3, acc=0.7, ci={"acc": [0.6, 0.8]}, state_floats=1, task_config={"T": T},
                          acc_by_group={str(d): d / 10 for d in range(11)}, exact_by_group={str(d): d / 10 for d in range(11)}))
    for model, acc in (("attn2-rope", 0.97), ("pgsm-cpu", 1.0)):
        lines.append(dict(base, key=f"t7{model}", task="t7", task_spec="t7:cpu", model=model, d_model=64, lr=2e-3, acc=acc,
                          ci={"acc": [acc - 0.01, acc]}, state_floats=1, task_config={"T": 128, "distance": 96}))
    return lines


def write_fixture(folder: Path) -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "results.jsonl").write_text("".join(json.dumps(x) + "\n" for x in fixture_lines()))
    return folder


def test_report_makes_the_plots_from_a_results_file(tmp_path, capsys):
    folder = write_fixture(tmp_path / "fixture")
    assert cli.main(["bench", "report", str(folder)]) == 0
    text = capsys.readouterr().out
    assert "mqar:cpu" in text and "3.0e-03" in text  # best of lr on validation: the 3e-3 row
    names = {p.name for p in (folder / "plots").iterdir()}
    assert names == {"best_acc.png", "t1_acc_vs_d.png", "t1_acc_vs_state.png", "t4_acc_vs_length.png",
                     "t5_depth_length.png", "t7_acc_vs_distance.png"}
    assert all((folder / "plots" / n).stat().st_size > 5000 for n in names)


def test_reproduce_prints_published_and_ours(tmp_path, capsys):
    folder = write_fixture(tmp_path / "fixture")
    assert cli.main(["bench", "reproduce", "pgsm-distance", "--out", str(folder)]) == 0
    text = capsys.readouterr().out
    row = next(line for line in text.splitlines() if line.startswith("attn2-rope"))
    assert row.split()[1:3] == ["0.998", "0.970"]
    assert cli.main(["bench", "reproduce", "zoology-fig2", "--out", str(folder)]) == 0
    row = next(line for line in capsys.readouterr().out.splitlines() if line.startswith("T64 N4 d64 Hyena"))
    assert row.split()[-3:] == ["0.510", "0.410", "1"]
    assert set(ANCHORS) == {"zoology-fig2", "mamba-table1", "mamba-table11", "pgsm-distance"}


@pytest.mark.parametrize(
    "argv, match",
    [
        (["run", "--tier", "laptop"], "unknown tier 'laptop'; known: cpu-smoke"),
        (["run"], "bench run needs --tier"),
        (["run", "--tier", "cpu-smoke", "--tasks", "sudoku"], "unknown task 'sudoku'; known: "),
        (["run", "--tier", "cpu-smoke", "--models", "gpt5"], "unknown model 'gpt5'; known: attn2-z"),
        (["run", "--tier", "cpu-smoke", "--seeds", "a"], "--seeds must be comma-separated integers"),
        (["reproduce", "mamba-table99"], "unknown anchor 'mamba-table99'; known: zoology-fig2"),
        (["report", "/nonexistent/bench"], "no bench results at"),
    ],
)
def test_expected_failures_print_the_error_and_exit_2(argv, match, capsys):
    assert cli.main(["bench", *argv]) == 2
    err = capsys.readouterr().err
    assert err.startswith("slmlab bench: error: ") and __import__("re").search(match, err)


def test_a_results_file_from_another_schema_is_refused(tmp_path, capsys):
    folder = tmp_path / "old"
    folder.mkdir()
    (folder / "results.jsonl").write_text(json.dumps({"schema": "slmlab-bench/0", "acc": 1.0}) + "\n")
    assert cli.main(["bench", "report", str(folder)]) == 2
    assert "has schema 'slmlab-bench/0', this slmlab reads 'slmlab-bench/1'" in capsys.readouterr().err


def test_task_model_mismatch_is_refused_before_training(tmp_path):
    with pytest.raises(ValueError, match="pgsm-cpu accepts block_size=128 tokens < the task's T=256"):
        run_one(RunPlan("t5:cpu", "pgsm-cpu", 1e-3), "x", tmp_path)
    assert not (tmp_path / "runs").exists()


def test_tiers_filter_by_task_alias_model_and_seed():
    plans = tier_plans("cpu-smoke", tasks=["t1"], models=["attn2-z"], seeds=[0, 1, 2])
    assert [(p.task_name, p.model, p.seed) for p in plans] == [("mqar", "attn2-z", s) for s in (0, 1, 2)]
    assert len({p.key for p in tier_plans("cpu-full")}) == len(tier_plans("cpu-full"))


def test_induction_run_reports_accuracy_by_test_length_and_na_for_learned_positions(tmp_path):
    task = "t4:cpu,n_train=64,n_test=16"
    rope = run_one(RunPlan(task, "attn2-rope", 1e-3, batch_size=8, max_steps=3, max_time=0.0, eval_every=3), "x", tmp_path)
    assert set(rope["acc_by_length"]) == {"128", "256"} and all(0 <= v <= 1 for v in rope["acc_by_length"].values())
    learned = run_one(RunPlan(task, "attn2-z", 1e-3, batch_size=8, max_steps=3, max_time=0.0, eval_every=3), "x", tmp_path)
    assert learned["acc_by_length"] == {"128": None, "256": None}  # a 64-row position table: n/a beyond it
    assert learned["task_variant"] == "segment" and learned["examples"] == 16


def _count_trainers(monkeypatch, on_step):
    """Patch the trainer's step: ``on_step(trainer_number, step)`` runs before each step (1-based numbers)."""
    from slmlab.train.trainer import Trainer

    original, seen = Trainer.train_step, {}

    def step(self, stream):
        seen.setdefault(id(self), len(seen) + 1)
        on_step(seen[id(self)], self.state.step + 1)
        return original(self, stream)

    monkeypatch.setattr(Trainer, "train_step", step)
    return seen


def test_ctrl_c_stops_the_bench_run_records_nothing_for_the_cut_run_and_a_rerun_redoes_it(tmp_path, monkeypatch, capsys):
    def interrupt_second_run(number, step):
        if number == 2 and step == 3:
            raise KeyboardInterrupt

    out = tmp_path / "bench"
    argv = ["bench", "run", "--tier", "micro", "--out", str(out), "--threads", "1"]
    _count_trainers(monkeypatch, interrupt_second_run)
    assert cli.main(argv) == 130  # the CLI's Ctrl-C contract, not 0
    assert [x["model"] for x in read_results(out)] == ["attn2-z"]  # the cut-short run is no result
    assert "interrupted" in capsys.readouterr().err

    monkeypatch.undo()
    seen = _count_trainers(monkeypatch, lambda number, step: None)
    assert cli.main(argv) == 0
    assert len(seen) == 1 and "1 of 2 runs already in" in capsys.readouterr().out  # only the cut run is redone
    lines = read_results(out)
    assert [x["model"] for x in lines] == ["attn2-z", "shortconv4"] and lines[1]["steps"] == 5 and lines[1]["complete"]


def test_a_diverged_run_is_recorded_with_its_step_and_reported_as_diverged(tmp_path, monkeypatch, capsys):
    from slmlab.train.trainer import TrainingDiverged

    def diverge_first_run(number, step):
        if number == 1 and step == 4:
            raise TrainingDiverged("loss became nan at step 4; training stopped before applying that update.")

    out = tmp_path / "bench"
    _count_trainers(monkeypatch, diverge_first_run)
    assert cli.main(["bench", "run", "--tier", "micro", "--out", str(out), "--threads", "1"]) == 0
    diverged, fine = read_results(out)
    assert diverged["model"] == "attn2-z" and diverged["complete"] is False and diverged["diverged_step"] == 4
    assert diverged["stop"].startswith("diverged at step 4 of 5") and diverged["acc"] is None
    assert fine["complete"] is True and fine["diverged_step"] is None
    capsys.readouterr()
    assert cli.main(["bench", "run", "--tier", "micro", "--out", str(out)]) == 0  # an outcome: not rerun
    assert "2 of 2 runs already in" in capsys.readouterr().out
    assert cli.main(["bench", "report", str(out)]) == 0
    text = capsys.readouterr().out
    row = next(x for x in text.splitlines() if "attn2-z" in x and "ar:cpu" in x)
    assert "diverged at step 4" in row and " — " in row  # no figure for it


def test_early_stop_acc_zero_trains_past_the_solved_threshold_and_keys_the_run_apart():
    """A claim of "accuracy >= 0.99" needs runs that do not stop the moment validation passes 0.99 (they
    would score ~0.99 on test by construction): ``early_stop_acc: 0`` turns the stop off, the run's key
    says so (a default run's key is unchanged), its config carries it, and ``ending`` reads a run that
    passed 0.99 without stopping as stopped by the step budget, not as solved."""
    from types import SimpleNamespace

    from slmlab.bench.run import ending, plan_run_config

    default = RunPlan("mqar:cpu", "attn2-z", 1e-3, max_steps=100)
    off = RunPlan("mqar:cpu", "attn2-z", 1e-3, max_steps=100, early_stop_acc=0.0)
    assert default.key == "mqar:cpu|attn2-z|lr=0.001|seed=0|b=64|steps=100|eval=313|scored"  # as before the field
    assert off.key == default.key + "|early_stop=0"
    assert plan_run_config(default, Path("x"), "cpu").early_stop_acc == 0.99
    assert plan_run_config(off, Path("x"), "cpu").early_stop_acc == 0.0
    passed = SimpleNamespace(step=60, best_step=60, best_acc=0.995, stop_reason="validation accuracy 0.9950 > 0.99")
    assert ending(100, passed)["stop"].startswith("early stop at step 60 of 100")
    finished = SimpleNamespace(step=100, best_step=100, best_acc=0.995, stop_reason="max_steps reached")
    assert ending(100, finished, None, 0.0) == {"complete": True, "stop": "max_steps: 100 of 100 steps",
                                                "diverged_step": None}
    assert not ending(100, passed, None, 0.0)["stop"].startswith("early stop")


def test_a_tier_file_sets_early_stop_acc(tmp_path):
    tier = tmp_path / "t.yaml"
    tier.write_text("tier: t\ngroups:\n  - {tasks: [mqar:cpu], models: [attn2-z], lrs: [1.0e-3], seeds: [0], max_steps: 10, early_stop_acc: 0}\n")
    (plan,) = tier_plans(str(tier))
    assert plan.early_stop_acc == 0 and plan.key.endswith("|early_stop=0")
