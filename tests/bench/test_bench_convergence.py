"""The convergence rule (``slmlab.bench.convergence``): values, boundaries, the plateau stop, a row's word."""

from __future__ import annotations

import pytest

from slmlab.bench.convergence import (
    ACC_TOL,
    CONVERGED,
    LOSS_TOL,
    NOT_CONVERGED,
    UNKNOWN,
    Judgement,
    PlateauStop,
    judge,
    line_judgement,
    row_word,
    window,
)


def curve(accs, losses=None, every=10):
    losses = losses or [1.0] * len(accs)
    return [[every * (i + 1), loss, acc] for i, (acc, loss) in enumerate(zip(accs, losses))]


def test_the_tolerances_are_what_the_docs_state():
    assert (ACC_TOL, LOSS_TOL) == (0.01, 0.01)


def test_a_rising_curve_is_not_converged_and_a_flat_one_is():
    rising = curve([0.1, 0.2, 0.3, 0.4, 0.5, 0.6])
    assert judge(rising, 20).word == NOT_CONVERGED
    assert "0.4000 -> 0.6000" in judge(rising, 20).why
    flat = curve([0.1, 0.5, 0.5, 0.5, 0.5, 0.5])
    assert judge(flat, 20).word == CONVERGED


def test_accuracy_gain_boundary_is_strict():
    assert judge(curve([0.5, 0.5, 0.5 + ACC_TOL - 1e-9]), 10).word == CONVERGED
    assert judge(curve([0.5, 0.5, 0.5 + ACC_TOL + 1e-6]), 10).word == NOT_CONVERGED


def test_a_falling_loss_on_an_accuracy_plateau_is_still_improving():
    plateau = curve([1 / 6] * 5, [1.8, 1.7, 1.6, 1.5, 1.4])
    assert judge(plateau, 20).word == NOT_CONVERGED
    assert "loss" in judge(plateau, 20).why
    tiny_fall = curve([1 / 6] * 5, [1.0, 1.0, 1.0, 1.0, 1.0 * (1 - LOSS_TOL) + 1e-6])
    assert judge(tiny_fall, 20).word == CONVERGED


def test_text_curves_have_loss_only():
    assert judge([[10, 3.0, None], [20, 2.0, None], [30, 1.0, None]], 10).word == NOT_CONVERGED
    assert judge([[10, 3.0, None], [20, 1.0, None], [30, 1.0, None]], 10).word == CONVERGED


def test_a_run_shorter_than_its_window_cannot_show_a_plateau():
    short = curve([0.5, 0.5, 0.5], every=2)  # steps 2, 4, 6
    assert judge(short, 6).word == NOT_CONVERGED and "shorter than the 6-step window" in judge(short, 6).why
    assert judge(short, 4).word == CONVERGED  # an evaluation at step 2 = 6 - 4: the window is covered


def test_a_solved_run_is_converged_and_a_missing_curve_is_unknown():
    assert judge(curve([0.1, 0.995]), 1000, solved=True).word == CONVERGED
    assert judge(None, 10).word == UNKNOWN and judge([], 10).word == UNKNOWN


def test_the_window_is_the_patience_or_a_quarter_of_the_ceiling():
    assert window(200, 2000) == 200 and window(0, 2000) == 500 and window(0, 3) == 1


def test_the_plateau_stop_fires_when_the_rule_reads_converged():
    stop = PlateauStop(patience=20, max_steps=1000)
    reasons = [stop.observe(step, {"loss": 1.0, "acc": acc})
               for step, acc in ((10, 0.1), (20, 0.3), (30, 0.3), (40, 0.3), (50, 0.3))]
    assert reasons[:3] == ["", "", ""]  # step 30: the window reaches back to 10, where the best was lower
    assert reasons[3].startswith("validation plateau at step 40 of 1000")
    assert PlateauStop(patience=0, max_steps=10).observe(10, {"loss": 1.0}) == ""


