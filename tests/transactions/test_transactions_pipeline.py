"""Transactions: synthetic bank, harness hooks, pretraining resume, scorer, evaluation, CLI end to end."""

from __future__ import annotations

import hashlib
import json
import shutil
import subprocess
import sys

import numpy as np
import pytest
import torch

pd = pytest.importorskip("pandas")
pytest.importorskip("sklearn")

from slmlab.cli import main  # noqa: E402
from slmlab.train.config import OptimConfig  # noqa: E402
from slmlab.train.optim import build_optimizer  # noqa: E402
from slmlab.transactions.data.bank import export, load_bank, prepare_bank  # noqa: E402
from slmlab.transactions.data.synth import PATTERNS, SynthConfig, generate  # noqa: E402
from slmlab.transactions.data.windows import TransactionWindows  # noqa: E402
from slmlab.transactions.evaluation.evaluate import evaluate_models  # noqa: E402
from slmlab.transactions.evaluation.score import score_bank, score_transactions  # noqa: E402
from slmlab.transactions.heads.fraud import TransactionFraudConfig, TransactionFraudModel  # noqa: E402
from slmlab.transactions.model import TxnEncoderConfig, preset_schema  # noqa: E402
from slmlab.transactions.training import pretrain  # noqa: E402

SMALL = dict(n_customers=120, n_days=60, n_physical_merchants=600, n_online_merchants=200, target_fraud_rate=0.01,
             seed=3)


def _csv_sha(data, tmp_path) -> str:
    export(data, tmp_path, "csv")
    return hashlib.sha256((tmp_path / "transactions.csv").read_bytes()).hexdigest()


# -- generator -------------------------------------------------------------------------------------------
def test_generator_is_deterministic_for_any_chunking(bank_data, tmp_path):
    again = generate(SynthConfig.from_preset("tiny", **SMALL), chunk_size=7)
    assert _csv_sha(bank_data, tmp_path / "a") == _csv_sha(again, tmp_path / "b")
    other = generate(SynthConfig.from_preset("tiny", **{**SMALL, "seed": 4}))
    assert _csv_sha(other, tmp_path / "c") != _csv_sha(bank_data, tmp_path / "a")


def test_every_pattern_present_with_ground_truth(bank_data):
    tx = bank_data.transactions
    assert set(tx.loc[tx.is_fraud == 1, "fraud_type"]) == set(PATTERNS)
    fraud = tx[tx.is_fraud == 1]
    assert (fraud["label_available_at"] > fraud["timestamp"]).all() and fraud["fraud_case_id"].notna().all()
    assert tx.loc[tx.is_fraud == 0, "label_available_at"].isna().all()
    ct = fraud[fraud.fraud_type == "card_testing"]
    assert ct["device_id"].str.startswith("FD").all()  # the campaign's device, not the victim's own
    ls = fraud[fraud.fraud_type == "lost_stolen"]
    assert ((ls.amount >= 60) & (ls.amount < 100)).all() and (ls.auth_method == "no_cvm").all()
    cf = bank_data.fraud_cases
    assert cf.loc[cf.fraud_type == "counterfeit_after_compromise", "compromise_merchant_id"].notna().all()
    assert tx["timestamp"].is_monotonic_increasing  # export order: (timestamp, transaction_id)


def test_csv_and_parquet_load_back_equal_and_labels_separate(bank_data, tmp_path):
    export(bank_data, tmp_path / "csv", "csv")
    export(bank_data, tmp_path / "pq", "parquet", labels_separate=True)
    a, b = load_bank(tmp_path / "csv").transactions, load_bank(tmp_path / "pq").transactions
    pd.testing.assert_frame_equal(a, b[a.columns])
    pd.testing.assert_frame_equal(a, bank_data.transactions)
    assert "is_fraud" not in pd.read_parquet(tmp_path / "pq" / "transactions.parquet").columns
    manifest = json.loads((tmp_path / "pq" / "manifest.json").read_text())
    assert manifest["rows"]["transactions"] == len(a) and len(manifest["sha256"]) == 5


