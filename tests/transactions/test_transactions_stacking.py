"""Stacking (HGB-rolling + sequence score + customer-embedding PCA), the prefix customer embedding, the
label-fraction fine-tuning and the usefulness criteria in the evaluation report."""

from __future__ import annotations

import json

import numpy as np
import pytest
import torch

pytest.importorskip("pandas")
pytest.importorskip("sklearn")

from slmlab.cli import main  # noqa: E402
from slmlab.transactions.data.bank import export, label_customers, prepare_bank  # noqa: E402
from slmlab.transactions.evaluation.evaluate import evaluate_models, usefulness_criteria  # noqa: E402
from slmlab.transactions.evaluation.score import PrefixEmbedding, prefix_mean, score_bank, score_embed_bank  # noqa: E402
from slmlab.transactions.evaluation.stacking import (  # noqa: E402
    PCA_COMPONENTS,
    pca_features,
    stacked_scores,
    training_period_rows,
)
from slmlab.transactions.heads.fraud import TransactionFraudModel  # noqa: E402
from slmlab.transactions.model import TxnEncoderConfig, preset_schema  # noqa: E402
from slmlab.transactions.training import finetune  # noqa: E402

STEPS = ["max_steps=2", "batch_size=8", "progress=false", "device=cpu"]


@pytest.fixture(scope="module")
def model(bank):
    torch.manual_seed(0)
    return TransactionFraudModel(TxnEncoderConfig.from_preset("lfm2_tiny", schema=bank.fitted)).eval()


@pytest.fixture(scope="module")
def few(bank_data):
    """A 12-customer bank: cheap enough to score twice."""
    tx = bank_data.transactions
    return prepare_bank(tx[tx.customer_id.isin([f"C{i:06d}" for i in range(12)])], preset_schema("lfm2_tiny"),
                        bank_data.customers)


# -- the customer embedding before each transaction -------------------------------------------------------
def test_prefix_mean_by_hand():
    states = torch.randn(2, 5, 3)
    mask = torch.tensor([[False, True, True, False, True], [True, True, True, True, True]])
    got = prefix_mean(states, mask)
    for b in range(2):
        for t in range(5):
            prev = [states[b, u] for u in range(t) if mask[b, u]]
            want = torch.stack(prev).mean(0) if prev else torch.zeros(3)
            torch.testing.assert_close(got[b, t], want, rtol=1e-5, atol=1e-6)


