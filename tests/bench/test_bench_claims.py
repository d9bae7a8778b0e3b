"""Claims with seeds: three seeds by default, the learning rate chosen on validation (never on test), a
confidence interval across seeds and examples, diverged and incomplete runs shown and never averaged in."""

from __future__ import annotations

import numpy as np
import pytest

import slmlab.models  # noqa: F401  (registers the families)
from slmlab import cli
from slmlab.bench.report import best_of_lr, format_table
from slmlab.bench.run import SCHEMA
from slmlab.bench.stats import bootstrap_ci, example_counts, seed_example_ci
from slmlab.bench.tier_file import load_tier_file, tier_plans


def counts_for(acc: float, n: int = 400, seed: int = 0) -> list[list[int]]:
    """``example_counts`` of ``n`` examples with 4 scored positions each and about ``acc`` of them right."""
    rng = np.random.default_rng(seed)
    correct = rng.binomial(4, acc, size=n)
    return example_counts(correct, np.full(n, 4))


def line(model="attn2-z", lr=1e-3, seed=0, acc=0.5, val=0.5, **extra) -> dict:
    counts = extra.pop("example_counts") if "example_counts" in extra else counts_for(acc, seed=seed)
    base = dict(schema=SCHEMA, key=f"{model}|{lr}|{seed}", task="mqar", task_spec="mqar:cpu", tier="x", model=model,
                d_model=64, lr=lr, seed=seed, params_total=1000, params_nonembedding=500, state_floats=10, n_layers=2,
                batch_size=8, train_on="scored", steps=100, max_steps=100, max_time=0.0, wall_s=1.0, tokens_seen=6400,
                stop_reason="max_steps reached", stop="max_steps: 100 of 100 steps", complete=True, diverged_step=None,
                acc=acc, token_acc=acc, exact=acc, ci=None if acc is None else {"acc": [acc - 0.02, acc + 0.02]}, examples=400,
                example_counts=counts, best_step=100, best_val_acc=val, task_config={"T": 64, "N": 4})
    return {**base, **extra}


def test_tier_files_default_to_three_seeds_and_the_check_tiers_say_one(tmp_path, capsys):
    path = tmp_path / "bench-mine.yaml"
    path.write_text("groups: [{tasks: [t7:cpu], models: [attn2-z], lrs: [1.0e-3, 3.0e-3], max_steps: 10}]\n")
    _, _, plans = load_tier_file(path)
    assert [(p.lr, p.seed) for p in plans] == [(lr, s) for lr in (1e-3, 3e-3) for s in (0, 1, 2)]
    assert {p.seed for p in tier_plans("cpu-full")} == {0, 1, 2}
    assert {p.seed for p in tier_plans("micro")} == {p.seed for p in tier_plans("cpu-smoke")} == {0}  # checks
    assert cli.main(["bench", "run", "--tier", str(path), "--dry-run"]) == 0
    assert "6 runs" in capsys.readouterr().out
    assert cli.main(["bench", "run", "--tier", str(path), "--seeds", "4", "--dry-run"]) == 0
    assert "2 runs" in capsys.readouterr().out


def test_the_best_lr_is_chosen_on_validation_never_on_test():
    # lr 3e-3 has the better test accuracy but the worse validation accuracy: 1e-3 is the one chosen
    lines = [line(lr=1e-3, seed=s, acc=0.5, val=0.9) for s in (0, 1, 2)]
    lines += [line(lr=3e-3, seed=s, acc=0.8, val=0.6) for s in (0, 1, 2)]
    (row,) = best_of_lr(lines)
    assert row["best_lr"] == 1e-3 and row["acc"]["mean"] == pytest.approx(0.5)
    assert row["by_lr"]["0.001"]["val"] == pytest.approx(0.9) and row["by_lr"]["0.003"]["test"] == pytest.approx(0.8)