@pytest.mark.slow
def test_realised_fraud_rate_within_30_percent_of_target():
    cfg = SynthConfig.from_preset("tiny", n_customers=1000, n_days=90, target_fraud_rate=0.003, seed=11)
    tx = generate(cfg).transactions
    rate = tx.is_fraud.mean()
    assert abs(rate - 0.003) / 0.003 <= 0.3, rate
    assert set(tx.loc[tx.is_fraud == 1, "fraud_type"]) == set(PATTERNS)


# -- harness hooks ---------------------------------------------------------------------------------------
def test_lr_scales_split_groups_by_longest_prefix():
    model = TransactionFraudModel(TxnEncoderConfig.from_preset("lfm2_tiny"))
    cfg = OptimConfig(lr=1e-3, lr_scales={"encoder.": 0.1, "encoder.embedding.": 0.5})
    cfg.validate()
    opt = build_optimizer(model, cfg)
    lr_of = {id(p): g["base_lr"] for g in opt.param_groups for p in g["params"]}
    named = dict(model.named_parameters())
    assert lr_of[id(named["fraud_head.mlp.0.weight"])] == pytest.approx(1e-3)
    assert lr_of[id(named["encoder.backbone.layers.0.feed_forward.w1.weight"])] == pytest.approx(1e-4)
    assert lr_of[id(named["encoder.embedding.tables.weight"])] == pytest.approx(5e-4)
    with pytest.raises(ValueError, match=r"optim.lr_scales\['x'\] must be a number > 0"):
        OptimConfig(lr_scales={"x": 0}).validate()
    frozen = TransactionFraudModel(TransactionFraudConfig.from_preset("lfm2_tiny", freeze_backbone=True))
    trainable = {n for n, p in frozen.named_parameters() if p.requires_grad}
    assert trainable == {n for n in trainable if n.startswith("fraud_head.")} and trainable


def test_window_source_batches_and_exact_pretraining_resume(bank, tmp_path):
    w = {"train": bank.windows(16, 8, "train"), "validation": bank.windows(16, 8, "validation")}
    src = TransactionWindows(w)
    batch = next(src.batches("train", 4, seed=0))
    assert batch["input_ids"].shape == (4, 16, 15) and batch["attention_mask"].shape == (4, 240)
    assert torch.equal(batch["labels"], batch["input_ids"])
    run = ["max_steps=4", "checkpoint_every=2", "progress=false", "batch_size=8", "device=cpu"]
    straight = pretrain(bank, "lfm2_tiny", tmp_path / "a", run)
    shutil.copytree(tmp_path / "a", tmp_path / "b")
    steps = sorted((tmp_path / "b" / "checkpoints").glob("step_*"))
    assert len(steps) == 2
    shutil.rmtree(steps[-1])  # as if stopped after step 2
    resumed = pretrain(bank, "lfm2_tiny", tmp_path / "b", run, resume=True)
    assert len(straight.losses) == 4 and resumed.losses == straight.losses[2:]  # 2 + resume + 2 == 4, exactly
    ev = straight.state.last_eval
    assert {"loss", "ce/merchant_id", "unigram/merchant_id", "history/merchant_id"} <= set(ev)


