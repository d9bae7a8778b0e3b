"""Wide & deep fraud head (``fraud_wide: tokens``): warm-started from the per-row logistic regression, a
fine-tune starts from exactly the floor's scores; the deep head joins through a gate that starts at 0."""

from __future__ import annotations

import json

import numpy as np
import pytest
import torch

pytest.importorskip("sklearn")

from slmlab.cli import main  # noqa: E402
from slmlab.transactions.data.bank import export, labelled_split  # noqa: E402
from slmlab.transactions.data.windows import WindowOptions  # noqa: E402
from slmlab.transactions.heads.fraud import TransactionFraudConfig, TransactionFraudModel, warm_start  # noqa: E402
from slmlab.transactions.heads.wide import WideFraudHead, fit_row_logistic  # noqa: E402


def wide_model(bank, **kw):
    torch.manual_seed(0)
    config = TransactionFraudConfig.from_preset("lfm2_tiny", schema=bank.fitted, fraud_wide="tokens", **kw)
    return TransactionFraudModel(config).eval()


def test_a_warm_started_head_scores_every_row_as_the_regression(bank):
    model = wide_model(bank)
    k = model.encoder.score_index
    ids = np.asarray(bank.ids[:, :k + 1])
    tr, _, va, _ = labelled_split(bank)
    y = (ids[:, 0] % 3 == 0).astype(int)  # a label the tokens decide, with both classes in both splits
    fit = fit_row_logistic(ids, tr, y[tr], va, y[va], grid=(1.0,), c_max=1.0)
    model.fraud_head.load_logistic(fit)
    want = fit.model.decision_function(fit.onehot.transform(ids))
    windows = bank.windows(16, 8, "train")
    checked = 0
    with torch.no_grad():
        for batch in windows.batches(32):
            logits = model(**batch.inputs()).logits.numpy()
            rows, real = batch.host.rows, batch.txn_mask.numpy()
            np.testing.assert_allclose(logits[real], want[bank.df["row"].to_numpy()[rows[real]]], rtol=1e-5, atol=1e-4)
            checked += int(real.sum())
    assert checked > 1000


def test_the_deep_head_starts_at_zero_and_every_parameter_learns(bank):
    model = wide_model(bank).train()
    head = model.fraud_head
    out = head.deep.mlp[-1]
    assert isinstance(head, WideFraudHead) and out.weight.abs().sum().item() == 0 == out.bias.abs().sum().item()
    batch = next(bank.windows(16, 8, "train", labels=bank.labels(bank.cuts["train_end"])).batches(16))
    labels = torch.where(batch.txn_mask, (batch.ids[..., 0] % 2 == 0).long(), torch.full_like(batch.labels, -100))
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    for _ in range(2):  # the first step moves the output layer; then the deep head and encoder get gradient too
        opt.zero_grad()
        model(**batch.inputs(), labels=labels).loss.backward()
        opt.step()
    silent = [n for n, p in model.named_parameters() if p.requires_grad and (p.grad is None or not p.grad.abs().sum() > 0)]
    assert out.weight.abs().sum().item() > 0 and not [n for n in silent if not n.startswith("encoder.lm_heads")], silent


@pytest.mark.parametrize("kw", [{}, {"fraud_head_inputs": "both"}, {"fraud_head_inputs": "surprisal", "fraud_hidden": 0}])
def test_every_deep_head_adds_nothing_at_the_start(bank, kw):
    model = wide_model(bank, **kw)
    batch = next(bank.windows(16, 8, "train").batches(8))
    with torch.no_grad():
        model.fraud_head.bias.fill_(0.25)
        assert torch.equal(model(**batch.inputs()).logits, torch.full(batch.txn_mask.shape, 0.25))


def test_warm_start_fits_the_labelled_training_rows_only(bank):
    model = wide_model(bank)
    info = warm_start(model, bank, WindowOptions(1.0, 0.0, 1.0, 0))
    tr, y_tr, _, _ = labelled_split(bank)
    assert info["fit_rows"] == len(tr) and info["fit_frauds"] == int((y_tr == 1).sum())
    assert model.fraud_head.bias.item() != 0.0  # the intercept of the fit
    few = warm_start(wide_model(bank), bank, WindowOptions(1.0, 0.0, 0.2, 0))
    assert 0 < few["fit_rows"] < len(tr)
    plain = TransactionFraudModel(TransactionFraudConfig.from_preset("lfm2_tiny", schema=bank.fitted))
    assert warm_start(plain, bank, WindowOptions(1.0, 0.0, 1.0, 0)) == {}


def test_a_saved_wide_model_loads_with_the_same_logits(bank, tmp_path):
    model = wide_model(bank)
    with torch.no_grad():
        for table in model.fraud_head.wide:
            table.weight.normal_()
        head = model.fraud_head.deep.mlp[-1]
        head.weight.normal_()
    model.save_pretrained(tmp_path)
    again = TransactionFraudModel.from_pretrained(str(tmp_path)).eval()
    batch = next(bank.windows(16, 8, "train").batches(8))
    with torch.no_grad():
        torch.testing.assert_close(again(**batch.inputs()).logits, model(**batch.inputs()).logits, rtol=1e-5, atol=1e-5)
    assert json.loads((tmp_path / "config.json").read_text())["fraud_wide"] == "tokens"


def test_the_flag_is_refused_when_unknown_and_left_out_of_the_record_at_its_default(bank_data, tmp_path, capsys):
    with pytest.raises(ValueError, match="fraud_wide must be one of"):
        TransactionFraudConfig.from_preset("lfm2_tiny", fraud_wide="deep")
    export(bank_data, tmp_path / "bank", "parquet")
    base = ["transactions", "finetune", "--data", str(tmp_path / "bank"), "--threads", "1", "max_steps=2",
            "batch_size=4"]
    assert main([*base, "--out", str(tmp_path / "plain")]) == 0
    assert "fraud_wide" not in (tmp_path / "plain" / "run.yaml").read_text()  # older run folders resume unchanged
    assert not (tmp_path / "plain" / "initialised.json").exists()
    assert main([*base, "--out", str(tmp_path / "wide"), "--wide", "tokens"]) == 0
    assert "fraud_wide: tokens" in (tmp_path / "wide" / "run.yaml").read_text()
    assert "fit_rows" in json.loads((tmp_path / "wide" / "initialised.json").read_text())
    capsys.readouterr()
    with pytest.raises(SystemExit) as refused:
        main([*base, "--out", str(tmp_path / "x"), "--wide", "all"])
    assert refused.value.code == 2 and "invalid choice: 'all'" in capsys.readouterr().err
