"""Surprisal inputs of the fraud head: reference maths, causality, padding, config, save/load, CLI."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

pytest.importorskip("pandas")
pytest.importorskip("sklearn")

from slmlab.cli import main  # noqa: E402
from slmlab.transactions.data.bank import export  # noqa: E402
from slmlab.transactions.data.synth import SynthConfig, generate  # noqa: E402
from slmlab.transactions.heads.fraud import TransactionFraudConfig, TransactionFraudHead, TransactionFraudModel  # noqa: E402
from slmlab.transactions.heads.surprisal import SurprisalFraudHead, field_surprisal  # noqa: E402
from test_transactions import random_ids  # noqa: E402
from test_transactions_heads import padded_batch  # noqa: E402
from test_transactions_pipeline import SMALL  # noqa: E402

NF, SCORE = 15, 13


def fraud_model(inputs="surprisal", **kw) -> TransactionFraudModel:
    torch.manual_seed(0)
    return TransactionFraudModel(TransactionFraudConfig.from_preset("lfm2_tiny", fraud_head_inputs=inputs, **kw)).eval()


def reference_surprisal(encoder, ids, mask):
    """Every head at every position (the seed's ``per_feature_logits``), looked up one field at a time."""
    logits = encoder.per_feature_logits(ids, mask)
    B, T, _ = ids.shape
    out = torch.zeros(B, T, SCORE)
    for b in range(B):
        for t in range(T):
            for f in range(SCORE):
                p = t * NF + f - 1
                if not mask[b, t] or (f == 0 and (t == 0 or not mask[b, t - 1])):
                    continue
                out[b, t, f] = -F.log_softmax(logits[f][b, p], -1)[ids[b, t, f]]
    return out


def test_field_surprisal_matches_every_head_at_every_position():
    model = fraud_model()
    ids, mask = padded_batch(model.encoder, B=3, T=6, pad=(0, 2, 4))
    with torch.no_grad():
        hidden = model.encoder.backbone_forward(ids, mask)
        got = field_surprisal(model.encoder.lm_heads, hidden, ids, mask, SCORE)
        want = reference_surprisal(model.encoder, ids, mask)
    torch.testing.assert_close(got, want, rtol=0, atol=1e-5)
    assert (got[1, :2] == 0).all() and (got[2, :4] == 0).all()  # padded rows
    assert (got[:, :, 0][mask] > 0).sum() == int(mask.sum()) - 3  # every time gap but each first real row
    assert (got[:, :, 1:][mask] > 0).all()


def test_pad_and_mask_targets_have_no_surprisal():
    model = fraud_model()
    ids = random_ids(model.encoder, B=1, T=4, seed=3)
    ids[0, 2, 5], ids[0, 3, 7] = 0, 1  # a PAD and a MASK target inside real rows
    mask = torch.ones(1, 4, dtype=torch.bool)
    with torch.no_grad():
        s = field_surprisal(model.encoder.lm_heads, model.encoder.backbone_forward(ids, mask), ids, mask, SCORE)
    assert s[0, 2, 5] == 0 and s[0, 3, 7] == 0 and s[0, 2, 4] > 0


@pytest.mark.parametrize("inputs", ["surprisal", "both"])
def test_score_never_reads_its_response_code_or_later_transactions(inputs):
    model = fraud_model(inputs)
    ids = random_ids(model.encoder, B=1, T=6, seed=2)
    t = 3
    with torch.no_grad():
        base = model(ids).logits
        other = ids.clone()
        other[0, t, 14] = 4 if int(ids[0, t, 14]) != 4 else 5  # t's own response code
        other[0, t + 1:] = random_ids(model.encoder, B=1, T=6 - t - 1, seed=9)  # every later transaction
        out = model(other).logits
        torch.testing.assert_close(out[:, :t + 1], base[:, :t + 1], rtol=0, atol=1e-6)
        assert not torch.allclose(out[:, t + 1:], base[:, t + 1:])
        earlier = ids.clone()
        earlier[0, t, 7] = 4 if int(ids[0, t, 7]) != 4 else 5  # t's merchant: a field the score reads
        assert not torch.allclose(model(earlier).logits[:, t], base[:, t])


def test_surprisal_head_reads_only_fields_before_the_score_field():
    model = fraud_model("surprisal")
    ids = random_ids(model.encoder, B=1, T=4, seed=4)
    other = ids.clone()
    other[0, 2, SCORE] = 4 if int(ids[0, 2, SCORE]) != 4 else 5  # auth_method of t = 2
    with torch.no_grad():
        torch.testing.assert_close(model(other).logits[:, :3], model(ids).logits[:, :3], rtol=0, atol=1e-6)
        both = fraud_model("both")
        assert not torch.allclose(both(other).logits[:, 2], both(ids).logits[:, 2])  # the state sees it


def test_head_choice_config_errors_and_logistic_width():
    state = fraud_model("state")
    assert type(state.fraud_head) is TransactionFraudHead
    logistic = fraud_model("surprisal", fraud_hidden=0)
    assert isinstance(logistic.fraud_head, SurprisalFraudHead) and isinstance(logistic.fraud_head.mlp, torch.nn.Linear)
    assert logistic.fraud_head.mlp.in_features == SCORE
    assert fraud_model("both").fraud_head.mlp[0].in_features == SCORE + 64
    # the LM heads stay the encoder's: the head adds only its own MLP
    assert sum(p.numel() for p in logistic.fraud_head.parameters()) == SCORE + 1
    with pytest.raises(ValueError, match="fraud_head_inputs must be one of"):
        fraud_model("window")
    with pytest.raises(ValueError, match="fraud_hidden must be >= 0"):
        fraud_model("surprisal", fraud_hidden=-1)
    with pytest.raises(ValueError, match="needs the window's ids"):
        logistic.fraud_head(torch.zeros(1, 2 * NF, 64))


def test_linear_probe_trains_only_the_head_and_save_load_round_trip(tmp_path):
    model = fraud_model("both", freeze_backbone=True, pos_weight=3.0).train()
    ids, mask = padded_batch(model.encoder, B=3, T=5, pad=(0, 1, 3))
    labels = torch.tensor([[0, 1, 0, 0, 0], [-100, 0, 0, 1, 0], [-100, -100, -100, 0, 1]])
    model(ids, mask, labels=labels).loss.backward()
    trainable = {n for n, p in model.named_parameters() if p.requires_grad}
    assert trainable and all(n.startswith("fraud_head.mlp.") for n in trainable)
    assert all(p.grad is not None and p.grad.abs().sum() > 0 for n, p in model.named_parameters() if n in trainable)
    model.eval().save_pretrained(tmp_path)
    again = TransactionFraudModel.from_pretrained(tmp_path).eval()
    assert again.config.fraud_head_inputs == "both" and isinstance(again.fraud_head, SurprisalFraudHead)
    with torch.no_grad():
        torch.testing.assert_close(again(ids, mask).logits, model(ids, mask).logits, rtol=0, atol=1e-6)


def test_finetune_cli_with_surprisal_inputs(tmp_path, capsys):
    bank = tmp_path / "bank"
    export(generate(SynthConfig.from_preset("tiny", **{**SMALL, "n_customers": 40, "n_days": 30})), bank, "parquet")
    run = tmp_path / "ft"
    assert main(["transactions", "finetune", "--data", str(bank), "--out", str(run), "--threads", "1",
                 "--linear-probe", "--head-inputs", "surprisal", "--head-hidden", "0", "max_steps=2",
                 "batch_size=8"]) == 0
    assert "fine-tuned 2 steps" in capsys.readouterr().out
    model = TransactionFraudModel.from_pretrained(str(next(run.glob("checkpoints/step_*"))))
    assert model.config.fraud_head_inputs == "surprisal" and isinstance(model.fraud_head.mlp, torch.nn.Linear)
    with pytest.raises(SystemExit):
        main(["transactions", "finetune", "--data", str(bank), "--out", str(run), "--head-inputs", "window"])
