"""The stacker (a monotone blend of out-of-fit scores, checked out of fold), embedding-augmented
boosting, the prefix customer embedding, the label-fraction fine-tuning and the usefulness criteria in
the evaluation report."""

from __future__ import annotations

import copy
import importlib.util
import json
import shutil
from pathlib import Path

import numpy as np
import pytest
import torch

pytest.importorskip("pandas")
pytest.importorskip("sklearn")

from slmlab.cli import main  # noqa: E402
from slmlab.transactions.data.bank import export, label_customers, prepare_bank  # noqa: E402
from slmlab.transactions.evaluation.augmented import (  # noqa: E402
    PCA_COMPONENTS,
    cached_encoder_scores,
    hgb_encoder_scores,
    pca_features,
    training_period_rows,
)
from slmlab.transactions.evaluation.cache import weights_key  # noqa: E402
from slmlab.transactions.evaluation.evaluate import evaluate_models, usefulness_criteria  # noqa: E402
from slmlab.transactions.evaluation.kinds import (  # noqa: E402
    BASELINE,
    FINE_TUNED,
    JOINT,
    SEQUENCE,
    STACKED,
    fraud_model_kind,
    kind_of,
)
from slmlab.transactions.evaluation.score import (  # noqa: E402
    PrefixEmbedding,
    prefix_mean,
    score_bank,
    score_embed_bank,
    score_states,  # noqa: E402
)
from slmlab.transactions.evaluation.stacking import (  # noqa: E402
    blend,
    fit_monotone_logistic,
    stack_inputs,
    stacked_scores,
)
from slmlab.transactions.heads.fraud import TransactionFraudConfig, TransactionFraudModel  # noqa: E402
from slmlab.transactions.model import TransactionEncoder, TxnEncoderConfig, preset_schema  # noqa: E402
from slmlab.transactions.training import finetune, finetune_label_fraction_arms  # noqa: E402

STEPS = ["max_steps=2", "batch_size=8", "progress=false", "device=cpu"]
BENCH_STACKER = Path(__file__).resolve().parents[2] / "benchmarks" / "bench_transactions_stacker.py"


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


# -- the stacker: behaviour on scores built in code -------------------------------------------------------
def _synthetic(n=40_000, customers=4_000, seed=0):
    """Labels driven by two independent signals ``x1``, ``x2`` (logit ``-6 + 1.8 x1 + 1.8 x2``); rows of
    ``customers`` customers; the first half is "validation", the second "test"."""
    rng = np.random.default_rng(seed)
    x1, x2 = rng.normal(size=n), rng.normal(size=n)
    y = (rng.random(n) < 1 / (1 + np.exp(-(-6 + 1.8 * x1 + 1.8 * x2)))).astype(int)
    groups = rng.integers(0, customers, n)
    val = np.arange(n) < n // 2
    return x1, x2, y, groups, val


def _sig(z):
    return 1 / (1 + np.exp(-z))


def _ap(y, s):
    from sklearn.metrics import average_precision_score

    return average_precision_score(y, s)


def test_stacker_with_noise_stays_within_0005_of_the_best_input():
    x1, x2, y, groups, val = _synthetic()
    best = _sig(x1 + x2 - 4)  # the whole signal
    for seed in range(3):
        noise = np.random.default_rng(100 + seed).random(len(y))
        out, info = blend({"hgb_rolling": best, "sequence": noise}, y, val, groups)
        test = ~val
        assert _ap(y[test], out[test]) >= _ap(y[test], best[test]) - 0.005, info
        assert info["choice"] in ("blend", "hgb_rolling")
        if info["choice"] == "blend":
            assert info["weights"]["sequence"] < 0.1 * info["weights"]["hgb_rolling"]


def test_stacker_with_a_complementary_score_beats_both_inputs():
    x1, x2, y, groups, val = _synthetic()
    a, b = _sig(x1 - 3), _sig(2 * x2 - 3)  # each holds half of the signal, on different scales
    out, info = blend({"hgb_rolling": a, "sequence": b}, y, val, groups)
    test = ~val
    assert info["choice"] == "blend", info
    assert _ap(y[test], out[test]) > max(_ap(y[test], a[test]), _ap(y[test], b[test])) + 0.02
    assert info["blend_oof_pr_auc"] > max(info["input_val_pr_auc"].values())
    w = info["weights"]
    assert w["hgb_rolling"] > 0.5 and w["sequence"] > 0.3  # both used: ~1.8 and ~0.9 in truth