def test_max_transactions_reaches_pretrain_finetune_and_scorer(bank_data, bank, tmp_path, monkeypatch):
    import slmlab.transactions.evaluation.score as score_mod

    export(bank_data, tmp_path / "bank", "csv")
    common = ["--data", str(tmp_path / "bank"), "--threads", "1", "--device", "cpu"]
    steps = ["max_steps=2", "batch_size=4", "progress=false"]
    assert main(["transactions", "pretrain", *common, "--max-transactions", "32", "--out", str(tmp_path / "pre"),
                 *steps]) == 0
    pre = json.loads((tmp_path / "pre" / "checkpoints" / "step_000002" / "config.json").read_text())
    assert pre["max_transactions"] == 32
    assert main(["transactions", "finetune", *common, "--encoder", str(tmp_path / "pre"), "--out",
                 str(tmp_path / "ft"), *steps]) == 0
    model = TransactionFraudModel.from_pretrained(str(tmp_path / "ft" / "checkpoints" / "step_000002"))
    assert model.config.max_transactions == 32
    seen = []
    real = score_mod.build_windows
    monkeypatch.setattr(score_mod, "build_windows", lambda enc, T, stride, **kw: seen.append((T, stride))
                        or real(enc, T, stride, **kw))
    score_bank(model, bank, bank.cuts["test_start"])
    assert seen == [(32, 16)]
    default = pretrain(bank, "lfm2_tiny", tmp_path / "d", ["max_steps=1", "progress=false", "device=cpu"])
    assert default.model.config.max_transactions == 16  # the preset's window when the option is absent


# -- scoring and evaluation ------------------------------------------------------------------------------
def test_streaming_scorer_scores_each_transaction_once(bank_data):
    few = bank_data.transactions[bank_data.transactions.customer_id.isin([f"C{i:06d}" for i in range(12)])]
    bank = prepare_bank(few, preset_schema("lfm2_tiny"), bank_data.customers)
    model = TransactionFraudModel(TxnEncoderConfig.from_preset("lfm2_tiny", schema=bank.fitted))
    scores = score_bank(model, bank)
    assert not np.isnan(scores).any() and len(scores) == len(bank.df)
    since = bank.cuts["test_start"]
    part = score_bank(model, bank, since)
    test = bank.period_mask(since, None)
    assert (~np.isnan(part) == test).all()
    np.testing.assert_allclose(part[test], scores[test], rtol=1e-5, atol=1e-6)  # same history either way
    df = score_transactions(model, bank.df.drop(columns=["row"]), bank.customers)
    assert df["transaction_id"].is_unique and len(df) == len(bank.df)


def test_hgb_baselines_and_report_end_to_end(bank, tmp_path):
    result = evaluate_models(bank, None, tmp_path, n_boot=20)
    assert set(result["models"]) == {"hgb_raw", "hgb_rolling", "hgb_rolling_risk", "token_lr"}
    assert result["hgb"]["token_lr"]["C"] in (0.03, 0.3, 3.0) and result["hgb"]["token_lr"]["fit_frauds"] > 0
    for m in result["models"].values():
        assert 0 <= m["pr_auc"] <= 1 and 0 <= m["roc_auc"] <= 1
        assert 0 <= m["amount_weighted_recall"] <= 1
        for d in m["detection_delay"].values():
            assert d["cases"] > 0 and 0 <= d["detected"] <= 1 and d["passed_mean_all"] >= 0
    report = (tmp_path / "report.md").read_text()
    assert "Detection delay" in report
    # no validation fraud is known by the start of test on this 60-day bank: the 1%-FPR thresholds come from
    # the validation negatives alone (they used to be inf, alerting nothing) and the report says how
    for name, m in result["models"].items():
        assert m["val_threshold_counts"]["positives"] == 0 and m["threshold_source"].startswith("validation")
        assert np.isfinite(m["val_threshold_1pct"]) and m["val_threshold_fpr"] <= 0.01
        assert f"- {name} (threshold " in report
        key = "C_selection" if name == "token_lr" else "n_iter_selection"
        assert result["hgb"][name][key].endswith("(no validation positive)"), name
    assert max(max(m["per_pattern_recall"].values()) for m in result["models"].values()) > 0
    assert (tmp_path / "report.md").is_file() and (tmp_path / "metrics.json").is_file()
    assert result["bootstrap"]["resamples"] > 0


