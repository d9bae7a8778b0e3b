"""The NeoLLM recall ablation tier (issue 45.3): its rows are NeoLLM's defaults, each default switched to its
plain twin once, and all at once; every row builds and trains at toy size."""

from __future__ import annotations

import dataclasses

import pytest

from slmlab.bench.tier_file import tier_plans

TIER = "ablation-neollm-recall"


def rows() -> list[dict]:
    """The tier's model_config of each row, in order (seed 0)."""
    return [dict(p.model_config) for p in tier_plans(TIER, seeds=[0])]


def test_the_ablation_has_defaults_single_switches_and_all_at_once():
    from slmlab.models.neollm import NeoLLMConfig

    configs = rows()
    plans = tier_plans(TIER)
    assert len(configs) == 15 and len(plans) == 45 and {p.seed for p in plans} == {0, 1, 2}
    assert all(p.model == "neollm-200k" and p.task == "ar:cpu" and p.patience == 1000 and p.max_steps == 4000
               for p in plans)
    assert configs[0] == {}
    defaults = NeoLLMConfig()
    for config in configs[1:]:
        changed = {k for k, v in config.items() if getattr(defaults, k) != v}
        assert changed == set(config), f"{config}: a switch that is already the default"
    singles = configs[1:-1]
    union = {k: v for c in singles if "iha_local_global_pattern" not in c for k, v in c.items()}
    assert configs[-1] == union  # all at once: every plain twin together
    assert len({tuple(sorted(c)) for c in singles}) == len(singles)  # each switch once


def test_the_ablation_model_is_neollm_fitted_at_200k_as_compare_fits_it():
    import json
    from pathlib import Path

    from slmlab.bench.models import MODELS

    kept = Path(__file__).resolve().parents[2] / "docs" / "results" / "compare-t2-200k" / "fitted_configs.json"
    fitted = json.loads(kept.read_text())["models"]["neollm"]["overrides"]
    entry = MODELS["neollm-200k"]
    assert {k: entry.config[k] for k in fitted} == fitted
    assert entry.config["use_spelling_bee_embeddings"] is False


@pytest.mark.parametrize("index", range(15))
def test_every_ablation_row_trains_at_toy_size(index, tmp_path):
    from slmlab.bench.run import run_one

    plan = tier_plans(TIER, seeds=[0])[index]
    toy = dataclasses.replace(plan, task=f"{plan.task},n_train=64,n_test=32", batch_size=8, max_steps=2,
                              eval_every=2)
    line = run_one(toy, TIER, tmp_path)
    assert line["complete"] and line["steps"] == 2 and 0.0 <= line["acc"] <= 1.0
    assert line["params_nonembedding"] > 100_000 and line["model_config"] == dict(plan.model_config)