def test_stacker_falls_back_without_enough_validation_frauds():
    x1, x2, y, groups, val = _synthetic(n=4_000)
    y = y.copy()
    y[val] = 0
    y[np.flatnonzero(val)[:5]] = 1
    out, info = blend({"hgb_rolling": _sig(x1), "sequence": _sig(x2)}, y, val, groups)
    assert info["choice"] in ("hgb_rolling", "sequence") and "5 validation frauds < 10" in info["reason"]
    np.testing.assert_array_equal(out, _sig(x1) if info["choice"] == "hgb_rolling" else _sig(x2))
    with pytest.raises(ValueError, match="known labels"):
        blend({"a": _sig(x1), "b": _sig(x2)}, np.full(len(y), -1), val, groups)


def test_monotone_logistic_keeps_weights_non_negative():
    rng = np.random.default_rng(0)
    X = rng.normal(size=(5000, 2))
    y = (rng.random(5000) < _sig(2 * X[:, 0] - 1.5 * X[:, 1])).astype(int)  # the second is anti-correlated
    w, b = fit_monotone_logistic(X, y)
    assert w[0] > 1.5 and w[1] == 0.0


def test_stacked_scores_on_the_tiny_bank(bank):
    rng = np.random.default_rng(0)
    y = bank.df["is_fraud"].fillna(0).to_numpy()
    scores = {"hgb_rolling": np.clip(0.6 * y + 0.4 * rng.random(len(y)), 0, 1), "sequence": rng.random(len(y)),
              "hgb_raw": rng.random(len(y))}
    out, info = stacked_scores(bank, scores, labels_at=bank.cuts["end"])
    assert info["inputs"] == ["hgb_rolling", "sequence"]  # hgb_raw is not a stacker input
    val = bank.period_mask(bank.cuts["val_start"], bank.cuts["val_end"])
    assert info["val_rows"] == int(val.sum()) and out.shape == (len(y),)
    with pytest.raises(ValueError, match="one row per bank row"):
        stacked_scores(bank, {"hgb_rolling": scores["hgb_rolling"][:10], "sequence": scores["sequence"]})
    with pytest.raises(ValueError, match="needs HGB-rolling and a sequence"):
        stacked_scores(bank, {"hgb_rolling": scores["hgb_rolling"]})