def test_a_row_gives_per_seed_values_and_an_interval_across_seeds_and_examples():
    lines = [line(seed=s, acc=a, val=a) for s, a in ((0, 0.4), (1, 0.6), (2, 0.8))]
    (row,) = best_of_lr(lines)
    assert row["acc"]["values"] == [0.4, 0.6, 0.8] and row["acc"]["n"] == 3 and row["claim"]
    assert row["ci"] == seed_example_ci([x["example_counts"] for x in lines])
    lo, hi = row["ci"]
    assert lo < 0.5 and hi > 0.7  # the seeds' spread, not one seed's examples
    text = format_table([row])
    assert "0.400, 0.600, 0.800" in text and f"[{lo:.3f}, {hi:.3f}]" in text


def test_seed_example_ci_is_seeded_and_reduces_to_the_example_bootstrap_for_one_seed():
    one = counts_for(0.7, n=800)
    a = seed_example_ci([one])
    assert a == seed_example_ci([one])
    correct = np.repeat([c for c, _, n in one], [n for _, _, n in one])
    scored = np.repeat([s for _, s, n in one], [n for _, _, n in one])
    lo, hi = bootstrap_ci(correct, scored)["acc"]
    assert abs(a[0] - lo) < 0.01 and abs(a[1] - hi) < 0.01
    same = seed_example_ci([one, one, one])
    spread = seed_example_ci([counts_for(0.3, n=800), one, counts_for(0.95, n=800)])
    assert same[1] - same[0] < a[1] - a[0] < spread[1] - spread[0]
    assert seed_example_ci([None, None], values=[0.2, 0.4]) == pytest.approx([0.2, 0.4])  # seeds only


def test_fewer_than_three_seeds_is_flagged_as_not_a_claim():
    (row,) = best_of_lr([line(seed=0, acc=0.9, val=0.9)])
    assert not row["claim"]
    text = format_table([row])
    assert "fewer than 3 seeds" in text and "*" in next(x for x in text.splitlines() if "attn2-z" in x)


def test_diverged_and_incomplete_runs_are_shown_not_averaged():
    lines = [line(lr=1e-3, seed=s, acc=0.5, val=0.5) for s in (0, 1, 2)]
    # lr 3e-3: seed 1 diverged, so its better seeds do not make it the best lr
    lines += [line(lr=3e-3, seed=s, acc=0.9, val=0.9) for s in (0, 2)]
    lines.append(line(lr=3e-3, seed=1, acc=None, val=0.1, complete=False, diverged_step=17, example_counts=None,
                      stop="diverged at step 17 of 100: loss became nan", ci=None))
    # lr 1e-2: one seed stopped by the time cap: skipped, flagged
    lines.append(line(lr=1e-2, seed=0, acc=0.99, val=0.99, complete=False, stop="max_time safety cap at step 40 of 100"))
    (row,) = best_of_lr(lines)
    assert row["best_lr"] == 1e-3 and row["acc"]["values"] == [0.5, 0.5, 0.5]
    assert row["diverged"] == [{"lr": 3e-3, "seed": 1, "step": 17}]
    assert row["incomplete"] == 1 and "0.01" not in row["by_lr"]
    assert row["by_lr"]["0.003"]["diverged"] == 1
    text = format_table([row])
    assert "lr 0.003 seed 1 diverged at step 17" in text and "1 incomplete" in text


def test_old_lines_without_the_complete_field_are_judged_by_their_stop_reason():
    old = [line(seed=0, acc=0.3, val=0.3, stop_reason="time budget of 240 s reached"),
           line(model="shortconv4", seed=0, acc=0.1, val=0.1, stop_reason="validation accuracy 0.9938 > 0.99")]
    for x in old:
        for key in ("complete", "stop", "diverged_step", "example_counts", "max_steps", "max_time", "tokens_seen"):
            x.pop(key)
    rows = best_of_lr(old)
    assert [r["model"] for r in rows if r["acc"] is not None] == ["shortconv4"]
    assert next(r for r in rows if r["model"] == "attn2-z")["incomplete"] == 1