@pytest.mark.slow
def test_cli_end_to_end_and_fresh_process_scores_match(tmp_path, capsys):
    bank_dir = tmp_path / "bank"
    small = [f"{k}={v}" for k, v in {**SMALL, "n_customers": 60, "n_days": 45}.items() if k != "seed"]
    assert main(["transactions", "generate", "--preset", "tiny", "--seed", "5", "--out", str(bank_dir), *small]) == 0
    common = ["--data", str(bank_dir), "--threads", "1", "--device", "cpu"]
    steps = ["max_steps=2", "batch_size=8", "progress=false"]
    assert main(["transactions", "pretrain", *common, "--out", str(tmp_path / "pre"), *steps]) == 0
    assert main(["transactions", "finetune", *common, "--encoder", str(tmp_path / "pre"), "--out",
                 str(tmp_path / "ft"), "--fraud-share", "0.3", "--loss", "focal", *steps, "keep_best=true",
                 "eval_every=1"]) == 0
    saved = json.loads((tmp_path / "ft" / "checkpoints" / "step_000002" / "config.json").read_text())
    assert saved["fraud_loss"] == "focal" and saved["focal_gamma"] == 2.0
    assert main(["transactions", "evaluate", *common, "--model", str(tmp_path / "ft"), "--out",
                 str(tmp_path / "rep"), "--bootstrap", "10"]) == 0
    metrics = json.loads((tmp_path / "rep" / "metrics.json").read_text())
    assert set(metrics["models"]) == {"hgb_raw", "hgb_rolling", "hgb_rolling_risk", "token_lr", "sequence", "stacked"}
    assert main(["transactions", "score", *common, "--model", str(tmp_path / "ft"), "--out",
                 str(tmp_path / "a.csv")]) == 0
    code = ("import sys; from slmlab.cli import main;"
            f"sys.exit(main(['transactions', 'score', '--data', r'{bank_dir}', '--model', r'{tmp_path / 'ft'}',"
            f" '--out', r'{tmp_path / 'b.csv'}', '--threads', '1', '--device', 'cpu']))")
    subprocess.run([sys.executable, "-c", code], check=True, capture_output=True)
    a, b = pd.read_csv(tmp_path / "a.csv"), pd.read_csv(tmp_path / "b.csv")
    pd.testing.assert_frame_equal(a, b, rtol=1e-6)
    assert main(["transactions", "pretrain", "--data", str(tmp_path / "nope"), "--out", str(tmp_path / "x")]) == 2
    assert "slmlab transactions: error:" in capsys.readouterr().err


def test_split_cuts_labels_delay_and_customer_disjoint(bank_data):
    tx = bank_data.transactions
    bank = prepare_bank(tx, preset_schema("lfm2_tiny"), bank_data.customers, customer_disjoint=True, seed=1)
    cuts = bank.cuts
    assert cuts["n_days"] == 60 and (cuts["train_end"] - cuts["start"]).days == 40
    assert (cuts["val_start"] - cuts["start"]).days == 42 and (cuts["test_start"] - cuts["start"]).days == 52
    assert 0 < len(bank.holdout) < 0.4 * tx.customer_id.nunique()
    w = bank.windows(16, 8, "train")
    rows = w.rows[w.txn_mask]
    assert not set(bank.df["customer_id"].to_numpy()[rows]) & bank.holdout
    assert (bank.df["timestamp"].iloc[rows] < cuts["train_end"]).all()
    y = bank.labels(cuts["train_end"])
    late = (bank.df["is_fraud"] == 1) & (bank.df["label_available_at"] > cuts["train_end"])
    assert (y[late.to_numpy()] == -1).all() and (y[(bank.df["is_fraud"] == 0).to_numpy()] == 0).all()


