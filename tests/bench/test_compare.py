"""``slmlab compare``: budget fitting for every family, the generic cache size, bad input, and the
comparison end to end (report, resume, ``--report-only``, a failing family, overhead)."""

from __future__ import annotations

import json
import re

import pytest
import torch

import slmlab  # noqa: F401  (registers the families)
from slmlab.bench.compare import cache_growth, parse_budget, split_specs
from slmlab.bench.models import cache_nbytes, prefill_cache
from slmlab.cli import main
from slmlab.models.budget import non_embedding_parameters
from slmlab.models.registry import families, get_family

TASK = "t7:cpu,n_train=512"


# -- budget fitting ----------------------------------------------------------------------------


@pytest.mark.parametrize("name", sorted(families()))
def test_fit_budget_within_ten_percent_and_monotone(name):
    fam = get_family(name)
    counts = []
    for budget in (200_000, 500_000, 2_000_000):
        overrides = fam.fit_budget(budget, tie_word_embeddings=True)
        count = non_embedding_parameters(fam, overrides)  # the family's audit on the meta device
        if budget in (200_000, 2_000_000):
            assert abs(count - budget) <= 0.10 * budget, (name, budget, count)
        counts.append(count)
    assert counts == sorted(counts) and len(set(counts)) == len(counts), (name, counts)


def test_fit_budget_keeps_base_fields_and_ties():
    fam = get_family("neollm")  # untied by default; the comparison ties it
    overrides = fam.fit_budget(200_000, tie_word_embeddings=True, vocab_size=300)
    assert overrides["tie_word_embeddings"] is True and overrides["vocab_size"] == 300
    config = fam.make_config(None, **overrides)
    assert config.hidden_size == config.num_attention_heads * config.head_dim  # H*D = d
    assert config.use_hadamard_o_proj == (config.hidden_size & (config.hidden_size - 1) == 0)


@pytest.mark.parametrize("layers, pattern, global_layers", [(4, "LLLG", [3]), (2, "LG", [1]), (1, "G", [0]),
                                                            (5, "LLLLG", [4]), (12, "LLLLG", [4, 9])])
def test_fitted_neollm_has_a_global_layer(layers, pattern, global_layers):
    """The default's LLLLG at 4 layers made every layer local (window T/8): the 200k compare's NeoLLM sat at
    chance on T2 (0.053). The rule cuts the pattern so the last of up to five layers is global."""
    fam = get_family("neollm")
    overrides = fam.fit_budget(200_000, tie_word_embeddings=True, num_hidden_layers=layers)
    config = fam.make_config(None, **overrides)
    assert config.iha_local_global_pattern == pattern
    kinds = [config.iha_kind(i) for i in range(layers)]
    assert [i for i, kind in enumerate(kinds) if kind != "local"] == global_layers


def test_fit_budget_below_minimum_names_family_and_minimum():
    with pytest.raises(ValueError, match=r"below neollm's smallest valid config \([\d,]+ non-embedding"):
        get_family("neollm").fit_budget(1_000)


def test_parse_budget_and_specs():
    assert parse_budget("2M") == 2_000_000 and parse_budget("200k") == 200_000
    assert parse_budget("1500000") == 1_500_000 and parse_budget("1.5M") == 1_500_000
    for bad in ("2 million", "", "-3k", "0.5"):
        with pytest.raises(ValueError, match="2M, 1.5M, 200k or 1500000"):
            parse_budget(bad)
    assert split_specs("t7:cpu,n_train=512,mqar:cpu") == ["t7:cpu,n_train=512", "mqar:cpu"]
    assert split_specs("shakespeare") == ["shakespeare"]


# -- the generic cache size --------------------------------------------------------------------


def _tiny(name: str, **overrides):
    fam = get_family(name)
    torch.manual_seed(0)
    return fam.model_class(fam.make_config(None, **overrides)).eval()