# -- the claims' verdict rules (issue 33): every number that decides a verdict ----------------------------------


def claim_rows(model, ci, seeds=3, task_spec="ar:cpu", model_config=None, mean=None, counts=None):
    """A ``best_of_lr`` row for the verdict rules: an interval, its seeds, optionally example counts."""
    mean = (ci[0] + ci[1]) / 2 if mean is None else mean
    lines = [{"example_counts": counts or counts_for(mean, seed=s)} for s in range(seeds)]
    return {"task": task_spec.split(":")[0], "task_spec": task_spec, "model": model, "model_config": model_config or {},
            "acc": {"mean": mean, "values": [mean] * seeds, "n": seeds}, "ci": list(ci), "best_lr": 3e-3,
            "steps": 100, "seeds": list(range(seeds)), "lines": lines}


def test_interval_rules_decide_holds_refuted_and_undecided():
    from slmlab.bench.claims import HOLDS, REFUTED, SOLVED, UNDECIDED, VERDICTS, above, below, below_strict, combine

    assert SOLVED == 0.95 and VERDICTS == ("holds", "refuted", "undecided at this budget")
    assert above([0.95, 1.0], SOLVED) == HOLDS and above([0.90, 0.949], SOLVED) == REFUTED
    assert above([0.94, 0.99], SOLVED) == UNDECIDED
    assert below([0.0, 0.05], 0.05) == HOLDS and below([0.051, 0.2], 0.05) == REFUTED and below([0.04, 0.06], 0.05) == UNDECIDED
    assert below_strict([0.5, 0.949], SOLVED) == HOLDS and below_strict([0.95, 1.0], SOLVED) == REFUTED
    assert below_strict([0.9, 0.96], SOLVED) == UNDECIDED
    assert combine([HOLDS, HOLDS]) == HOLDS and combine([HOLDS, UNDECIDED, REFUTED]) == REFUTED
    assert combine([HOLDS, UNDECIDED]) == UNDECIDED and combine([]) == UNDECIDED


def test_t2_separation_rule_and_its_no_read_level():
    from slmlab.bench.claims import (
        HOLDS,
        REFUTED,
        SHORT_CONV_WINDOW,
        T2_ATTENTION,
        UNDECIDED,
        decide_t2,
        t2_no_read_level,
    )

    assert t2_no_read_level() == 1 / 19 and SHORT_CONV_WINDOW == 4 * (3 - 1) + 1 and T2_ATTENTION == ("attn2-z",)
    solved, conv = claim_rows("attn2-z", [0.997, 1.0]), claim_rows("shortconv4", [0.045, 0.060])
    assert decide_t2([solved, conv]).word == HOLDS
    assert decide_t2([solved, claim_rows("shortconv4", [0.0530, 0.07])]).word == REFUTED  # above 1/19: a leak
    assert decide_t2([claim_rows("attn2-z", [0.40, 0.99]), conv]).word == UNDECIDED
    assert decide_t2([claim_rows("attn2-z", [0.30, 0.40]), conv]).word == REFUTED
    few = decide_t2([claim_rows("attn2-z", [0.997, 1.0], seeds=2), conv])
    assert few.word == UNDECIDED and "fewer than 3" in few.lines[0]
    assert decide_t2([conv]).word == UNDECIDED