def test_amount_weighted_recall_and_detection_delay_by_hand():
    from slmlab.transactions.evaluation.evaluate import amount_weighted_recall, detection_delay

    y = np.array([1, 1, 0, 1])
    assert amount_weighted_recall(y, np.array([1, 0, 1, 0]), np.array([100.0, -50.0, 7.0, 50.0])) == 0.5
    # case a: alerts at its 3rd transaction (given out of time order); case b: never; case c: at its 1st
    case = np.array(["a", "a", "a", "b", "b", "c", "a"])
    pattern = np.array(["ato", "ato", "ato", "ato", "ato", "lost", "ato"])
    when = np.array([3, 1, 2, 1, 2, 5, 4])
    alert = np.array([True, False, False, False, False, True, True])
    d = detection_delay(case, pattern, when, alert)
    assert d["ato"] == {"cases": 2, "detected": 0.5, "passed_median": 2.0, "passed_mean": 2.0, "passed_mean_all": 2.0}
    assert d["lost"]["passed_mean"] == 0.0 and d["lost"]["detected"] == 1.0


def _risk_reference(df, delay, w):
    """Merchant risk by brute force: one loop over rows."""
    secs = (df.timestamp - df.timestamp.min()).dt.total_seconds().to_numpy()
    avail = (df.label_available_at - df.timestamp.min()).dt.total_seconds().to_numpy()
    out = []
    for i in range(len(df)):
        q = secs[i] - delay
        same = (df.merchant_id.to_numpy() == df.merchant_id.iloc[i]) & (secs >= q - w) & (secs < q)
        fraud = same & (df.is_fraud.to_numpy() == 1) & (np.nan_to_num(avail, nan=np.inf) <= q)
        out.append((same.sum(), fraud.sum()))
    return np.array(out, float)


def test_merchant_risk_uses_only_labels_known_a_delay_before():
    from slmlab.transactions.evaluation.baseline import merchant_risk

    rng = np.random.default_rng(0)
    n = 300
    t0 = pd.Timestamp("2024-01-01", tz="UTC")
    ts = t0 + pd.to_timedelta(np.sort(rng.uniform(0, 60 * 86400, n)), unit="s")
    fraud = rng.random(n) < 0.2
    df = pd.DataFrame({"timestamp": ts, "merchant_id": rng.choice(["m1", "m2", "m3"], n), "is_fraud": fraud.astype(int),
                       "label_available_at": ts + pd.to_timedelta(np.where(fraud, rng.uniform(0, 20, n), np.nan), unit="D")})
    df = df.sample(frac=1.0, random_state=1).reset_index(drop=True)
    feats = merchant_risk(df, delay_s=7 * 86400, windows_s={"7d": 7 * 86400, "30d": 30 * 86400})
    for name, w in (("7d", 7 * 86400), ("30d", 30 * 86400)):
        ref = _risk_reference(df, 7 * 86400, w)
        np.testing.assert_array_equal(feats[f"merchant_txns_{name}"], ref[:, 0])
        np.testing.assert_array_equal(feats[f"merchant_frauds_{name}"], ref[:, 1])
        rate = np.where(ref[:, 0] > 0, ref[:, 1] / np.maximum(ref[:, 0], 1), np.nan)
        np.testing.assert_allclose(feats[f"merchant_fraud_rate_{name}"], rate)
    assert feats["merchant_frauds_30d"].max() > 0
    # leak-free: relabelling everything after day 40, or delaying every label past the end, changes no
    # feature of a transaction before day 47 / no fraud count at all
    late = df.timestamp >= t0 + pd.Timedelta(days=40)
    other = df.assign(is_fraud=np.where(late, 1 - df.is_fraud, df.is_fraud),
                      label_available_at=df.label_available_at.where(~late, df.timestamp))
    early = (df.timestamp < t0 + pd.Timedelta(days=47)).to_numpy()
    again = merchant_risk(other, delay_s=7 * 86400, windows_s={"30d": 30 * 86400})
    np.testing.assert_array_equal(again["merchant_frauds_30d"][early], feats["merchant_frauds_30d"][early])
    never = merchant_risk(df.assign(label_available_at=t0 + pd.Timedelta(days=999)), windows_s={"30d": 30 * 86400})
    assert np.nansum(never["merchant_frauds_30d"]) == 0