# attn2-rope on the multi-query T2 (ar:cpu, lr 3e-3, seed 2, no plateau stop): validation [step, loss, acc] every
# 157 steps; the loss sits at 1.81 from step 628 to 1,727 on the 1/6 plateau, then the model solves the task
ROPE_T2_SEED2 = [[157, 2.26151, 0.169], [314, 1.89307, 0.16567], [471, 1.83556, 0.16483], [628, 1.81186, 0.15767],
                 [785, 1.81072, 0.17133], [942, 1.80688, 0.17017], [1099, 1.80644, 0.16667],
                 [1256, 1.80756, 0.169], [1413, 1.81542, 0.17267], [1570, 1.80844, 0.166],
                 [1727, 1.81036, 0.18767], [1884, 0.00463, 0.999]]


def _first_plateau_stop(curve, patience):
    stop = PlateauStop(patience=patience, max_steps=4000)
    return next((step for step, loss, acc in curve if stop.observe(step, {"loss": loss, "acc": acc})), None)


def test_the_t2_tiers_patience_outlasts_the_plateau_attention_leaves():
    from slmlab.bench.tier_file import tier_plans

    assert _first_plateau_stop(ROPE_T2_SEED2, 628) == 1256  # four evaluations: stopped at 0.169, called converged
    assert _first_plateau_stop(ROPE_T2_SEED2, 2000) is None  # it runs on and solves T2 at step 1,884
    for tier in ("cpu-full", "claim-t2-separation"):
        assert {p.patience for p in tier_plans(tier) if p.task == "ar:cpu"} == {2000}, tier


def test_compare_waits_half_its_ceiling_and_at_least_the_measured_plateau():
    from slmlab.bench.compare import MIN_PATIENCE, CompareSettings

    def plateau(steps, patience=None):
        return CompareSettings(("lumen",), 1, ("x",), steps=steps, patience=patience).plateau

    assert (plateau(2000), plateau(4000), plateau(10), plateau(4000, 300), plateau(4000, 0)) == (1500, 2000, 1500, 300, 0)
    assert MIN_PATIENCE > 1727 - 314  # the flat stretch of ROPE_T2_SEED2
    assert _first_plateau_stop(ROPE_T2_SEED2, plateau(4000)) is None


@pytest.mark.parametrize("words, expected", [
    ([CONVERGED, CONVERGED], CONVERGED),
    ([CONVERGED, NOT_CONVERGED, NOT_CONVERGED], "not converged (2 of 3 seeds)"),
    ([NOT_CONVERGED], NOT_CONVERGED),
    ([CONVERGED, UNKNOWN], UNKNOWN),
    ([], UNKNOWN),
])
def test_a_row_is_converged_only_when_every_seed_is(words, expected):
    assert row_word([Judgement(w, "") for w in words]) == expected


@pytest.mark.parametrize("seeds, expected", [
    ([(CONVERGED, 0), (NOT_CONVERGED, 4000), (CONVERGED, 4000)], "not converged (1 of 3 seeds, at the 4,000-step ceiling)"),
    ([(NOT_CONVERGED, 10)], "not converged (at the 10-step ceiling)"),
    ([(NOT_CONVERGED, 4000), (NOT_CONVERGED, 0)], "not converged (2 of 2 seeds)"),  # one stopped short of it
    ([(NOT_CONVERGED, 4000), (NOT_CONVERGED, 2000)], "not converged (2 of 2 seeds)"),  # no one ceiling to state
    ([(CONVERGED, 4000), (CONVERGED, 4000)], CONVERGED),  # a converged row names no ceiling
])
def test_a_not_converged_row_states_the_ceiling_its_seeds_ran_to(seeds, expected):
    assert row_word([Judgement(w, "", c) for w, c in seeds]) == expected


def test_a_result_line_carries_its_ceiling_only_when_it_ran_to_it():
    flat = [[s, 1.0, 0.5] for s in range(100, 1100, 100)]
    rising = [[s, 1.0, s / 2000] for s in range(100, 1100, 100)]
    ran_out = {"curve": rising, "steps": 1000, "max_steps": 1000, "patience": 300}
    stopped = {"curve": flat, "steps": 1000, "max_steps": 4000, "patience": 300,
               "stop": "validation plateau at step 1000 of 4000"}
    assert line_judgement(ran_out) == Judgement(NOT_CONVERGED, line_judgement(ran_out).why, 1000)
    assert line_judgement(stopped).ceiling == 0 and line_judgement(stopped).converged
    assert line_judgement({"val_curve": rising, "steps": 1000, "max_steps": 1000}, "val_curve").ceiling == 1000