def test_acceptance_rule_reads_r1_r2_r3_on_cpu_full_rows():
    from slmlab.bench.claims import CLAIMS, HOLDS, R1_SOLVED, R2_AT_MOST, REFUTED, T7_CHANCE, UNDECIDED, claims_for
    from slmlab.bench.claims import decide_acceptance as decide

    assert (R1_SOLVED, R2_AT_MOST, T7_CHANCE) == (0.99, 0.05, 1 / 64) and CLAIMS["acceptance"].tier == "cpu-full"
    assert [c.name for c in claims_for([{"tier": "cpu-full"}])] == ["acceptance"]
    good = {"t1": claim_rows("attn2-z", [0.991, 0.996], task_spec="mqar:cpu"),
            "t7": claim_rows("attn2-rope", [0.995, 1.0], task_spec="t7:cpu"),
            "conv": claim_rows("shortconv4", [0.01, 0.04], task_spec="mqar:cpu"),
            "noret": claim_rows("pgsm-cpu-noret", [0.006, 0.024], task_spec="t7:cpu"),
            "t2": claim_rows("attn2-z", [0.997, 1.0]), "t2conv": claim_rows("shortconv4", [0.045, 0.060])}
    verdict = decide(list(good.values()))
    assert verdict.word == HOLDS and [x[:2] for x in verdict.lines] == ["R1", "R1", "R2", "R2", "R3", "R3", "R4"]
    # R1 at 0.986 [0.980, 0.992] straddles 0.99; R2 on T1 at 0.072 [0.064, 0.080] is above 0.05 (the old cpu-full
    # reading of shortconv4 at lr 3e-3); the conv-only PGSM reaching only down to 0.02 > 1/64 reads a stored pair
    for key, row, word in [("t1", claim_rows("attn2-z", [0.980, 0.992], task_spec="mqar:cpu"), UNDECIDED),
                           ("conv", claim_rows("shortconv4", [0.064, 0.080], task_spec="mqar:cpu"), REFUTED),
                           ("noret", claim_rows("pgsm-cpu-noret", [0.02, 0.04], task_spec="t7:cpu"), REFUTED),
                           ("t7", claim_rows("attn2-rope", [0.995, 1.0], task_spec="t7:cpu", seeds=2), UNDECIDED)]:
        rows = {**good, key: row}
        assert decide(list(rows.values())).word == word, key
    missing = decide([r for k, r in good.items() if k != "noret"])
    assert missing.word == UNDECIDED and "R2: pgsm-cpu-noret on t7:cpu: no complete run" in missing.lines


def test_r1_t1_budget_claim_reads_r1_on_t1_at_twice_cpu_full_steps():
    from slmlab.bench.claims import CLAIMS, HOLDS, REFUTED, UNDECIDED, claims_for, decide_r1_t1

    assert [c.name for c in claims_for([{"tier": "claim-r1-t1-budget"}])] == ["r1-t1-budget"]
    plans = tier_plans("claim-r1-t1-budget")
    full = [p for p in tier_plans("cpu-full") if p.task == "mqar:cpu" and p.model == "attn2-z"]
    # twice the first cpu-full's fixed 1,565 steps, where seed 0 sat on the plateau: cpu-full's ceiling now
    assert {p.max_steps for p in plans} == {full[0].max_steps} == {2 * 1565}
    assert sorted({(p.lr, p.seed) for p in plans}) == sorted({(p.lr, p.seed) for p in full})
    assert {(p.batch_size, p.eval_every) for p in plans} == {(p.batch_size, p.eval_every) for p in full}
    # 0.990 is in (the spec's >= 0.99); the cpu-full reading 0.744 [0.246, 0.995] is undecided; 0.98 is out
    for ci, word in [([0.990, 0.999], HOLDS), ([0.246, 0.995], UNDECIDED), ([0.970, 0.989], REFUTED)]:
        verdict = decide_r1_t1([claim_rows("attn2-z", ci, task_spec="mqar:cpu"), claim_rows("shortconv4", [0, 0.01])])
        assert verdict.word == word and verdict.lines[0].startswith("R1: attn2-z on mqar:cpu >= 0.99: ")
    assert decide_r1_t1([claim_rows("attn2-z", [0.995, 1.0], task_spec="mqar:cpu", seeds=2)]).word == UNDECIDED
    assert CLAIMS["r1-t1-budget"].decide([]).word == UNDECIDED


