"""The benchmark suite's entry points (:mod:`slmlab.bench.api`): each returns the text ``slmlab bench``
prints for the same action, and refuses what the command refuses."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from slmlab import cli
from slmlab.bench import api
from slmlab.bench.run import read_results

KEPT = Path(__file__).resolve().parents[2] / "docs" / "results" / "bench-cpu-full"


def printed(capsys, argv: list[str]) -> str:
    assert cli.main(argv) == 0
    return capsys.readouterr().out


def test_select_plans_filters_by_text_or_list_and_replaces_the_safety_cap():
    name, plans = api.select_plans("micro")
    assert name == "micro" and [p.model for p in plans] == ["attn2-z", "shortconv4"]
    assert all(p.max_time == 60 for p in plans)
    _, one = api.select_plans("micro", models="shortconv4", seeds="0", max_time=0)
    assert one == api.select_plans("micro", models=["shortconv4"], seeds=[0], max_time=0)[1]
    assert [(p.model, p.max_time) for p in one] == [("shortconv4", 0.0)]
    _, seeded = api.select_plans("cpu-smoke", tasks="mqar", seeds="0,1")
    assert sorted({p.seed for p in seeded}) == [0, 1] and {p.task_name for p in seeded} == {"mqar"}


@pytest.mark.parametrize("kwargs, message", [
    ({"max_time": -1.0}, "--max-time must be >= 0 seconds, got -1.0; 0 removes the safety cap"),
    ({"seeds": "a"}, "--seeds must be comma-separated integers, got 'a'; e.g. --seeds 0,1,2"),
    ({"tasks": "mqar"}, "tier micro has no run for tasks='mqar' models=None; see `slmlab bench list`"),
])
def test_select_plans_refusals(kwargs, message):
    with pytest.raises(ValueError) as err:
        api.select_plans("micro", **kwargs)
    assert str(err.value) == message


def test_plan_summary_is_the_dry_run(capsys):
    _, plans = api.select_plans("micro", max_time=30)
    text = api.plan_summary(plans)
    assert printed(capsys, ["bench", "run", "--tier", "micro", "--max-time", "30", "--dry-run"]) == text + "\n"
    assert text.splitlines()[-1] == "2 runs, 10 steps in all, seeds 0; safety caps (max_time) sum to 1.0 min"


def test_catalogue_and_tier_yaml_are_bench_list(capsys):
    text = api.catalogue()
    assert printed(capsys, ["bench", "list"]) == text + "\n"
    assert text.startswith("tiers:\n  cpu-smoke ") and "\nanchors (slmlab bench reproduce NAME):\n" in text
    assert printed(capsys, ["bench", "list", "--yaml", "micro"]) == api.tier_yaml("micro")
    assert api.tier_yaml("micro").startswith("# slmlab bench run --tier micro")


def test_report_lines_and_reproduce_are_what_the_command_prints(tmp_path, capsys):
    folder = tmp_path / KEPT.name  # the page names its folder
    shutil.copytree(KEPT, folder)
    lines = list(api.report_lines(folder, write=True))
    assert lines[-1].startswith("plot: ") and f"page: {folder / 'report.md'}" in lines
    assert (folder / "report.md").read_text() == (KEPT / "report.md").read_text()
    assert printed(capsys, ["bench", "report", str(folder), "--write"]) == "\n".join(lines) + "\n"
    table = api.reproduce("pgsm-distance", folder)
    assert printed(capsys, ["bench", "reproduce", "pgsm-distance", "--out", str(folder)]) == table + "\n"
    assert table.splitlines()[0].startswith("T7 prototype")
    with pytest.raises(ValueError, match="^unknown anchor 'nope'; known: zoology-fig2, "):
        api.reproduce("nope", folder)


def test_run_tier_returns_the_lines_it_writes(tmp_path, capsys):
    out = tmp_path / "bench"
    records = api.run_tier("micro", out, models="shortconv4", log=lambda _: None)
    assert capsys.readouterr().out == ""  # the log went where it was sent
    assert [r["model"] for r in records] == ["shortconv4"]
    assert read_results(out) == [json.loads(json.dumps(r)) for r in records]
    assert api.run_tier("micro", out, models="shortconv4", log=lambda _: None) == []  # finished: not rerun