def test_generic_cache_size_agrees_with_nanohammer_cache_nbytes():
    from slmlab.models.nanohammer import cache_nbytes as nanohammer_nbytes

    model = _tiny("nanohammer", vocab_size=64, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                  num_attention_heads=4, num_key_value_heads=2, num_state_heads=4, state_hidden_size=16,
                  bos_token_id=None, eos_token_id=None)
    for T in (9, 24):
        assert cache_nbytes(model, T) == nanohammer_nbytes(prefill_cache(model, T))["filled"]


def test_generic_cache_size_agrees_with_a_hand_count_of_lumen_kv():
    layers, kv_heads, head_dim = 3, 2, 8
    model = _tiny("lumen", vocab_size=64, hidden_dim=32, num_layers=layers, num_heads=4, num_kv_heads=kv_heads,
                  intermediate_dim=48)
    per_token = 2 * layers * kv_heads * head_dim * 4  # K and V, fp32
    assert cache_nbytes(model, 20) == 20 * per_token
    growth = cache_growth(model, (10, 30))
    assert growth["cache_bytes_per_token"] == per_token and growth["cache_bytes_constant"] == 0


# -- bad input ---------------------------------------------------------------------------------


@pytest.mark.parametrize("args, message", [
    (["--models", "lumen,mamba"], r"unknown family 'mamba'; registered families: .*lumen.*pgsm"),
    (["--models", "neollm", "--budget", "1k"], r"below neollm's smallest valid config .*--budget \d+k or more"),
    (["--budget", "2 million"], r"malformed --budget '2 million'; write a count such as 2M, 1.5M, 200k or 1500000"),
    (["--models", "pgsm", "--set", "pgsm.block_size=64"],
     r"pgsm accepts block_size=64 tokens but t7:cpu,n_train=512 has sequences of 128"),
    (["--models", "lumen", "--set", "lumen.vocab_size=100"], r"fixed vocab_size=100 but t7:cpu,n_train=512 needs 256"),
])
def test_bad_input_exits_2_before_training(args, message, tmp_path, capsys, monkeypatch):
    import slmlab.train.run as run

    monkeypatch.setattr(run, "build_trainer", lambda *a, **k: pytest.fail("trained despite bad input"))
    argv = ["compare", "--budget", "30k", "--tasks", TASK, "--steps", "2", "--out", str(tmp_path / "c")]
    code = main(argv + args)
    err = capsys.readouterr().err
    assert code == 2, err
    assert err.startswith("slmlab compare: error: ") and ";" in err
    assert re.search(message, err), err


# -- end to end --------------------------------------------------------------------------------


def _compare(out, *extra, steps=20, budget="30k", batch=32, seeds="0"):
    return main(["compare", "--models", "lumen,pgsm", "--budget", budget, "--tasks", TASK, "--steps", str(steps),
                 "--lrs", "3e-3", "--batch-size", str(batch), "--seeds", seeds, "--threads", "1", "--out", str(out),
                 *extra])