# -- bench runs on tiny models -----------------------------------------------------------------

TINY_TASK = "ar:cpu,T=16,n_train=64,n_test=32"


def _tier(path, lr: float, max_steps: int, patience: int):
    path.write_text(f"tier: tiny\ngroups:\n  - {{tasks: ['{TINY_TASK}'], models: [attn2-z], lrs: [{lr}], seeds: [0],"
                    f" batch_size: 8, max_steps: {max_steps}, eval_every: 2, patience: {patience}}}\n")
    return path


def test_a_bench_run_that_plateaus_stops_on_its_patience_and_is_converged(tmp_path, capsys):
    from slmlab import cli
    from slmlab.bench.run import read_results

    out = tmp_path / "bench"
    tier = _tier(tmp_path / "plateau.yaml", 1e-9, 200, 4)  # lr 1e-9: nothing moves, a plateau from the start
    assert cli.main(["bench", "run", "--tier", str(tier), "--out", str(out), "--threads", "1"]) == 0
    (line,) = read_results(out)
    assert line["complete"] and line["patience"] == 4 and line["steps"] == 6 < line["max_steps"]
    assert line["stop"].startswith("validation plateau at step 6 of 200")
    assert [p[0] for p in line["curve"]] == [2, 4, 6]
    assert cli.main(["bench", "report", str(out), "--write"]) == 0
    page = (out / "report.md").read_text()
    row = next(x for x in page.splitlines() if "attn2-z" in x)
    assert row.endswith("  converged"), row
    assert "![learning curves](plots/learning_curves.png)" in page
    assert (out / "plots" / "learning_curves.png").stat().st_size > 1000


def test_a_short_bench_run_is_not_converged_on_its_row(tmp_path, capsys):
    from slmlab import cli

    out = tmp_path / "bench"
    tier = _tier(tmp_path / "short.yaml", 3e-3, 10, 20)
    assert cli.main(["bench", "run", "--tier", str(tier), "--out", str(out), "--threads", "1"]) == 0
    assert cli.main(["bench", "report", str(out), "--write"]) == 0
    row = next(x for x in (out / "report.md").read_text().splitlines() if "attn2-z" in x)
    assert row.endswith("  not converged (at the 10-step ceiling)"), row


# -- compare runs on tiny models ---------------------------------------------------------------


def _compare(out, *extra):
    from slmlab.cli import main

    return main(["compare", "--models", "lumen", "--budget", "30k", "--tasks", TINY_TASK, "--batch-size", "8",
                 "--seeds", "0", "--threads", "1", "--out", str(out), *extra])


def _row(summary: str, model: str) -> list[str]:
    return next(x for x in summary.splitlines() if x.startswith(f"| {model} |") and "/" in x).split(" | ")


def test_a_ten_step_compare_writes_not_converged_on_its_rows(tmp_path, capsys):
    out = tmp_path / "cmp"
    assert _compare(out, "--steps", "10", "--lrs", "3e-3") == 0
    summary = (out / "summary.md").read_text()
    assert _row(summary, "lumen")[4] == "not converged (at the 10-step ceiling)"
    assert "a ceiling of 10 steps, stopping on a validation plateau of 1500 steps" in summary  # the default's floor
    assert "![learning_curves](learning_curves.png)" in summary and (out / "learning_curves.png").is_file()
    assert "not converged  steps 10 of 10" in capsys.readouterr().out


def test_a_compare_run_that_plateaus_stops_and_writes_converged(tmp_path, capsys):
    out = tmp_path / "cmp"
    assert _compare(out, "--steps", "200", "--patience", "4", "--eval-every", "2", "--lrs", "1e-9") == 0
    summary = (out / "summary.md").read_text()
    row = _row(summary, "lumen")
    assert row[4] == "converged" and int(row[8]) == 6, row  # stopped at step 6 of the 200-step ceiling


