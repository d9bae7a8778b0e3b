"""The NeoLLM recall ablation tier (issue 45.3): its rows are NeoLLM's defaults, each default switched to its
plain twin once, all at once, all at once but Spelling Bee, all at once with the output head untied, and the
defaults with the head untied (NeoLLM's own default; the compare ties it); every row builds and trains at toy size."""

from __future__ import annotations

import dataclasses

import pytest

from slmlab.bench.tier_file import tier_plans

TIER = "ablation-neollm-recall"


def rows() -> list[dict]:
    """The tier's model_config of each row, in order (seed 0)."""
    return [dict(p.model_config) for p in tier_plans(TIER, seeds=[0])]


def test_the_ablation_has_defaults_single_switches_and_all_at_once():
    from slmlab.bench.models import MODELS
    from slmlab.models.neollm import NeoLLMConfig

    configs = rows()
    plans = tier_plans(TIER)
    assert len(configs) == 19 and len(plans) == 57 and {p.seed for p in plans} == {0, 1, 2}
    assert all(p.model == "neollm-200k" and p.task == "ar:cpu" and p.patience == 2000 and p.max_steps == 4000
               for p in plans)
    assert configs[0] == {}
    built = NeoLLMConfig(**MODELS["neollm-200k"].config)  # the model every row switches from (tied, as compared)
    for config in configs[1:]:
        changed = {k for k, v in config.items() if getattr(built, k) != v}
        assert changed == set(config), f"{config}: a switch that is already the default"
    singles = configs[1:-4]
    union = {k: v for c in singles if "iha_local_global_pattern" not in c for k, v in c.items()}
    assert configs[-4] == union  # all at once: every plain twin together
    spelling = "use_spelling_bee_embeddings"
    assert spelling in union and configs[-3] == {k: v for k, v in union.items() if k != spelling}  # ... but Spelling Bee
    assert built.tie_word_embeddings and configs[-2] == {**union, "tie_word_embeddings": False}  # ... head untied
    assert configs[-1] == {"tie_word_embeddings": False} and not NeoLLMConfig().tie_word_embeddings  # defaults, untied
    assert len({tuple(sorted(c)) for c in singles}) == len(singles)  # each switch once


def test_the_ablation_model_is_neollm_fitted_at_200k_as_compare_fits_it():
    import json
    from pathlib import Path

    from slmlab.bench.models import MODELS

    kept = Path(__file__).resolve().parents[2] / "docs" / "results" / "compare-t2-200k" / "fitted_configs.json"
    fitted = json.loads(kept.read_text())["models"]["neollm"]["overrides"]
    entry = MODELS["neollm-200k"]
    assert {k: entry.config[k] for k in fitted} == fitted
    assert "use_spelling_bee_embeddings" not in entry.config  # every default on, as the compare trained it


def test_the_ablation_defaults_row_is_the_model_the_compare_trained():
    """Spelling Bee on a task is not inert: the compare's NeoLLM spells id k as byte k (its byte
    table has 256 x 32 = 8,192 parameters), and the bench builds it the same way."""
    import json
    from pathlib import Path

    import torch

    from slmlab.bench.models import build_model, count_parameters

    kept = Path(__file__).resolve().parents[2] / "docs" / "results" / "compare-t2-200k" / "results.jsonl"
    compare = next(json.loads(line) for line in kept.read_text().splitlines() if '"model": "neollm"' in line)
    model = build_model("neollm-200k", 40, 32, {}, seed=0)
    assert count_parameters(model) == (compare["params_total"], compare["params_nonembedding"]) == (200_862, 199_582)
    bee = model.model.spelling_bee
    assert bool(bee.table_ready) and bee.byte_len[:40].tolist() == [1] * 40
    assert bee.byte_ids[:40, 0].tolist() == list(range(40))  # id k spells as byte k
    off = build_model("neollm-200k", 40, 32, {"use_spelling_bee_embeddings": False}, seed=0)
    assert count_parameters(model)[1] - count_parameters(off)[1] == 256 * 32
    ids = torch.tensor([[3, 7, 11]])
    with torch.no_grad():  # the byte table is a live part of every id's embedding: the switch is not inert
        before = model.model.embed(ids).clone()
        for p in bee.parameters():
            p.add_(1.0)
        assert (model.model.embed(ids) - before).abs().min() > 1e-3


@pytest.mark.parametrize("index", range(19))
def test_every_ablation_row_trains_at_toy_size(index, tmp_path):
    from slmlab.bench.run import run_one

    plan = tier_plans(TIER, seeds=[0])[index]
    toy = dataclasses.replace(plan, task=f"{plan.task},n_train=64,n_test=32", batch_size=8, max_steps=2,
                              eval_every=2)
    line = run_one(toy, TIER, tmp_path)
    assert line["complete"] and line["steps"] == 2 and 0.0 <= line["acc"] <= 1.0
    assert line["params_nonembedding"] > 100_000 and line["model_config"] == dict(plan.model_config)