@pytest.mark.slow
def test_compare_end_to_end_report_and_report_only(tmp_path, capsys):
    out = tmp_path / "cmp"
    assert _compare(out, budget="500k", batch=64) == 0
    printed = capsys.readouterr().out
    assert "run 1 of 2: lumen, t7:cpu,n_train=512, lr 0.003, seed 0" in printed
    assert "run 2 of 2: pgsm" in printed and "ETA" in printed
    lines = [json.loads(x) for x in (out / "results.jsonl").read_text().splitlines()]
    assert [x["model"] for x in lines] == ["lumen", "pgsm"] and all(x["status"] == "ok" for x in lines)
    for x in lines:
        assert x["steps"] == 20 and 0.0 <= x["acc"] <= 1.0 and len(x["ci"]["acc"]) == 2
        assert x["params_total"] == x["params_nonembedding"] + x["params_embedding"]
        assert abs(x["params_nonembedding"] - 500_000) <= 50_000
        assert x["train_tokens_per_s"] > 0 and x["decode_tokens_per_s"] > 0 and x["cache_bytes_per_token"] > 0
    summary = (out / "summary.md").read_text()
    assert re.search(r"^\| lumen \| [\d,]+ / [\d,]+ \| 0.003 \|", summary, re.M)
    assert re.search(r"^\| pgsm \| [\d,]+ / [\d,]+ \| 0.003 \|", summary, re.M)
    pngs = sorted(p.name for p in out.glob("*.png"))
    assert pngs == ["acc_vs_cache.png", "learning_curves.png", "t7_acc_by_distance.png", "val_loss_vs_tokens.png"]
    assert all((out / p).stat().st_size > 1000 for p in pngs)
    configs = json.loads((out / "fitted_configs.json").read_text())
    assert set(configs["models"]) == {"lumen", "pgsm"} and configs["tied"] is True

    share = float(re.search(r"compare overhead: .* = [\d.]+ s, ([\d.]+)% of the runs'", printed).group(1))
    assert share <= 5.0, printed

    before = {p: (out / p).read_bytes() for p in ("summary.md", "fitted_configs.json")}
    for p in ("summary.md", "fitted_configs.json", *pngs):
        (out / p).unlink()
    assert main(["compare", "--report-only", str(out)]) == 0
    assert {p: (out / p).read_bytes() for p in before} == before
    assert sorted(p.name for p in out.glob("*.png")) == pngs


def test_interrupted_compare_resumes_without_repeating_finished_runs(tmp_path, monkeypatch, capsys):
    from slmlab.train.trainer import Trainer

    calls = []
    original = Trainer.train

    def interrupted_second(self):
        calls.append(self.cfg.model)
        if len(calls) == 2:
            raise KeyboardInterrupt
        return original(self)

    out = tmp_path / "cmp"
    monkeypatch.setattr(Trainer, "train", interrupted_second)
    assert _compare(out, steps=3) == 130
    assert [json.loads(x)["model"] for x in (out / "results.jsonl").read_text().splitlines()] == ["lumen"]

    calls.clear()
    monkeypatch.setattr(Trainer, "train", lambda self: calls.append(self.cfg.model) or original(self))
    assert _compare(out, steps=3) == 0
    assert calls == ["pgsm"]
    assert "1 of 2 runs already in" in capsys.readouterr().out
    assert [json.loads(x)["model"] for x in (out / "results.jsonl").read_text().splitlines()] == ["lumen", "pgsm"]


def test_a_family_failing_to_build_is_reported_and_the_others_go_on(tmp_path, monkeypatch):
    import slmlab.train.run as run

    original = run.build_model

    def broken_pgsm(cfg, vocab_size, seq_len):
        if cfg.model == "pgsm":
            raise RuntimeError("pgsm exploded while building")
        return original(cfg, vocab_size, seq_len)

    monkeypatch.setattr(run, "build_model", broken_pgsm)
    out = tmp_path / "cmp"
    assert _compare(out, steps=2) == 0
    lines = {x["model"]: x for x in map(json.loads, (out / "results.jsonl").read_text().splitlines())}
    assert lines["lumen"]["status"] == "ok"
    assert lines["pgsm"]["status"] == "failed" and "pgsm exploded" in lines["pgsm"]["error"]
    summary = (out / "summary.md").read_text()
    assert "| pgsm | failed: RuntimeError: pgsm exploded while building |" in summary
    assert re.search(r"^\| lumen \| [\d,]+ / [\d,]+ \| 0.003 \|", summary, re.M)


# -- claims: seeds, lr on validation, diverged runs ---------------------------------------------


