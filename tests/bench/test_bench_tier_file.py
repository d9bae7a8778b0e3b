"""Tier files: loading, errors, and the built-in tiers (the YAML files in slmlab/bench/tiers/, their one source)."""

from __future__ import annotations

import pytest

from slmlab import cli
from slmlab.bench.run import read_results
from slmlab.bench.suite import RunPlan
from slmlab.bench.tier_file import builtin_tiers, load_tier_file, tier_path, tier_plans


@pytest.mark.parametrize(("tier", "runs", "seeds", "steps"), [
    ("cpu-smoke", 5, 1, 7_884), ("cpu-full", 99, 3, 309_690), ("gpu-paper", 672, 3, 24_239_220), ("micro", 2, 1, 10)])
def test_built_in_tiers_are_their_files(tier, runs, seeds, steps):
    """Each built-in name reads its own file; the counts, seeds and step budgets are the tiers the docs describe."""
    name, description, plans = load_tier_file(tier_path(tier))
    assert list(builtin_tiers()) == ["cpu-smoke", "cpu-full", "gpu-paper", "micro", "ablation-neollm-recall",
                                    "claim-neollm-xsa",
                                    "claim-pgsm-retrieval-dim", "claim-r1-t1", "claim-r1-t1-budget", "claim-t2-separation",
                                    "gpu-claims"]
    assert name == tier and description and tier_path(tier).parent.name == "tiers"
    assert len(plans) == runs == len({p.key for p in plans}) and len({p.seed for p in plans}) == seeds
    assert sum(p.max_steps for p in plans) == steps
    assert tier_plans(tier) == plans


def test_cpu_smoke_tier_values():
    t7 = dict(batch_size=32, max_steps=750, eval_every=250)
    assert set(tier_plans("cpu-smoke")) == {
        RunPlan("mqar:cpu", "attn2-z", 3e-3, eval_every=313, max_steps=4382, max_time=420.0),
        RunPlan("mqar:cpu", "shortconv4", 3e-3, eval_every=313, max_steps=1252, max_time=190.0),
        RunPlan("t7:cpu", "attn2-rope", 2e-3, max_time=420.0, **t7),
        RunPlan("t7:cpu", "pgsm-cpu", 2e-3, max_time=420.0, **t7),
        RunPlan("t7:cpu", "pgsm-cpu-noret", 2e-3, max_time=150.0, **t7)}


def test_bench_list_yaml_prints_the_tier_file(capsys, tmp_path):
    assert cli.main(["bench", "list", "--yaml", "cpu-full"]) == 0
    copy = tmp_path / "mine.yaml"
    copy.write_text(capsys.readouterr().out)
    assert load_tier_file(copy) == load_tier_file(tier_path("cpu-full"))
    assert cli.main(["bench", "list", "--yaml", "nope"]) == 2
    assert "unknown tier 'nope'; known: cpu-smoke, cpu-full, gpu-paper, micro, ablation-neollm-recall, claim-" in capsys.readouterr().err


def test_a_group_is_the_product_of_its_lists_with_its_budget(tmp_path):
    path = tmp_path / "bench-mine.yaml"
    path.write_text(
        "tier: mine\n"
        "defaults: {batch_size: 16}\n"
        "groups:\n"
        "  - {tasks: ['ar:cpu,T=16'], models: [attn2-z, shortconv4], lrs: [1.0e-3, 3.0e-3], seeds: [0], max_steps: 40,\n"
        "     max_time: 30}\n"
        "  - {tasks: [t7:cpu], models: [attn2-rope], lrs: 2.0e-3, seeds: [0, 1], model_config: {d_model: [32, 64]},\n"
        "     train_on: scored, batch_size: 8, max_steps: 20}\n"
    )
    name, _, plans = load_tier_file(path)
    assert name == "mine" and len(plans) == 4 + 4
    assert plans[0] == RunPlan("ar:cpu,T=16", "attn2-z", 1e-3, batch_size=16, max_steps=40, max_time=30.0)
    t7 = plans[4:]
    assert {(p.seed, p.model_config) for p in t7} == {(s, (("d_model", d),)) for s in (0, 1) for d in (32, 64)}
    assert all(p.batch_size == 8 and p.lr == 2e-3 for p in t7)


@pytest.mark.parametrize(
    "text, match",
    [
        ("tier: x\ngroups: []\n", "'groups' must be a non-empty list"),
        ("tier: x\nrunz: 1\ngroups: [{tasks: [t7:cpu], models: [attn2-z], lrs: [1]}]\n", "unknown key 'runz'"),
        ("groups: [{tasks: [t7:cpu], models: [attn2-z], lrs: [1], max_tme: 3}]\n",
         "group 1 has an unknown key 'max_tme'; did you mean 'max_time'"),
        ("groups: [{tasks: [t7:cpu], models: [attn2-z]}]\n", "group 1 needs a non-empty list 'lrs'"),
        ("groups: [{tasks: [sudoku], models: [attn2-z], lrs: [1], max_steps: 9}]\n", "unknown task 'sudoku'; known: "),
        ("groups: [{tasks: [t7:cpu], models: [gpt5], lrs: [1], max_steps: 9}]\n", "unknown model 'gpt5'; known: attn2-z"),
        ("groups: [{tasks: [t7:cpu], models: [attn2-z], lrs: [1], max_steps: 9, train_on: every}]\n",
         "group 1: train_on"),
        ("groups: [{tasks: [t7:cpu]\n", "not valid YAML"),
    ],
)
def test_bad_tier_files_name_the_problem(tmp_path, text, match):
    path = tmp_path / "bad.yaml"
    path.write_text(text)
    with pytest.raises(ValueError, match=match):
        load_tier_file(path)


def test_bench_run_accepts_a_tier_file(tmp_path, capsys):
    path = tmp_path / "bench-tiny.yaml"
    path.write_text("tier: tiny\ngroups:\n  - {tasks: ['ar:cpu,T=16,n_train=64,n_test=32'], models: [attn2-z, shortconv4],"
                    " lrs: [1.0e-3], seeds: [0], batch_size: 8, max_steps: 3, eval_every: 3, max_time: 60}\n")
    assert cli.main(["bench", "run", "--tier", str(path), "--dry-run"]) == 0
    assert "2 runs, 6 steps in all, seeds 0; safety caps (max_time) sum to 2.0 min" in capsys.readouterr().out
    out = tmp_path / "out"
    argv = ["bench", "run", "--tier", str(path), "--models", "shortconv4", "--out", str(out), "--threads", "1"]
    assert cli.main(argv) == 0
    (line,) = read_results(out)
    assert line["tier"] == "tiny" and line["model"] == "shortconv4" and line["steps"] == 3
    assert cli.main(["bench", "run", "--tier", str(tmp_path / "none.yaml")]) == 2
    assert "no tier file" in capsys.readouterr().err