def test_prefix_embedding_ignores_the_transaction_itself_and_later_ones(few, model):
    scores, emb = score_embed_bank(model, few)
    rows = np.flatnonzero(few.df["customer_id"].to_numpy() == few.df["customer_id"].iloc[0])
    r = rows[len(rows) // 2]  # a transaction in the middle of the first customer's history
    rng = np.random.default_rng(0)
    changed = few.ids.copy()
    for later in rows[rows >= r]:  # new values for t's own fields (response code included) and every later one
        changed[later] = rng.integers(4, 8, changed.shape[1]).astype(changed.dtype)
    assert (changed[r] != few.ids[r]).any()
    other = type(few)(few.df, changed, few.fitted, few.cuts, few.customers, few.holdout)
    s2, e2 = score_embed_bank(model, other)
    np.testing.assert_allclose(e2[rows[rows <= r]], emb[rows[rows <= r]], rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(s2[rows[rows < r]], scores[rows[rows < r]], rtol=1e-5, atol=1e-6)
    assert np.abs(e2[r + 1] - emb[r + 1]).max() > 1e-4  # the next transaction does see t
    assert np.abs(s2[r] - scores[r]) > 0  # t's score reads t's fields


def test_score_embed_bank_scores_equal_the_streaming_scorer(few, model):
    scores, emb = score_embed_bank(model, few)
    np.testing.assert_allclose(scores, score_bank(model, few), rtol=1e-5, atol=1e-6)
    assert emb.shape == (len(few.df), model.config.backbone_config().hidden_size) and not np.isnan(emb).any()
    norms = np.linalg.norm(emb, axis=1)
    first = np.r_[True, few.df["customer_id"].to_numpy()[1:] != few.df["customer_id"].to_numpy()[:-1]]
    np.testing.assert_allclose(norms[first], 0.0, atol=1e-6)  # nothing before a customer's first transaction
    np.testing.assert_allclose(norms[~first], 1.0, rtol=1e-5)


def test_prefix_embedding_uses_a_trained_customer_head():
    from slmlab.transactions.heads.customer import CustomerEmbeddingConfig, CustomerEmbeddingModel

    cfg = CustomerEmbeddingConfig.from_preset("lfm2_tiny", customer_dim=8)
    cust = CustomerEmbeddingModel(cfg)
    hidden, mask = torch.randn(2, 4 * 15, 64), torch.ones(2, 4, dtype=torch.bool)
    out = PrefixEmbedding(cust)(hidden, mask, 15)
    want = torch.nn.functional.normalize(cust.customer_head.proj(prefix_mean(hidden[:, 14::15], mask)), dim=-1)
    assert out.shape == (2, 4, 8)
    torch.testing.assert_close(out, want, rtol=1e-5, atol=1e-6)
    assert PrefixEmbedding(TransactionFraudModel(cfg))(hidden, mask, 15).shape == (2, 4, 64)


# -- PCA and the stacked booster ------------------------------------------------------------------------
def test_pca_is_fitted_on_training_rows_only():
    rng = np.random.default_rng(0)
    emb = rng.normal(size=(300, 24))
    fit = np.zeros(300, bool)
    fit[:200] = True
    base = pca_features(emb, fit)
    moved = emb.copy()
    moved[200:] = rng.normal(size=(100, 24)) * 10  # test rows far outside the training range
    again = pca_features(moved, fit)
    np.testing.assert_allclose(again[:200], base[:200], rtol=1e-5, atol=1e-8)
    moved_fit = emb.copy()
    moved_fit[:50] *= 5
    assert np.abs(pca_features(moved_fit, fit)[200:] - base[200:]).max() > 1e-3  # fit rows do shape it
    assert base.shape == (300, PCA_COMPONENTS)
    with pytest.raises(ValueError, match="PCA needs"):
        pca_features(emb[:, :8], fit)


def test_stacking_end_to_end_on_the_tiny_bank(bank, model, tmp_path, monkeypatch):
    from slmlab.transactions.evaluation import baseline

    monkeypatch.setitem(baseline.HGB_PARAMS, "max_iter", 30)  # the wiring, not the fit, is under test here
    scores, emb = score_embed_bank(model, bank)
    stacked, info = stacked_scores(bank, scores, emb)
    assert set(stacked) == {"stacked", "stacked_val"}
    for name, s in stacked.items():
        assert s.shape == (len(bank.df),) and not np.isnan(s).any() and ((s >= 0) & (s <= 1)).all()
        cols = info[name]["features"]
        assert "seq_score" in cols and [c for c in cols if c.startswith("cust_pc")] == \
            [f"cust_pc{k:02d}" for k in range(PCA_COMPONENTS)]
        assert "count_24h" in cols  # the rolling features are kept
    assert info["stacked"]["fit_rows"] > 5 * info["stacked_val"]["fit_rows"] > 0
    assert training_period_rows(bank).sum() >= info["stacked"]["fit_rows"]
    with pytest.raises(ValueError, match="one row per bank row"):
        stacked_scores(bank, scores[:10], emb)


@pytest.mark.slow
def test_stacking_in_the_report_with_paired_differences(bank, model, tmp_path, monkeypatch):
    from slmlab.transactions.evaluation import baseline

    monkeypatch.setitem(baseline.HGB_PARAMS, "max_iter", 30)
    result = evaluate_models(bank, model, tmp_path, n_boot=20, stacking=True)
    assert {"stacked", "stacked_val", "sequence"} <= set(result["models"])
    saved = json.loads((tmp_path / "metrics.json").read_text())
    diff = saved["bootstrap"]["stacked - hgb_rolling"]
    assert set(diff) >= {"pr_auc", "mean", "recall_at_fpr_0.1pct", "recall_mean"}
    assert diff["pr_auc"][0] <= diff["pr_auc"][1] and diff["recall_at_fpr_0.1pct"][0] <= diff["recall_at_fpr_0.1pct"][1]
    names = [c["criterion"] for c in saved["criteria"]]
    assert names == ["1 parity", "2 useful (stacked)", "2 useful (stacked_val)", "3 strong"]
    report = (tmp_path / "report.md").read_text()
    assert "| 2 useful (stacked) |" in report and (tmp_path / "pr_curve.png").is_file()
    with pytest.raises(ValueError, match="stacking needs"):
        evaluate_models(bank, None, None, n_boot=2, stacking=True)


def test_criteria_rules_on_hand_made_results():
    def res(a, b, ra=0.5, rb=0.5, ci=(0.01, 0.1)):
        models = {"hgb_rolling": {"pr_auc": b, "recall_at_fpr_0.1pct": rb},
                  "stacked": {"pr_auc": a, "recall_at_fpr_0.1pct": ra}}
        boot = {"stacked - hgb_rolling": {"pr_auc": list(ci), "recall_at_fpr_0.1pct": [0.0, 0.1]}}
        return {"models": models, "bootstrap": boot}

    def verdict(r):
        return usefulness_criteria(r)[0]["verdict"]

    # decided on the CIs (the recall CI here is [0.0, 0.1], straddling its +0.05), not on the point differences
    assert verdict(res(0.64, 0.60, ci=(0.031, 0.1))) == "met"  # the PR-AUC CI above +0.03
    assert verdict(res(0.64, 0.60)) == "undecided"  # +0.04, but the CI [0.01, 0.1] straddles +0.03
    assert verdict(res(0.62, 0.60, ra=0.56, ci=(-0.01, 0.02))) == "undecided"  # the recall CI straddles +0.05
    assert usefulness_criteria({"models": {}, "bootstrap": {}}) == []


# -- fine-tuning with a fraction of the labels ------------------------------------------------------------
def test_label_customers_share_and_determinism():
    custs = [f"C{i:04d}" for i in range(1000)]
    a = label_customers(custs, 0.1, seed=0)
    assert len(a) == 100 and a <= set(custs)
    assert a == label_customers(list(reversed(custs)) + custs[:5], 0.1, seed=0)  # order and repeats do not matter
    assert a != label_customers(custs, 0.1, seed=1)
    assert label_customers(custs, 1.0) == set(custs) and len(label_customers(custs[:3], 0.1)) == 1
    for bad in (0.0, -0.1, 1.5, float("nan")):
        with pytest.raises(ValueError, match=r"label fraction must be in \(0, 1\]"):
            label_customers(custs, bad)


def test_finetune_label_fraction_keeps_only_the_drawn_customers(bank, tmp_path):
    trainer = finetune(bank, tmp_path / "ft", None, overrides=STEPS, label_fraction=0.25)
    w = trainer.source.windows["train"]
    cust = set(bank.df["customer_id"].astype(str).to_numpy()[w.rows[w.txn_mask]])
    train_custs = set(bank.df["customer_id"].astype(str)[training_period_rows(bank)])
    drawn = label_customers(train_custs, 0.25, seed=0)
    assert cust <= drawn and len(cust) >= 0.9 * len(drawn) and len(drawn) == round(0.25 * len(train_custs))
    full = finetune(bank, tmp_path / "full", None, overrides=STEPS).source.windows["train"]
    assert 0.15 * len(full) < len(w) < 0.35 * len(full)
    again = finetune(bank, tmp_path / "again", None, overrides=STEPS, label_fraction=0.25).source.windows["train"]
    np.testing.assert_array_equal(again.rows, w.rows)  # deterministic


def test_cli_bad_input(bank_data, tmp_path, capsys):
    export(bank_data, tmp_path / "bank", "parquet")
    common = ["--data", str(tmp_path / "bank"), "--threads", "1", "--device", "cpu"]
    cases = [
        (["evaluate", *common, "--out", str(tmp_path / "r"), "--stacking"], "--stacking needs --model"),
        (["evaluate", *common, "--out", str(tmp_path / "r"), "--label-fraction", "0.1"], "go together"),
        (["evaluate", *common, "--out", str(tmp_path / "r"), "--label-fraction", "1.5", "--encoder", "x"],
         "label fraction must be in"),
        (["finetune", *common, "--out", str(tmp_path / "f"), "--label-fraction", "0", *STEPS],
         "label fraction must be in"),
    ]
    for argv, msg in cases:
        assert main(["transactions", *argv]) == 2
        err = capsys.readouterr().err
        assert "slmlab transactions: error:" in err and msg in err


@pytest.mark.slow
def test_cli_stacking_and_label_fraction_end_to_end(bank_data, tmp_path):
    export(bank_data, tmp_path / "bank", "parquet")
    common = ["--data", str(tmp_path / "bank"), "--threads", "1", "--device", "cpu"]
    assert main(["transactions", "pretrain", *common, "--out", str(tmp_path / "pre"), *STEPS]) == 0
    assert main(["transactions", "finetune", *common, "--encoder", str(tmp_path / "pre"), "--out",
                 str(tmp_path / "ft"), "--label-fraction", "0.5", *STEPS]) == 0
    assert main(["transactions", "evaluate", *common, "--model", str(tmp_path / "ft"), "--out", str(tmp_path / "rep"),
                 "--bootstrap", "10", "--stacking", "--label-fraction", "0.5", "--encoder", str(tmp_path / "pre"),
                 "--keep-negative", "0.5", "max_steps=2", "batch_size=8", "progress=false"]) == 0
    m = json.loads((tmp_path / "rep" / "metrics.json").read_text())
    assert {"stacked", "stacked_val", "lf_pretrained", "lf_scratch"} <= set(m["models"])
    assert {"pr_auc", "mean"} <= set(m["bootstrap"]["lf_pretrained - lf_scratch"])
    assert [c["criterion"] for c in m["criteria"]][-1] == "4 pretraining pays"
    for arm in ("pretrained", "scratch"):
        assert (tmp_path / "rep" / "label_fraction" / arm / "checkpoints").is_dir()