def _task_line(model, lr, seed, acc, val, **extra):
    from slmlab.bench.compare import SCHEMA
    from test_bench_claims import counts_for

    return {"schema": SCHEMA, "key": f"{model}|{lr}|{seed}", "model": model, "data": TASK, "kind": "task",
            "task": "t7", "lr": lr, "seed": seed, "status": "ok", "complete": True, "acc": acc, "exact": acc,
            "best_val_acc": val, "ci": {"acc": [acc - 0.01, acc + 0.01]}, "example_counts": counts_for(acc, seed=seed),
            "steps": 20, "max_steps": 20, **extra}


def test_compare_chooses_the_lr_on_validation_and_reports_seeds_with_an_interval():
    from slmlab.bench.compare_report import best_rows

    lines = [_task_line("lumen", 1e-3, s, acc=0.5, val=0.9) for s in (0, 1, 2)]
    lines += [_task_line("lumen", 3e-3, s, acc=0.8, val=0.6) for s in (0, 1, 2)]
    row = best_rows(lines)[(TASK, "lumen")]
    assert row["best_lr"] == 1e-3 and row["summary"]["mean"] == pytest.approx(0.5)  # not test's 3e-3
    assert row["summary"]["values"] == [0.5, 0.5, 0.5] and len(row["ci"]) == 2 and row["selected_on"] == "validation"


def test_compare_defaults_to_three_seeds(tmp_path, monkeypatch):
    import slmlab.bench.compare as compare

    seen = {}

    def fake(settings, out, log=print):
        seen["seeds"] = settings.seeds
        return {"lines": [], "written": [], "timing": {"fitting_s": 0, "measuring_s": 0, "reporting_s": 0, "runs_s": 0}}

    monkeypatch.setattr(compare, "run_compare", fake)
    assert main(["compare", "--models", "lumen", "--budget", "30k", "--tasks", TASK, "--out", str(tmp_path)]) == 0
    assert seen["seeds"] == (0, 1, 2) and compare.CompareSettings(("lumen",), 1, ("x",)).seeds == (0, 1, 2)


def test_a_diverged_compare_run_is_recorded_with_its_step_shown_and_not_rerun(tmp_path, monkeypatch):
    from slmlab.train.trainer import Trainer, TrainingDiverged

    original, calls = Trainer.train_step, []

    def diverge_pgsm(self, stream):
        if self.cfg.model == "pgsm" and self.state.step == 2:
            raise TrainingDiverged("gradient norm became nan at step 3; training stopped before applying that update.")
        return original(self, stream)

    monkeypatch.setattr(Trainer, "train_step", diverge_pgsm)
    out = tmp_path / "cmp"
    assert _compare(out, steps=4, seeds="0") == 0
    lines = {x["model"]: x for x in map(json.loads, (out / "results.jsonl").read_text().splitlines())}
    assert lines["pgsm"]["status"] == "diverged" and lines["pgsm"]["diverged_step"] == 3
    assert lines["lumen"]["status"] == "ok" and lines["lumen"]["complete"] is True
    summary = (out / "summary.md").read_text()
    assert re.search(r"^\| pgsm \| diverged at step 3 \(lr 0.003, seed 0\)", summary, re.M), summary
    monkeypatch.setattr(Trainer, "train", lambda self: calls.append(self.cfg.model) or pytest.fail("reran"))
    assert _compare(out, steps=4, seeds="0") == 0 and calls == []  # a divergence is an outcome, not retried


# -- the library entries the command calls -----------------------------------------------------------


def test_parse_fixed_reads_values_as_yaml():
    from slmlab.bench.compare import parse_fixed

    assert parse_fixed(["pgsm.block_size=256", "pgsm.tied=true", "lumen.rope_theta=10000.0"]) == {
        "pgsm": {"block_size": 256, "tied": True}, "lumen": {"rope_theta": 10000.0}}
    with pytest.raises(ValueError, match=r"^malformed --set 'pgsm'; write FAMILY.FIELD=VALUE"):
        parse_fixed(["pgsm"])