def test_retrieval_dim_rule_at_the_reduced_and_the_full_size():
    from slmlab.bench.claims import (
        CLAIMS,
        HOLDS,
        PGSM_CPU_CLAIMED,
        PGSM_GPU_CLAIMED,
        REFUTED,
        UNDECIDED,
        decide_retrieval_dim,
    )
    from slmlab.bench.models import MODELS
    from slmlab.data.tasks import parse_task_spec
    from slmlab.models.registry import get_family

    # the CPU claim is the seed's setting divided by 8
    preset = get_family("pgsm").presets["pgsm-small"]
    assert PGSM_GPU_CLAIMED == preset["retrieval_dim"] == 512 and PGSM_CPU_CLAIMED == 512 // 8
    cpu, full = MODELS["pgsm-rd-cpu"].config, MODELS["pgsm-small"]
    assert (cpu["dim"], cpu["hidden"], cpu["block_size"]) == (preset["dim"] // 8, preset["hidden"] // 8, 1024 // 8)
    assert all(cpu[k] == preset[k] for k in ("layers", "kernel_size", "retrieval_heads"))
    small, reduced = parse_task_spec("t7:gpu"), parse_task_spec("t7:cpu,D=8")
    assert (reduced.T, reduced.distance, reduced.D) == (small.T // 8, small.distance // 8, small.D) == (128, 96, 8)
    plans = tier_plans("claim-pgsm-retrieval-dim", seeds=[0])
    assert sorted(dict(p.model_config)["retrieval_dim"] for p in plans) == [rd // 8 for rd in (64, 128, 256, 512, 768)]
    gpu = tier_plans("gpu-claims", seeds=[0])
    assert sorted({dict(p.model_config)["retrieval_dim"] for p in gpu if p.model == full.id}) == [64, 128, 256, 512, 768]
    assert {p.task for p in gpu if p.model == full.id} == {"t7:gpu"}
    assert CLAIMS["pgsm-retrieval-dim"].tier == "claim-pgsm-retrieval-dim" and CLAIMS["pgsm-retrieval-dim-gpu"].tier == "gpu-claims"

    decide = decide_retrieval_dim(64, "t7:cpu,D=8", "pgsm-rd-cpu")

    def sweep(intervals):
        return [claim_rows("pgsm-rd-cpu", ci, task_spec="t7:cpu,D=8", model_config={"retrieval_dim": rd})
                for rd, ci in intervals.items()]

    weak, strong = [0.1, 0.3], [0.97, 1.0]
    assert decide(sweep({8: weak, 16: weak, 32: [0.5, 0.9], 64: strong, 96: strong})).word == HOLDS
    assert decide(sweep({8: weak, 16: weak, 32: strong, 64: strong})).word == REFUTED  # a smaller one is strong
    assert decide(sweep({8: weak, 32: weak, 64: [0.6, 0.8], 96: strong})).word == REFUTED  # first strong is larger
    assert decide(sweep({8: weak, 32: [0.9, 0.97], 64: strong})).word == UNDECIDED
    assert decide(sweep({8: weak, 32: weak})).word == UNDECIDED  # the claimed one not run
    nothing = decide(sweep({8: weak, 32: weak, 64: weak, 96: weak}))  # no swept value strong: the budget is short
    assert nothing.word == UNDECIDED and "no swept retrieval_dim is strong" in nothing.lines[-1]
    assert decide(sweep({8: weak, 32: weak, 64: [0.9, 0.99], 96: strong})).word == UNDECIDED


def test_xsa_rule_reads_the_gain_and_its_growth_with_intervals():
    from slmlab.bench.claims import HOLDS, REFUTED, UNDECIDED, XSA_SPECS, decide_xsa
    from slmlab.data.tasks import parse_task_spec

    assert [parse_task_spec(s).T for s in XSA_SPECS] == [16, 32, 64]
    decide = decide_xsa(("a:cpu", "b:cpu"), "m")

    def arms(acc):  # {(spec, flag): accuracy} -> rows with 400 examples per seed
        return [claim_rows("m", [a - 0.01, a + 0.01], task_spec=spec, model_config={"use_xsa": flag}, mean=a,
                           counts=counts_for(a, n=400, seed=int(flag)))
                for (spec, flag), a in acc.items()]

    grows = arms({("a:cpu", False): 0.5, ("a:cpu", True): 0.5, ("b:cpu", False): 0.3, ("b:cpu", True): 0.6})
    verdict = decide(grows)
    assert verdict.word == HOLDS and "growth of the gain from a:cpu to b:cpu: +0.300" in verdict.lines[-1]
    shrinks = arms({("a:cpu", False): 0.3, ("a:cpu", True): 0.6, ("b:cpu", False): 0.5, ("b:cpu", True): 0.5})
    assert decide(shrinks).word == REFUTED
    flat = arms({("a:cpu", False): 0.5, ("a:cpu", True): 0.5, ("b:cpu", False): 0.5, ("b:cpu", True): 0.51})
    assert decide(flat).word == UNDECIDED
    assert decide(grows[:3]).word == UNDECIDED  # an arm missing


def test_contrast_ci_of_two_arms_is_the_interval_of_their_difference():
    from slmlab.bench.stats import contrast_ci

    a, b = [counts_for(0.3, n=800, seed=s) for s in range(3)], [counts_for(0.7, n=800, seed=s) for s in range(3)]
    lo, hi = contrast_ci([b, a], [1.0, -1.0])
    assert lo < 0.4 < hi and lo > 0.3 and hi < 0.5
    assert contrast_ci([b, a], [1.0, -1.0]) == [lo, hi]  # seeded
    same = contrast_ci([a, a, a, a], [1.0, -1.0, -1.0, 1.0])
    assert same[0] < 0 < same[1]


def test_r1_t1_claim_trains_to_a_plateau_without_the_early_stop():
    """The claim-r1-t1 tier is cpu-full's T1 (64, 4) group for attn2-z with the bench's early stop at 0.99
    off (a run stopped when validation passes 0.99 scores ~0.99 on test by construction, which kept the
    budget claim undecided) and a plateau stop instead; the verdict is decide_r1_t1's."""
    from slmlab.bench.claims import CLAIMS, claims_for, decide_r1_t1

    assert [c.name for c in claims_for([{"tier": "claim-r1-t1"}])] == ["r1-t1"]
    assert CLAIMS["r1-t1"].decide is decide_r1_t1
    plans = tier_plans("claim-r1-t1")
    full = [p for p in tier_plans("cpu-full") if p.task == "mqar:cpu" and p.model == "attn2-z"]
    assert sorted({(p.lr, p.seed, p.batch_size, p.eval_every) for p in plans}) == sorted(
        {(p.lr, p.seed, p.batch_size, p.eval_every) for p in full})
    assert {(p.early_stop_acc, p.patience, p.max_steps) for p in plans} == {(0, 1252, 6260)}


def test_a_rerun_under_another_budget_replaces_the_earlier_line_and_a_seed_counts_once():
    from slmlab.bench.pages import results_page

    first = [line(seed=s, acc=0.2, val=0.2, key=f"attn2-z|{s}|patience=1000") for s in (0, 1, 2)]
    rerun = line(seed=0, acc=0.9, val=0.9, key="attn2-z|0|patience=2000")
    (row,) = best_of_lr([*first, rerun])
    assert row["acc"]["n"] == 3 and row["acc"]["values"] == [0.9, 0.2, 0.2]  # seed 0 once: its later line
    assert row["acc"]["mean"] == pytest.approx(1.3 / 3)
    page = results_page([*first, rerun], "x")
    assert "(4 lines; tier x; 3 of 3 runs complete; 1 earlier lines replaced by a later run" in page
    assert "replaced" not in results_page(first, "x")  # a page without reruns reads as it did
