"""Joint fusion: the fraud head reading the sequence state with the transaction's rolling features.

Reference maths of the normaliser, the gather of row features into windows, the features the head reads
equal a brute-force lookup of the bank's feature table, training end to end moves both paths, the
streaming scorer equals one window per transaction, save/load, the validation sample, and the CLI."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch

pytest.importorskip("pandas")
pytest.importorskip("sklearn")

from slmlab.cli import main  # noqa: E402
from slmlab.transactions.data.bank import export  # noqa: E402
from slmlab.transactions.data.features import build_features, tabular_columns, tabular_table  # noqa: E402
from slmlab.transactions.data.windows import (  # noqa: E402
    WindowOptions,  # noqa: E402
    gather_rows,
    sample_windows,
)
from slmlab.transactions.evaluation.score import bank_windows, score_bank  # noqa: E402
from slmlab.transactions.heads.fraud import TransactionFraudConfig, TransactionFraudModel, training_windows  # noqa: E402
from slmlab.transactions.heads.joint import JointFraudHead, TabularInput, fit_normaliser, signed_log  # noqa: E402


def test_normaliser_matches_hand_computed_values():
    table = np.array([[0.0, np.nan, 5.0], [math.e - 1, np.nan, 5.0], [-(math.e - 1), np.nan, 5.0]], np.float32)
    center, scale = fit_normaliser(table, np.array([0, 1, 2]))
    # slog: 0, 1, -1 -> mean 0, population std sqrt(2/3); all-NaN column -> 0 / 1; constant column -> scale 1
    assert center[0] == pytest.approx(0.0, abs=1e-7) and scale[0] == pytest.approx(math.sqrt(2 / 3), rel=1e-6)
    assert (center[1], scale[1]) == (0.0, 1.0)
    assert center[2] == pytest.approx(math.log(6.0), rel=1e-6) and scale[2] == 1.0
    out = TabularInput(center, scale)(torch.tensor(table)[None])  # [1, 3, 6]: z then missing flags
    torch.testing.assert_close(out[0, :, 0], torch.tensor([0.0, 1.0, -1.0]) / math.sqrt(2 / 3), rtol=1e-5, atol=1e-6)
    assert (out[0, :, 1] == 0).all() and (out[0, :, 4] == 1).all()  # NaN -> z 0, flag 1
    assert (out[0, :, 3] == 0).all() and (out[0, :, 5] == 0).all() and (out[0, :, 2] == 0).all()
    assert signed_log(np.array([-3.0]))[0] == pytest.approx(-math.log(4.0))


def test_gather_rows_reads_the_table_and_zeroes_padding():
    table = np.arange(12, dtype=np.float32).reshape(6, 2)
    rows = np.array([[-1, -1, 2, 5], [0, 1, 2, 3]])
    got = gather_rows(table, rows).numpy()
    assert got.shape == (2, 4, 2)
    assert (got[0, :2] == 0).all() and (got[0, 2] == table[2]).all() and (got[0, 3] == table[5]).all()
    assert (got[1] == table[:4]).all()


def test_tabular_table_is_the_baselines_numeric_rolling_features(bank):
    names, table = tabular_table(bank)
    X = build_features(bank.df, None, rolling=True)
    assert names == tabular_columns(X)
    assert names == ["amount", "log_amount", "hour", "weekday", "distance_home", "count_1h", "sum_1h", "declines_1h",
                     "count_24h", "sum_24h", "declines_24h", "count_7d", "sum_7d", "count_30d", "sum_30d",
                     "amount_over_30d_mean", "amount_z_30d", "secs_since_prev", "new_merchant_id", "new_mcc",
                     "new_merchant_country", "new_device_id", "distinct_merchants_24h", "card_present_speed_kmh"]
    assert "mcc" not in names  # categorical fields reach the model as tokens
    assert table.shape == (len(bank.df), len(names)) and table.dtype == np.float32
    assert np.isfinite(table[~np.isnan(table)]).all()
    i = names.index("count_24h")
    np.testing.assert_array_equal(table[:, i], X["count_24h"].to_numpy(np.float32))
    with pytest.raises(ValueError, match="cannot give the tabular feature"):
        tabular_table(bank, ["count_24h", "no_such_feature"])


@pytest.fixture(scope="module")
def joint(bank):
    windows, fixed = training_windows(bank, 16, WindowOptions(), {"fraud_tabular": "rolling"})
    torch.manual_seed(0)
    cfg = TransactionFraudConfig.from_preset("lfm2_tiny", schema=bank.fitted, fraud_tabular="rolling", **fixed)
    return TransactionFraudModel(cfg).eval(), windows, fixed


def test_joint_config_builds_the_joint_head_and_validates(joint, bank):
    model, windows, fixed = joint
    assert isinstance(model.fraud_head, JointFraudHead)
    k = len(fixed["tabular_features"])
    assert model.fraud_head.mlp[0].in_features == 64 + 2 * k
    assert windows["train"].row_features is windows["validation"].row_features  # one table, shared
    with pytest.raises(ValueError, match="one value per tabular feature"):
        TransactionFraudConfig.from_preset("lfm2_tiny", tabular_features=["a", "b"], tabular_center=[0.0],
                                           tabular_scale=[1.0, 1.0])
    with pytest.raises(ValueError, match="fraud_tabular must be one of"):
        TransactionFraudConfig.from_preset("lfm2_tiny", fraud_tabular="all")


def test_the_head_reads_each_rows_own_features_and_needs_them(joint):
    model, windows, _ = joint
    batch = next(windows["validation"].batches(4))
    table = windows["validation"].row_features
    for b in range(len(batch)):  # brute force: every real position holds its bank row's features
        for t in range(batch.ids.shape[1]):
            r = batch.rows[b, t]
            want = np.zeros(table.shape[1], np.float32) if r < 0 else table[r]
            np.testing.assert_array_equal(batch.tabular[b, t].numpy(), want)
    with torch.no_grad():
        base = model(**batch.inputs()).logits
        other = batch.tabular.clone()
        other[:, -1] = other[:, -1] + 50.0
        moved = model(input_ids=batch.ids, attention_mask=batch.txn_mask, tabular=other).logits
    torch.testing.assert_close(moved[:, :-1], base[:, :-1], rtol=0, atol=0)  # a row's features: its score only
    assert not torch.allclose(moved[:, -1], base[:, -1])
    with pytest.raises(ValueError, match="needs `tabular`"):
        model(input_ids=batch.ids, attention_mask=batch.txn_mask)


def test_end_to_end_gradient_reaches_encoder_and_tabular_weights(joint):
    model, windows, _ = joint
    model.train()
    batch = next(windows["train"].batches(8))
    labels = torch.where(batch.txn_mask, (torch.arange(batch.ids.shape[1]) % 5 == 0).long(), torch.tensor(-100))
    model(**batch.inputs(), labels=labels).loss.backward()
    model.eval()
    w = model.fraud_head.mlp[0].weight.grad
    assert w is not None and w[:, 64:].abs().sum() > 0  # the tabular columns learn
    assert all(p.grad is not None for n, p in model.encoder.named_parameters() if p.requires_grad and "lm_heads" not in n)
    model.zero_grad()


def test_streaming_scores_equal_a_hand_gathered_forward_and_survive_save_load(joint, bank, tmp_path):
    model, _, _ = joint
    since = bank.cuts["test_start"]
    scores = score_bank(model, bank, since)
    w = bank_windows(model, bank, since)
    assert w.row_features is not None and np.isfinite(scores[~np.isnan(scores)]).all()
    _, table = tabular_table(bank, model.config.tabular_features)
    ref = np.full(len(bank.df), np.nan)
    for k in range(0, len(w), 11):  # every 11th window, its features gathered row by row
        tab = torch.zeros(1, *w.rows.shape[1:], table.shape[1])
        for t, r in enumerate(w.rows[k]):
            if r >= 0:
                tab[0, t] = torch.from_numpy(table[r])
        with torch.no_grad():
            p = torch.sigmoid(model(input_ids=torch.from_numpy(w.ids[k:k + 1]),
                                    attention_mask=torch.from_numpy(w.txn_mask[k:k + 1]), tabular=tab).logits[0])
        keep = np.arange(w.rows.shape[1]) >= w.score_from[k]
        keep &= w.txn_mask[k]
        ref[w.rows[k][keep]] = p.numpy()[keep]
    done = ~np.isnan(ref)
    assert done.sum() > 100
    np.testing.assert_allclose(scores[done], ref[done], rtol=0, atol=1e-6)
    model.save_pretrained(tmp_path / "m")
    again = TransactionFraudModel.from_pretrained(tmp_path / "m").eval()
    assert again.config.tabular_features == model.config.tabular_features
    np.testing.assert_allclose(score_bank(again, bank, since), scores, rtol=0, atol=1e-6, equal_nan=True)


def test_validation_sample_is_seeded_ordered_and_bounded(bank):
    w = bank.windows(16, 8, "validation")
    a, b = sample_windows(w, 10, seed=1), sample_windows(w, 10, seed=1)
    assert len(a) == 10 and (a.rows == b.rows).all()
    assert (np.diff(a.rows[:, -1]) != 0).all()
    assert sample_windows(w, None) is w and sample_windows(w, len(w) + 5) is w
    with pytest.raises(ValueError, match="at least 1 window"):
        sample_windows(w, 0)


def test_cli_finetunes_joint_fusion_and_scores(bank_data, tmp_path, capsys):
    export(bank_data, tmp_path / "bank", "csv")
    d = str(tmp_path / "bank")
    assert main(["transactions", "finetune", "--data", d, "--out", str(tmp_path / "ftj"), "--tabular", "rolling",
                 "--head-dropout", "0.2", "--val-windows", "20", "max_steps=2", "batch_size=4"]) == 0
    model = TransactionFraudModel.from_pretrained(str(tmp_path / "ftj" / "checkpoints" / "step_000002"))
    assert model.config.fraud_tabular == "rolling" and model.config.fraud_dropout == 0.2
    assert isinstance(model.fraud_head, JointFraudHead)
    assert main(["transactions", "score", "--data", d, "--model", str(tmp_path / "ftj"),
                 "--out", str(tmp_path / "s.csv")]) == 0
    assert (tmp_path / "s.csv").stat().st_size > 0


# -- evaluation: the booster cache, joint models as stacker inputs and under criterion 2 -----------------
def test_booster_cache_reads_back_identical_scores_and_misses_on_other_data(bank, tmp_path):
    import hashlib
    import json

    from slmlab.transactions.data.bank import Bank
    from slmlab.transactions.evaluation.baseline import HGB_PARAMS, cached_hgb_scores, data_key, hgb_scores

    first, info = cached_hgb_scores(bank, "hgb_raw", {"rolling": False}, tmp_path)
    assert info["cache"].startswith("wrote")
    again, info2 = cached_hgb_scores(bank, "hgb_raw", {"rolling": False}, tmp_path)
    assert info2["cache"].startswith("read") and info2["n_iter"] == info["n_iter"]
    np.testing.assert_array_equal(again, first)
    np.testing.assert_array_equal(first, hgb_scores(bank, rolling=False)[0])  # the cache changes nothing
    flipped = bank.df.copy()
    flipped.loc[flipped.index[0], "amount"] += 1.0  # one amount differs: another key, fitted anew
    other = Bank(flipped, bank.ids, bank.fitted, bank.cuts, bank.customers, bank.holdout)
    assert data_key(other) != data_key(bank)
    assert cached_hgb_scores(other, "hgb_raw", {"rolling": False}, tmp_path)[1]["cache"].startswith("wrote")
    assert len(list(tmp_path.glob("hgb_raw-*.npz"))) == 2
    # the file name's spec digest is the one caches were written under before cached_scores existed
    spec = hashlib.sha256(json.dumps(["hgb_raw", {"rolling": False}, HGB_PARAMS], sort_keys=True).encode())
    assert (tmp_path / f"hgb_raw-{data_key(bank)}-{spec.hexdigest()[:8]}.npz").is_file()


def test_joint_models_feed_the_stacker_and_can_be_the_primary_of_criterion_2(joint, bank, tmp_path):
    from slmlab.transactions.evaluation.evaluate import evaluate_models

    model, _, _ = joint
    plain = TransactionFraudModel(TransactionFraudConfig.from_preset("lfm2_tiny", schema=bank.fitted)).eval()
    result = evaluate_models(bank, plain, tmp_path, n_boot=20, models={"joint": model})
    assert {"stacked", "joint", "sequence", "token_lr"} <= set(result["models"])
    assert result["models"]["stacked"]["stacker"]["inputs"] == ["hgb_rolling", "sequence", "joint"]
    assert "sequence_scoring_all_rows" not in result["timings_s"]  # validation and test only
    crit = {c["criterion"]: c for c in result["criteria"]}
    assert crit["2 useful"]["difference"] == "stacked - hgb_rolling" and crit["2 useful"]["counted"]
    joint_c = crit["2 useful, secondary (joint)"]
    assert joint_c["difference"] == "joint - hgb_rolling" and joint_c["pr_auc_threshold"] == 0.03
    assert joint_c["counted"] is False and "joint - hgb_rolling" in result["bootstrap"]
    assert set(result["floor"]) == {"sequence", "joint"}
    again = evaluate_models(bank, plain, None, n_boot=5, models={"joint": model}, primary="joint")
    assert [c["criterion"] for c in again["criteria"] if c["criterion"].startswith("2")] == [
        "2 useful", "2 useful, secondary (stacked)"]


def test_cli_evaluate_with_also_cache_and_the_stacker(bank_data, tmp_path, capsys):
    export(bank_data, tmp_path / "bank", "csv")
    d = str(tmp_path / "bank")
    for out, extra in (("ft", []), ("ftj", ["--tabular", "rolling"])):
        assert main(["transactions", "finetune", "--data", d, "--out", str(tmp_path / out), *extra,
                     "max_steps=1", "batch_size=4"]) == 0
    args = ["transactions", "evaluate", "--data", d, "--model", str(tmp_path / "ft"), "--bootstrap", "10",
            "--cache", str(tmp_path / "cache"),
            "--also", f"joint={tmp_path / 'ftj'}"]
    assert main([*args, "--out", str(tmp_path / "r1")]) == 0
    report = (tmp_path / "r1" / "report.md").read_text()
    assert "| joint |" in report and "| stacked |" in report and "2 useful, secondary (joint)" in report
    assert len(list((tmp_path / "cache").glob("hgb_*.npz"))) == 3  # raw, rolling, rolling + risk
    assert len(list((tmp_path / "cache").glob("fraud_model-*.npz"))) == 2  # the sequence and joint models
    assert main([*args, "--out", str(tmp_path / "r2")]) == 0  # every score read back: the same report
    assert (tmp_path / "r2" / "report.md").read_text() == report
    capsys.readouterr()
    assert main(["transactions", "evaluate", "--data", d, "--out", str(tmp_path / "r3"), "--also", "joint"]) == 2
    assert "--also takes NAME=RUN" in capsys.readouterr().err


def test_demo_refuses_a_joint_model_with_a_reason(joint, bank_data, tmp_path):
    from slmlab.transactions.demo.state import load_state

    model, _, _ = joint
    model.save_pretrained(tmp_path / "ftj")
    export(bank_data, tmp_path / "bank", "csv")
    with pytest.raises(ValueError, match="joint-fusion model"):
        load_state(tmp_path / "ftj", tmp_path / "bank")