def test_balance_windows_keeps_negatives_and_repeats_fraud_windows():
    from slmlab.transactions.data.windows import Windows, balance_windows

    n, T = 200, 4
    labels = np.zeros((n, T), np.int8)
    labels[[3, 50, 120], 2] = 1
    w = Windows(np.arange(n)[:, None, None].repeat(T, 1).repeat(15, 2), np.ones((n, T), bool), labels,
                np.arange(n * T).reshape(n, T), np.zeros(n, np.int64))
    same = balance_windows(w)
    assert len(same) == n and (same.ids == w.ids).all()
    out = balance_windows(w, fraud_share=0.5)
    fraud = (out.labels == 1).any(1)
    assert fraud.sum() == 3 * 66 and (~fraud).sum() == 197  # round(0.5 / 0.5 * 197 / 3) = 66 copies each
    assert set(out.ids[fraud][:, 0, 0]) == {3, 50, 120} and (out.rows[:, 0] == out.ids[:, 0, 0] * T).all()
    fewer = balance_windows(w, keep_negative=0.25, fraud_share=0.2, seed=1)
    neg = (~(fewer.labels == 1).any(1)).sum()
    assert 20 < neg < 80 and ((fewer.labels == 1).any(1)).sum() == 3 * round(0.25 * neg / 3)
    with pytest.raises(ValueError, match="fraud_share"):
        balance_windows(w, fraud_share=1.0)


def test_validation_sample_grows_to_the_fraud_floor_at_the_base_rate():
    from slmlab.transactions.data.windows import Windows, fraud_positions, sample_windows

    n, T = 2000, 4
    labels = np.zeros((n, T), np.int8)
    labels[np.arange(0, n, 10), 1] = 1  # 200 frauds, one window in ten
    w = Windows(np.arange(n)[:, None, None].repeat(T, 1).repeat(15, 2), np.ones((n, T), bool), labels,
                np.arange(n * T).reshape(n, T), np.zeros(n, np.int64))
    plain = sample_windows(w, 100, seed=3)
    grown = sample_windows(w, 100, seed=3, min_frauds=150)
    assert len(plain) == 100 and fraud_positions(plain) < 150
    assert fraud_positions(grown) == 150 and set(plain.ids[:, 0, 0]) <= set(grown.ids[:, 0, 0])
    assert 0.07 < fraud_positions(grown) / len(grown) < 0.13  # no fraud window picked for being one
    assert len(sample_windows(w, 100, seed=3, min_frauds=500)) == n  # fewer frauds than asked: all of them
    none = Windows(w.ids, w.txn_mask, np.full_like(labels, -1), w.rows, w.score_from)
    assert len(sample_windows(none, 100, seed=3, min_frauds=150)) == 100  # no fraud labels: the plain sample


def test_one_positive_upweighting_and_an_unbalanced_probe(bank):
    from slmlab.transactions.data.windows import WindowOptions
    from slmlab.transactions.heads import HEADS

    for head in ("transaction", "sequence"):
        spec = HEADS[head]
        plain, fixed = spec.windows(bank, 16, WindowOptions(keep_negative=0.5), {})
        over, fixed_over = spec.windows(bank, 16, WindowOptions(keep_negative=0.5, fraud_share=0.3), {})
        assert fixed["pos_weight"] > 1.5 and fixed_over["pos_weight"] == 1.0, head  # oversampling OR pos_weight
        full = bank.windows(16, 8, "train")
        assert len(over["probe"]) == len(plain["probe"]) == len(full), head  # before any rebalancing
        share = {k: (w.labels == 1).any(1).mean() for k, w in (("probe", over["probe"]), ("train", over["train"]))}
        assert share["train"] > 3 * share["probe"], (head, share)