# -- embedding-augmented boosting -------------------------------------------------------------------------
def test_encoder_states_are_streamed_once_and_feed_the_booster(bank, few, monkeypatch):
    from slmlab.transactions.evaluation import baseline
    from slmlab.transactions.model import TransactionEncoder

    torch.manual_seed(0)
    enc = TransactionEncoder(TxnEncoderConfig.from_preset("lfm2_tiny", schema=few.fitted)).eval()
    states = score_states(enc, few)
    assert states.shape == (len(few.df), 64) and not np.isnan(states).any()
    rows = np.flatnonzero(few.df["customer_id"].to_numpy() == few.df["customer_id"].iloc[0])
    r = rows[len(rows) // 2]
    changed = few.ids.copy()
    changed[r, few.fitted.schema.score_index + 1:] = 4  # the row's response code: after its state
    changed[rows[rows > r]] = 5  # and every later row
    other = type(few)(few.df, changed, few.fitted, few.cuts, few.customers, few.holdout)
    np.testing.assert_allclose(score_states(enc, other)[rows[rows <= r]], states[rows[rows <= r]], rtol=1e-5, atol=1e-5)
    monkeypatch.setitem(baseline.HGB_PARAMS, "max_iter", 30)
    s, info = hgb_encoder_scores(bank, score_states(enc, bank))
    assert [c for c in info["features"] if c.startswith("enc_pc")] == [f"enc_pc{k:02d}" for k in range(PCA_COMPONENTS)]
    assert "count_24h" in info["features"] and s.shape == (len(bank.df),) and not np.isnan(s).any()
    with pytest.raises(ValueError, match="one row per bank row"):
        hgb_encoder_scores(bank, states[:5])


def test_encoder_boosting_scores_are_cached_per_encoder(bank, tmp_path, monkeypatch):
    """A second report with the same encoder reads hgb_rolling_encoder's scores back (no streaming pass);
    the same weights in another object share the key, one nudged weight does not."""
    from slmlab.transactions.evaluation import augmented, baseline
    from slmlab.transactions.model import TransactionEncoder

    monkeypatch.setitem(baseline.HGB_PARAMS, "max_iter", 30)
    torch.manual_seed(0)
    enc = TransactionEncoder(TxnEncoderConfig.from_preset("lfm2_tiny", schema=bank.fitted)).eval()
    first, info = cached_encoder_scores(bank, enc, tmp_path)
    assert info["cache"].startswith("wrote") and info["states_seconds"] > 0
    np.testing.assert_array_equal(first, hgb_encoder_scores(bank, score_states(enc, bank))[0])
    passes = []
    monkeypatch.setattr(augmented, "score_states", lambda *a, **k: passes.append(a))
    again, info2 = cached_encoder_scores(bank, enc, tmp_path)
    assert info2["cache"].startswith("read") and not passes
    np.testing.assert_array_equal(again, first)
    twin = TransactionEncoder(enc.config).eval()
    twin.load_state_dict(enc.state_dict())
    assert weights_key(twin) == weights_key(enc)
    # saving sets the config's architectures and dtype, loading its path: none of them is the network
    enc.save_pretrained(tmp_path / "a")
    for folder in ("a", "b"):
        if folder == "b":
            shutil.copytree(tmp_path / "a", tmp_path / "b")
        loaded = TransactionEncoder.from_pretrained(tmp_path / folder)
        assert loaded.config.architectures and weights_key(loaded) == weights_key(twin)
    with torch.no_grad():
        next(twin.parameters()).view(-1)[0] += 1e-3
    assert weights_key(twin) != weights_key(enc)


def test_fraud_model_scores_are_cached_per_weights(bank, model, tmp_path, monkeypatch):
    """A second report of the same fraud model reads its scores back (no scoring pass) and reports the
    same figures; another model's weights miss the cache and are scored."""
    from slmlab.transactions.evaluation import baseline
    from slmlab.transactions.evaluation import evaluate as ev

    monkeypatch.setitem(baseline.HGB_PARAMS, "max_iter", 30)
    first = evaluate_models(bank, model, None, n_boot=5, cache_dir=tmp_path)
    assert len(list(tmp_path.glob("fraud_model-*.npz"))) == 1
    real, passes = ev.score_bank, []
    monkeypatch.setattr(ev, "score_bank", lambda m, *a, **k: passes.append(m) or real(m, *a, **k))
    again = evaluate_models(bank, model, None, n_boot=5, cache_dir=tmp_path)
    same = [json.dumps(r["models"]["sequence"], sort_keys=True) for r in (first, again)]  # NaN-safe equality
    assert passes == [] and same[0] == same[1]
    torch.manual_seed(1)
    other = TransactionFraudModel(TxnEncoderConfig.from_preset("lfm2_tiny", schema=bank.fitted)).eval()
    evaluate_models(bank, other, None, n_boot=5, cache_dir=tmp_path)
    assert passes == [other] and len(list(tmp_path.glob("fraud_model-*.npz"))) == 2


def test_report_rows_stacker_and_floor_on_the_tiny_bank(bank, model, tmp_path, monkeypatch):
    """The report's rows and the stacker's bound: stacked's test PR-AUC >= the best input's - 0.02."""
    from slmlab.transactions.evaluation import baseline
    from slmlab.transactions.model import TransactionEncoder

    monkeypatch.setitem(baseline.HGB_PARAMS, "max_iter", 30)
    torch.manual_seed(0)
    enc = TransactionEncoder(TxnEncoderConfig.from_preset("lfm2_tiny", schema=bank.fitted)).eval()
    result = evaluate_models(bank, model, tmp_path, n_boot=20, encoder=enc)
    saved = json.loads((tmp_path / "metrics.json").read_text())
    assert {"hgb_raw", "hgb_rolling", "token_lr", "hgb_rolling_encoder", "sequence", "stacked"} <= set(saved["models"])
    m = result["models"]
    stacker = m["stacked"]["stacker"]
    assert stacker["inputs"] == ["hgb_rolling", "sequence"]
    assert m["stacked"]["pr_auc"] >= max(m[n]["pr_auc"] for n in stacker["inputs"]) - 0.02
    assert f"stacked: chose {stacker['choice']}" in (tmp_path / "report.md").read_text()
    assert saved["floor"]["sequence"]["verdict"] in ("above", "not above", "undecided")
    assert saved["hgb"]["hgb_rolling_encoder"]["encoder_shift"]["windows"] == 256
    assert saved["primary"] == "stacked - hgb_rolling"
    names = [c["criterion"] for c in saved["criteria"]]
    assert names == ["1 parity", "2 useful", "2 useful, secondary (hgb_rolling_encoder)", "3 strong"]
    assert [c["counted"] for c in saved["criteria"]] == [True, True, False, True]
    with pytest.raises(ValueError, match="primary comparison 'joint' is not among"):
        evaluate_models(bank, model, None, n_boot=2, primary="joint")


def test_validation_pr_auc_is_read_on_the_scored_labelled_validation_rows(bank):
    """Each report row's ``val_pr_auc``: average precision over the validation rows whose label is known and
    whose score exists (a sequence model scores from the validation cut on: NaN before it)."""
    from sklearn.metrics import average_precision_score

    from slmlab.transactions.evaluation.evaluate import _model_metrics

    n = len(bank.df)
    rng = np.random.default_rng(0)
    val = bank.period_mask(bank.cuts["val_start"], bank.cuts["val_end"])
    test = bank.period_mask(bank.cuts["test_start"], None)
    y_val = np.where(rng.random(n) < 0.2, 1, 0)
    y_val[rng.random(n) < 0.1] = -1  # labels not yet known: left out
    s = rng.random(n) + 0.5 * (y_val == 1)
    s[np.flatnonzero(val)[:7]] = np.nan  # unscored rows: left out
    y = bank.df["is_fraud"].fillna(0).to_numpy().astype(int)[test]
    ftype = bank.df["fraud_type"].astype(str).to_numpy()
    m = _model_metrics(bank, s, test, y, y_val, val & (y_val >= 0), ftype)
    ok = val & (y_val >= 0) & ~np.isnan(s)
    assert m["val_pr_auc"] == pytest.approx(average_precision_score(y_val[ok], s[ok]), abs=1e-12)
    assert 0.3 < m["val_pr_auc"] < 1  # the planted signal, well above the 0.2 base rate


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


def test_label_fraction_arms_keep_the_same_commands_runs_and_replace_others(bank, tmp_path):
    """A rerun of the same evaluate (its few-label fine-tunes killed by a session's end, or all finished)
    loads each finished fine-tune and continues a partial one instead of training it again; a changed
    recipe or another encoder replaces them. Each fine-tune on a 2.8M-row bank is minutes of CPU."""
    torch.manual_seed(123)  # not seed 0's scratch encoder
    encoder = TransactionEncoder(TxnEncoderConfig.from_preset("lfm2_tiny", schema=bank.fitted))
    out = tmp_path / "lf"
    steps = ["max_steps=3", "batch_size=8", "progress=false", "device=cpu", "checkpoint_every=2", "log_every=1"]

    def run(overrides=steps, enc=encoder):
        models, _ = finetune_label_fraction_arms(bank, out, enc, 0.5, overrides, seeds=(0,))
        return {name: weights_key(m) for name, m in models.items()}

    def trained_steps(arm):
        lines = (out / arm / "metrics.jsonl").read_text().splitlines()
        return [json.loads(line)["step"] for line in lines if json.loads(line)["kind"] == "train"]

    first = run()
    assert set(first) == {"lf_pretrained_s0", "lf_scratch_s0"} and first["lf_pretrained_s0"] != first["lf_scratch_s0"]
    assert (out / "encoder.key").read_text().strip() == weights_key(encoder)
    stamp = {arm: (out / arm / "metrics.jsonl").stat().st_mtime_ns for arm in ("pretrained-s0", "scratch-s0")}
    assert run() == first  # finished: loaded as they were, not trained again
    assert trained_steps("pretrained-s0") == [1, 2, 3]
    # a run killed after its step-2 checkpoint continues from it, to the weights of the uninterrupted run
    shutil.rmtree(out / "scratch-s0" / "checkpoints" / "step_000003")
    assert run() == first and trained_steps("scratch-s0") == [1, 2, 3]
    assert (out / "pretrained-s0" / "metrics.jsonl").stat().st_mtime_ns == stamp["pretrained-s0"]
    # another recipe (max_steps is not resume-protected, yet a 4-step run is not a 3-step run continued)
    longer = run([*steps[1:], "max_steps=4"])
    assert longer["lf_pretrained_s0"] != first["lf_pretrained_s0"] and trained_steps("pretrained-s0") == [1, 2, 3, 4]
    assert run() == first  # and back: trained afresh, the same seeded weights
    shutil.rmtree(out / "scratch-s0" / "checkpoints")  # killed before its first checkpoint: trained afresh
    assert (out / "scratch-s0" / "metrics.jsonl").is_file() and run() == first
    nudged = copy.deepcopy(encoder)
    with torch.no_grad():
        next(nudged.parameters()).add_(1e-3)
    assert run(enc=nudged)["lf_pretrained_s0"] != first["lf_pretrained_s0"]
    assert (out / "encoder.key").read_text().strip() == weights_key(nudged)


def test_cli_bad_input(bank_data, tmp_path, capsys):
    export(bank_data, tmp_path / "bank", "parquet")
    common = ["--data", str(tmp_path / "bank"), "--threads", "1", "--device", "cpu"]
    cases = [
        (["evaluate", *common, "--out", str(tmp_path / "r"), "--label-fraction", "0.1"], "go together"),
        (["evaluate", *common, "--out", str(tmp_path / "r"), "--seeds", "2"], "--seeds 2 counts the --label-fraction"),
        (["evaluate", *common, "--out", str(tmp_path / "r"), "--primary", "stacked"], "--primary stacked needs --model"),
        (["evaluate", *common, "--out", str(tmp_path / "r"), "--primary", "hgb_rolling_encoder"],
         "--primary hgb_rolling_encoder needs --encoder"),
        (["evaluate", *common, "--out", str(tmp_path / "r"), "--label-fraction", "1.5", "--encoder", "x"],
         "label fraction must be in"),
        (["finetune", *common, "--out", str(tmp_path / "f"), "--label-fraction", "0", *STEPS],
         "label fraction must be in"),
    ]
    for argv, msg in cases:
        assert main(["transactions", *argv]) == 2
        err = capsys.readouterr().err
        assert "slmlab transactions: error:" in err and msg in err


@pytest.mark.parametrize("flags, msg", [
    (["--stacking"], "--stacking was removed; the stacker is now always the out-of-fold blend"),
    (["--stack-fit", "validation"], "--stack-fit was removed; the stacker is now always the out-of-fold blend"),
    (["--stack-fit=both"], "--stack-fit was removed"),
    (["--primary", "joint"], "--primary 'joint': not a primary comparison; choose one of stacked, hgb_rolling_encoder"),
    (["--seeds", "0"], "--seeds '0': not a seed count; give a whole number >= 1"),
    (["--seeds", "two"], "--seeds 'two': not a seed count"),
])
def test_cli_evaluate_refuses_removed_flags_and_bad_choices_in_one_line(flags, msg, tmp_path, capsys):
    """A removed flag is an error naming what replaced it (never silently accepted); a bad --primary or
    --seeds names the value and the choices. One line (no usage block), exit 2, before anything loads."""
    with pytest.raises(SystemExit) as exc:
        main(["transactions", "evaluate", "--data", str(tmp_path / "none"), "--out", str(tmp_path / "r"), *flags])
    err = capsys.readouterr().err
    assert exc.value.code == 2 and err.startswith(f"slmlab transactions evaluate: error: {msg}"), err
    assert err.count("\n") == 1 and err.endswith("\n"), err
    assert err.rstrip().endswith("drop the flag") == ("removed" in msg), err
    assert not (tmp_path / "r").exists()


def test_cli_evaluate_passes_primary_and_seeds_to_the_pipeline(tmp_path, monkeypatch, capsys):
    from slmlab.transactions import pipeline

    seen = {}

    def fake_evaluate(data, out, model, bootstrap, **kw):
        seen.update(kw)
        Path(out).mkdir(parents=True)
        Path(out, "report.md").write_text("report")
        return {"models": {}}

    monkeypatch.setattr(pipeline, "evaluate", fake_evaluate)
    argv = ["transactions", "evaluate", "--data", "bank", "--out", str(tmp_path / "r"), "--encoder", "pre",
            "--label-fraction", "0.1", "--seeds", "5", "--primary", "hgb_rolling_encoder"]
    assert main(argv) == 0 and "report" in capsys.readouterr().out
    assert seen["seeds"] == 5 and seen["primary"] == "hgb_rolling_encoder" and seen["label_fraction"] == 0.1
    assert main(["transactions", "evaluate", "--data", "bank", "--out", str(tmp_path / "r2")]) == 0
    assert seen["seeds"] is None and seen["primary"] is None  # the pipeline's defaults: 3 seeds, stacked or encoder


def test_cli_evaluate_help_names_the_new_flags_and_not_the_removed_ones(capsys):
    with pytest.raises(SystemExit):
        main(["transactions", "evaluate", "--help"])
    text = capsys.readouterr().out
    assert "--primary NAME" in text and "stacked, hgb_rolling_encoder" in text and "--seeds N" in text
    assert "--stacking" not in text and "--stack-fit" not in text


@pytest.mark.slow
def test_cli_stacker_primary_and_seeded_label_fraction_end_to_end(bank_data, tmp_path):
    export(bank_data, tmp_path / "bank", "parquet")
    common = ["--data", str(tmp_path / "bank"), "--threads", "1", "--device", "cpu"]
    assert main(["transactions", "pretrain", *common, "--out", str(tmp_path / "pre"), *STEPS]) == 0
    assert main(["transactions", "finetune", *common, "--encoder", str(tmp_path / "pre"), "--out",
                 str(tmp_path / "ft"), "--label-fraction", "0.5", *STEPS]) == 0
    assert main(["transactions", "evaluate", *common, "--model", str(tmp_path / "ft"), "--out", str(tmp_path / "rep"),
                 "--bootstrap", "10", "--label-fraction", "0.5", "--encoder", str(tmp_path / "pre"), "--seeds", "2",
                 "--primary", "hgb_rolling_encoder", "--keep-negative", "0.5", "max_steps=2", "batch_size=8",
                 "progress=false"]) == 0
    m = json.loads((tmp_path / "rep" / "metrics.json").read_text())
    arms = {"lf_pretrained": [f"lf_pretrained_s{k}" for k in range(2)], "lf_scratch": [f"lf_scratch_s{k}" for k in range(2)]}
    assert {"stacked", "hgb_rolling_encoder", *arms["lf_pretrained"], *arms["lf_scratch"]} <= set(m["models"])
    assert not {"lf_pretrained_s2", "lf_scratch_s2"} & set(m["models"])  # --seeds 2: two fine-tunes per arm
    assert {"pr_auc", "mean", "seeds"} <= set(m["bootstrap"]["lf_pretrained - lf_scratch"])
    assert m["bootstrap"]["lf_pretrained - lf_scratch"]["seeds"] == arms and m["arms"]["lf_scratch"]["seeds"] == arms["lf_scratch"]
    criteria = {c["criterion"]: c for c in m["criteria"]}
    assert m["primary"] == "hgb_rolling_encoder - hgb_rolling"  # --primary, declared before the run
    assert criteria["2 useful"]["difference"] == "hgb_rolling_encoder - hgb_rolling" and criteria["2 useful"]["counted"]
    assert criteria["2 useful, secondary (stacked)"]["counted"] is False
    assert [c["criterion"] for c in m["criteria"]][-1] == "4 pretraining pays"
    for arm in ("pretrained", "scratch"):
        for k in range(2):
            assert (tmp_path / "rep" / "label_fraction" / f"{arm}-s{k}" / "checkpoints").is_dir()


def test_stacker_bound_benchmark_at_toy_size(bank, tmp_path):
    """Issue 42's bound, stacked's test PR-AUC >= the best input's - 0.02, with a briefly fine-tuned
    sequence model as the second input: measured on the ``small`` bank by
    benchmarks/bench_transactions_stacker.py (~3 CPU-minutes, too slow for the suite); here the same code
    (its ``run``: evaluate_models' scorers and stacker) on the 120-customer test bank, whose 12 validation
    frauds are labelled only after the start of test: the labels known at the bank's end let the stacker
    fit and cross-check a blend rather than fall back for want of frauds."""
    spec = importlib.util.spec_from_file_location("bench_transactions_stacker", BENCH_STACKER)
    bench = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(bench)
    r = bench.run(bank, tmp_path, steps=3, batch_size=8, keep_negative=1.0, labels_at=bank.cuts["end"])
    info, pr = r["stacker"], r["pr_auc"]
    assert info["inputs"] == ["hgb_rolling", "sequence"] and set(pr) == {"hgb_rolling", "sequence", "stacked"}
    assert info["val_frauds"] >= 10 and info["weights"] is not None, info  # a blend fitted and cross-checked
    assert info["choice"] in ("blend", "hgb_rolling", "sequence") and "out-of-fold" in info["reason"], info
    assert r["best_input_pr_auc"] == max(pr["hgb_rolling"], pr["sequence"]) and r["n_test_fraud"] > 0
    assert r["margin"] == pytest.approx(pr["stacked"] - r["best_input_pr_auc"] + 0.02)
    assert r["met"], r


# -- the report's model kinds: fused, stacker input, recipe -------------------------------------------------
def test_a_fraud_model_is_fused_by_its_config_not_its_name():
    plain = TransactionFraudModel(TransactionFraudConfig.from_preset("lfm2_tiny"))
    joint = TransactionFraudModel(TransactionFraudConfig.from_preset(
        "lfm2_tiny", fraud_tabular="rolling", tabular_features=["amount_sum_1h"], tabular_center=[0.0],
        tabular_scale=[1.0]))
    assert fraud_model_kind(plain) is FINE_TUNED and fraud_model_kind(joint) is JOINT
    assert JOINT.fused and JOINT.stack_input and JOINT.recipe
    assert FINE_TUNED.recipe and not FINE_TUNED.fused and not FINE_TUNED.stack_input
    # the report's own rows by name; a further model by the kind given for it; anything else a baseline
    assert kind_of("stacked") is STACKED and kind_of("sequence") is SEQUENCE
    assert kind_of("hgb_rolling_encoder").fused and kind_of("hgb_rolling").stack_input
    assert kind_of("joint") is BASELINE and kind_of("hgb_raw") is BASELINE
    assert kind_of("fusion", {"fusion": JOINT}) is JOINT and kind_of("joint", {"joint": FINE_TUNED}) is FINE_TUNED


def test_the_stacker_and_criterion_2_read_the_kinds():
    scores = {name: np.zeros(3) for name in ("hgb_raw", "hgb_rolling", "sequence", "fusion", "joint_plain", "lf_0")}
    kinds = {"fusion": JOINT, "joint_plain": FINE_TUNED, "lf_0": FINE_TUNED}
    assert list(stack_inputs(scores, kinds)) == ["hgb_rolling", "sequence", "fusion"]
    assert list(stack_inputs(scores)) == ["hgb_rolling", "sequence"]

    def row(pr):
        return {"pr_auc": pr, "recall_at_fpr_0.1pct": 0.5}

    models = {"hgb_rolling": row(0.5), "stacked": row(0.5), "fusion": row(0.6), "joint_plain": row(0.7)}
    boot = {f"{name} - hgb_rolling": {"pr_auc": [0.05, 0.15], "recall_at_fpr_0.1pct": [0.0, 0.1]}
            for name in ("stacked", "fusion", "joint_plain")}
    got = usefulness_criteria({"models": models, "bootstrap": boot, "primary": "stacked - hgb_rolling"}, kinds)
    assert [(c["criterion"], c["counted"]) for c in got] == [("2 useful", True), ("2 useful, secondary (fusion)", False)]