def test_check_compared_refuses_only_when_every_run_failed(tmp_path):
    from slmlab.bench.compare import check_compared

    failed = {"status": "failed", "model": "pgsm", "error": "boom"}
    check_compared([failed, {"status": "ok"}], tmp_path)
    check_compared([], tmp_path)
    with pytest.raises(ValueError) as err:
        check_compared([failed, failed], tmp_path)
    assert str(err.value) == (f"all 2 runs failed (first: pgsm: boom); each run's error is in {tmp_path}/results.jsonl:"
                              " fix the cause and rerun (failed runs are retried)")


def test_rebuild_report_is_what_report_only_prints(tmp_path, capsys):
    import shutil
    from pathlib import Path

    from slmlab.bench.compare import rebuild_report

    kept = Path(__file__).resolve().parents[2] / "docs" / "results" / "compare-t2-200k"
    shutil.copytree(kept, tmp_path / "a")
    shutil.copytree(kept, tmp_path / "b")
    written = rebuild_report(tmp_path / "a")
    assert main(["compare", "--report-only", str(tmp_path / "b")]) == 0
    assert capsys.readouterr().out == (f"slmlab compare: report rebuilt from {tmp_path / 'b' / 'results.jsonl'}:"
                                       f" {', '.join(p.name for p in written)}\n")
    assert (tmp_path / "a" / "summary.md").read_text() == (kept / "summary.md").read_text()


def test_a_non_finite_value_in_a_result_line_is_written_as_the_outputs_module_writes_it(tmp_path, monkeypatch):
    """NaN and infinities, at the top of a line or nested in it, numpy's too, are written ``null`` by
    :func:`slmlab.outputs.dumps_finite`; numpy integers are ints; the file parses as strict JSON."""
    import numpy as np

    import slmlab.bench.compare as compare
    import slmlab.bench.compare_report as compare_report
    from slmlab.outputs import dumps_finite

    record = {"steps": np.int64(3), "complete": True, "val_loss": float("nan"), "acc": np.float32(0.5),
              "ci": {"acc": [0.25, float("inf")]}, "val_curve": [[1, np.float64("nan"), 0.25], [2, 1.5, 0.5]],
              "train_tokens_per_s": 10.0, "decode_tokens_per_s": float("-inf")}
    monkeypatch.setattr(compare, "run_one", lambda settings, plan, out: (dict(record), 0.0))
    monkeypatch.setattr(compare_report, "write_report", lambda lines, out: [])
    settings = compare.CompareSettings(models=("lumen",), budget=30_000, data=(TASK,), steps=3, lrs=(1e-3,),
                                       seeds=(0,))
    compare.run_compare(settings, tmp_path, log=lambda _: None)
    text = (tmp_path / "results.jsonl").read_text().splitlines()[0]

    def refuse(name):
        raise AssertionError(f"{name} in a result line")

    line = json.loads(text, parse_constant=refuse)
    assert line["val_loss"] is None and line["ci"] == {"acc": [0.25, None]}
    assert line["val_curve"] == [[1, None, 0.25], [2, 1.5, 0.5]] and line["decode_tokens_per_s"] is None
    assert line["acc"] == 0.5 and line["steps"] == 3
    assert text == dumps_finite(line)  # byte for byte what the outputs module writes


def test_the_report_reads_the_last_line_of_each_run_so_a_seed_counts_once():
    from slmlab.bench.compare_report import latest_runs

    lines = [{"data": "d", "model": "m", "lr": 1e-3, "seed": 0, "key": "p1000|0"},
             {"data": "d", "model": "m", "lr": 1e-3, "seed": 1, "key": "p1000|1"},
             {"data": "d", "model": "m", "lr": 3e-3, "seed": 0, "key": "p1000|lr"},
             {"data": "d", "model": "m", "lr": 1e-3, "seed": 0, "key": "p2000|0"}]
    assert latest_runs(lines) == [lines[1], lines[2], lines[3]]