def test_a_claim_verdict_line_carries_its_rows_convergence_word():
    from slmlab.bench.claims import _acc_text

    row = {"acc": {"mean": 0.5, "values": [0.4, 0.5, 0.6]}, "ci": [0.4, 0.6], "best_lr": 1e-3, "steps": 100,
           "seeds": [0, 1, 2], "convergence": "not converged (1 of 3 seeds)"}
    assert _acc_text(row).endswith("100 steps of seed 0; not converged (1 of 3 seeds))")


def test_a_long_panel_title_is_wrapped_at_its_commas_and_a_short_one_kept():
    from slmlab.bench.plots import TITLE_WIDTH, wrapped_title

    short = "ar:cpu | neollm-200k[use_xsa=False]"
    assert wrapped_title(short) == short
    switches = ",".join(f"switch_{i}=False" for i in range(20))
    long = f"ar:cpu | neollm-200k[{switches}]"
    lines = wrapped_title(long).split("\n")
    assert len(lines) > 1 and all(len(line) <= TITLE_WIDTH for line in lines)
    assert "".join(lines).replace(" ", "") == long.replace(" ", "")  # nothing lost, only spaces added


# -- a longer patience: carrying the runs it would not have stopped -------------------------------


def test_the_rule_is_monotone_in_its_window():
    """What carrying rests on: a plateau over W steps is a plateau over any shorter window, so a longer
    patience never stops a run sooner than a shorter one did, nor where the shorter one did not."""
    import random

    rng = random.Random(0)
    for _ in range(300):
        points, loss, acc = [], 3.0, 0.05
        for step in range(25, 2025, 25):
            loss *= 1 - max(0.0, rng.gauss(0.002, 0.01))
            acc = min(1.0, acc + max(0.0, rng.gauss(0.0, 0.01)) * (rng.random() < 0.3))
            points.append([step, round(loss, 5), round(acc, 5)])
        short, long_ = sorted(rng.sample(range(25, 1500, 25), 2))
        for end in range(1, len(points) + 1):
            if judge(points[:end], long_).converged:
                assert judge(points[:end], short).converged
        first = {w: _first_plateau_stop(points, w) for w in (short, long_)}
        if first[long_] is not None:
            assert first[short] is not None and first[short] <= first[long_]


@pytest.mark.parametrize("line, patience, expected", [
    ({"patience": 1000, "stop_reason": "max_steps reached"}, 2000, True),
    ({"patience": 1000, "stop_reason": "validation accuracy 0.9930 > 0.99"}, 2000, True),
    ({"patience": 1000, "stop_reason": "max_steps reached"}, 0, True),  # 0: no plateau stop, the longest
    ({"patience": 1000, "stop_reason": "validation plateau at step 3500 of 4000: ..."}, 2000, False),
    ({"patience": 2000, "stop_reason": "max_steps reached"}, 1000, False),  # shorter: it may stop sooner
    ({"patience": 0, "stop_reason": "max_steps reached"}, 2000, False),  # ran without a stop: one may fire
    ({"stop_reason": "max_steps reached"}, 2000, False),
    ({"patience": 1000, "stop_reason": "max_steps reached"}, 1000, False),  # the same key: nothing to carry
])
def test_a_run_carries_to_a_longer_patience_only_when_the_plateau_did_not_stop_it(line, patience, expected):
    from slmlab.bench.convergence import carries_to

    assert carries_to(line, patience) is expected


def _two_run_tier(path, patience: int):
    """lr 1e-9: a plateau from the start (stopped at step 6 under patience 4); lr 3e-3: runs to its ceiling."""
    path.write_text(f"tier: tiny\ngroups:\n  - {{tasks: ['{TINY_TASK}'], models: [attn2-z], lrs: [1.0e-9, 3.0e-3],"
                    f" seeds: [0], batch_size: 8, max_steps: 12, eval_every: 2, patience: {patience}}}\n")
    return path


def test_a_longer_patience_carries_the_runs_it_would_not_stop_and_retrains_the_rest(tmp_path, capsys):
    from slmlab import cli
    from slmlab.bench.run import read_results

    out = tmp_path / "bench"
    assert cli.main(["bench", "run", "--tier", str(_two_run_tier(tmp_path / "p4.yaml", 4)), "--out", str(out),
                     "--threads", "1"]) == 0
    first = {line["lr"]: line for line in read_results(out)}
    assert first[1e-9]["steps"] == 6 and first[3e-3]["steps"] == 12  # a plateau stop; the ceiling
    capsys.readouterr()
    assert cli.main(["bench", "run", "--tier", str(_two_run_tier(tmp_path / "p8.yaml", 8)), "--out", str(out),
                     "--threads", "1"]) == 0
    assert "1 of 2 runs carried over from a shorter patience" in capsys.readouterr().out
    lines = read_results(out)
    assert len(lines) == 4
    carried, rerun = lines[2], lines[3]
    assert carried["lr"] == 3e-3 and carried["carried_from"] == first[3e-3]["key"]
    assert carried["patience"] == 8 and carried["key"].endswith("|patience=8")
    assert rerun["lr"] == 1e-9 and "carried_from" not in rerun and rerun["steps"] == 10  # trained again, longer
    # the carried line is the run a patience of 8 makes: trained afresh, the same steps, curve and scores
    fresh_out = tmp_path / "fresh"
    tier = tmp_path / "fresh.yaml"
    tier.write_text(_two_run_tier(tmp_path / "x.yaml", 8).read_text().replace("lrs: [1.0e-9, 3.0e-3]", "lrs: [3.0e-3]"))
    assert cli.main(["bench", "run", "--tier", str(tier), "--out", str(fresh_out), "--threads", "1"]) == 0
    (fresh,) = read_results(fresh_out)
    for field in ("key", "steps", "curve", "acc", "ci", "best_step", "best_val_acc", "stop", "patience"):
        assert carried[field] == fresh[field], field
    # the page reads one line per run: the later one, each seed once
    assert cli.main(["bench", "report", str(out), "--write"]) == 0
    page = (out / "report.md").read_text()
    assert "2 of 2 runs complete; 2 earlier lines replaced by a later run" in page
    from slmlab.bench.report import best_of_lr

    (row,) = best_of_lr(lines)
    assert row["by_lr"]["1e-09"]["n"] == 1 and row["by_lr"]["0.003"]["n"] == 1
    assert {x["patience"] for x in row["lines"]} == {8}


def test_a_compare_rerun_with_a_longer_patience_carries_its_unstopped_runs(tmp_path, capsys):
    from slmlab.bench.compare import read_lines

    out = tmp_path / "cmp"
    assert _compare(out, "--steps", "10", "--patience", "4", "--eval-every", "2", "--lrs", "3e-3") == 0
    (first,) = read_lines(out / "results.jsonl")
    assert first["steps"] == 10 and first["val_curve"][-1][0] == 10  # it ran to the ceiling
    capsys.readouterr()
    assert _compare(out, "--steps", "10", "--patience", "8", "--eval-every", "2", "--lrs", "3e-3") == 0
    assert "1 of 1 runs carried over" in capsys.readouterr().out
    lines = read_lines(out / "results.jsonl")
    assert len(lines) == 2 and lines[1]["carried_from"] == first["key"]
    assert lines[1]["patience"] == 8 and lines[1]["settings"]["patience"] == 8 and "patience=8" in lines[1]["key"]
    summary = (out / "summary.md").read_text()
    assert "stopping on a validation plateau of 8 steps" in summary
    assert "1 earlier lines in results.jsonl were replaced by a later run" in summary
    assert "," not in _row(summary, "lumen")[3].split("; ")[1]  # "mean; per-seed values": one seed, once
    from slmlab.bench.compare_report import best_rows, latest_runs

    (row,) = best_rows(latest_runs(lines)).values()
    assert [r["key"] for r in row["runs"]] == [lines[1]["key"]]
    assert len(best_rows(lines)[(TINY_TASK, "lumen")]["runs"]) == 2  # what reading every line did
