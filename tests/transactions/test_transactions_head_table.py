"""The one table of fine-tuning heads (``HEADS``): the CLI offers exactly its names, each spec builds its
model from a tiny config and makes its labels, head options live in the head's own config, and
checkpoints from before the heads had their own configs still load."""

from __future__ import annotations

import argparse
import dataclasses
import json

import pytest
import torch

pytest.importorskip("pandas")
pytest.importorskip("sklearn")

from slmlab.cli import main  # noqa: E402
from slmlab.commands.transactions import HeadNames  # noqa: E402
from slmlab.transactions import heads  # noqa: E402
from slmlab.transactions.data.windows import WindowOptions  # noqa: E402
from slmlab.transactions.heads import HEAD_FLAGS, HEADS, HeadFlag, HeadSpec, head_spec  # noqa: E402
from slmlab.transactions.heads.fraud import TransactionFraudConfig, TransactionFraudModel  # noqa: E402
from slmlab.transactions.model import LEGACY_HEAD_FIELDS, TransactionEncoder, TxnEncoderConfig, TxnHeadConfig  # noqa: E402
from test_transactions import random_ids  # noqa: E402


def test_the_cli_head_choices_are_the_table(capsys):
    assert list(HeadNames()) == list(HEADS) == ["transaction", "sequence", "forecast", "customer"]
    for name in HEADS:
        assert name in HeadNames()
    assert "nope" not in HeadNames()
    with pytest.raises(SystemExit):
        main(["transactions", "finetune", "--help"])
    assert "one of transaction, sequence, forecast, customer" in " ".join(capsys.readouterr().out.split())
    with pytest.raises(SystemExit) as exit_:
        main(["transactions", "finetune", "--data", "x", "--out", "y", "--head", "nope"])
    assert exit_.value.code == 2
    err = capsys.readouterr().err
    assert "invalid choice: 'nope'" in err and all(name in err for name in HEADS)
    with pytest.raises(ValueError, match="unknown head 'nope'; use one of transaction, sequence, forecast, customer"):
        head_spec("nope")


def test_a_head_flag_is_an_argparse_option_that_sets_one_config_field():
    flag = HeadFlag("head_inputs", "fraud_head_inputs", "what the head reads", default="state",
                    choices=("state", "both"))
    parser = argparse.ArgumentParser(exit_on_error=False)
    flag.add_to(parser)
    assert flag.flag == "--head-inputs"
    assert parser.parse_args([]).head_inputs == "state"
    assert parser.parse_args(["--head-inputs", "both"]).head_inputs == "both"
    with pytest.raises(argparse.ArgumentError, match="invalid choice: 'nope'"):
        parser.parse_args(["--head-inputs", "nope"])
    typed = argparse.ArgumentParser()
    HeadFlag("recent_k", "sequence_recent_k", "K", int).add_to(typed)
    assert typed.parse_args(["--recent-k", "8"]).recent_k == 8 and typed.parse_args([]).recent_k is None


def test_the_finetune_options_are_the_rows_flags(capsys, monkeypatch):
    assert HEAD_FLAGS == tuple(flag for spec in HEADS.values() for flag in spec.flags)
    assert len({flag.option for flag in HEAD_FLAGS}) == len(HEAD_FLAGS)  # an option belongs to one head
    assert HEADS["transaction"].cli_options == {
        "loss": "fraud_loss", "focal_gamma": "focal_gamma", "head_inputs": "fraud_head_inputs",
        "head_hidden": "fraud_hidden", "head_dropout": "fraud_dropout", "tabular": "fraud_tabular",
        "wide": "fraud_wide"}
    assert HEADS["sequence"].cli_options == {"recent_k": "sequence_recent_k"}
    # a new row's flag is a finetune option, with nothing else to register
    toy = HeadFlag("toy_width", "toy_width", "width of the toy head", int, 3)
    monkeypatch.setattr(heads, "HEAD_FLAGS", (*HEAD_FLAGS, toy))
    with pytest.raises(SystemExit):
        main(["transactions", "finetune", "--help"])
    text = " ".join(capsys.readouterr().out.split())
    for flag in (*HEAD_FLAGS, toy):
        assert flag.flag in text and " ".join(flag.help.split()) in text
    with pytest.raises(SystemExit) as exit_:
        main(["transactions", "finetune", "--data", "x", "--out", "y", "--toy-width", "wide"])
    assert exit_.value.code == 2 and "--toy-width: invalid int value: 'wide'" in capsys.readouterr().err


@pytest.mark.parametrize("name", list(HEADS))
def test_each_spec_builds_its_model_from_a_tiny_config_and_makes_its_labels(name):
    spec = HEADS[name]
    assert isinstance(spec, HeadSpec) and spec.name == name and head_spec(name) is spec
    assert spec.config_class is spec.model_class.config_class and issubclass(spec.config_class, TxnHeadConfig)
    assert spec.config_fields == spec.config_class.HEAD_FIELDS
    assert set(spec.cli_options.values()) <= set(spec.config_fields)  # each CLI option sets a field of this head
    assert set(spec.data_options) <= {f.name for f in dataclasses.fields(WindowOptions)}
    torch.manual_seed(0)
    config = spec.config_class.from_preset("lfm2_tiny")
    for field in spec.config_fields:  # the head's options are fields of its own config, not the encoder's
        assert hasattr(config, field) and not hasattr(TxnEncoderConfig.from_preset("lfm2_tiny"), field)
    model = spec.model_class(config).eval()
    assert isinstance(model.encoder, TransactionEncoder) and model.config.model_type == spec.config_class.model_type
    ids = random_ids(model.encoder, B=3, T=5, seed=1)
    mask = torch.ones(3, 5, dtype=torch.bool)
    mask[0, :2] = False
    ids[0, :2] = 0
    row_labels = torch.tensor([[-1, -1, 0, 1, 0], [0, 0, 0, 0, 0], [0, -1, 0, 0, 1]])
    labels = spec.labels(ids, mask, row_labels, config=model.config)
    if name == "customer":  # pair batches: two windows per customer
        ids, mask = torch.stack([ids, ids.roll(1, 0)], 1), torch.stack([mask, mask.roll(1, 0)], 1)
    out = model(input_ids=ids, attention_mask=mask, labels=labels)
    assert out.loss is not None and bool(torch.isfinite(out.loss))


def test_head_options_live_in_the_head_config_and_are_validated():
    with pytest.raises(ValueError, match="fraud_loss"):
        TransactionFraudConfig.from_preset("lfm2_tiny", fraud_loss="hinge")
    with pytest.raises(ValueError, match="recent_k must be >= 1"):
        HEADS["sequence"].config_class.from_preset("lfm2_tiny", sequence_recent_k=0)
    with pytest.raises(ValueError, match="customer_tau must be > 0"):
        HEADS["customer"].config_class.from_preset("lfm2_tiny", customer_tau=0.0)
    # an encoder config holds no head option; a head config built from it gets the head's defaults
    enc = TxnEncoderConfig.from_preset("lfm2_tiny")
    assert not set(enc.to_dict()) & set(LEGACY_HEAD_FIELDS)
    fraud = TransactionFraudConfig.from_config(enc, pos_weight=4.0)
    assert (fraud.pos_weight, fraud.fraud_loss, fraud.freeze_backbone) == (4.0, "bce", False)
    # another head's config converts to this head's: its encoder part only
    customer = HEADS["customer"].config_class.from_preset("lfm2_tiny", customer_dim=8, freeze_backbone=True)
    other = TransactionFraudModel(customer)
    assert isinstance(other.config, TransactionFraudConfig) and not hasattr(other.config, "customer_dim")
    assert other.config.freeze_backbone and not any(p.requires_grad for p in other.encoder.parameters())


def test_a_checkpoint_from_before_the_head_configs_loads(tmp_path):
    """Old checkpoints: ``model_type`` ``slmlab_txn_encoder`` and every head option in the config."""
    from transformers import AutoModel

    torch.manual_seed(0)
    model = TransactionFraudModel(TransactionFraudConfig.from_preset("lfm2_tiny", pos_weight=2.5)).eval()
    model.save_pretrained(tmp_path)
    cfg = json.loads((tmp_path / "config.json").read_text())
    cfg.update(model_type="slmlab_txn_encoder", fraud_loss="focal", focal_gamma=1.0, fraud_head_inputs="state",
               fraud_hidden=None, fraud_dropout=0.1, freeze_backbone=False, pos_weight=2.5)
    (tmp_path / "config.json").write_text(json.dumps(cfg))
    again = TransactionFraudModel.from_pretrained(tmp_path).eval()
    assert isinstance(again.config, TransactionFraudConfig) and again.config.model_type == "slmlab_txn_fraud"
    assert (again.config.pos_weight, again.config.fraud_loss, again.config.focal_gamma) == (2.5, "focal", 1.0)
    ids = random_ids(model.encoder, B=2, T=4)
    with torch.no_grad():
        torch.testing.assert_close(again(ids).logits, model(ids).logits, rtol=0, atol=0)
    encoder = AutoModel.from_pretrained(tmp_path)  # the old head options are ignored by the encoder
    assert isinstance(encoder, TransactionEncoder)
    fresh = TransactionFraudModel.from_encoder(encoder)  # ... and a new head takes its own from them
    assert fresh.config.fraud_loss == "focal" and fresh.config.model_type == "slmlab_txn_fraud"


def test_the_fraud_head_options_keep_the_order_run_yaml_records():
    """run.yaml lists the head options in the rows' order; a reorder would change every new run folder's
    bytes against older ones (the order before the rows: loss, focal gamma, inputs, hidden, tabular,
    dropout; then ``wide``, recorded only when set: its row omits its default)."""
    from slmlab.transactions.heads import HEADS

    assert list(HEADS["transaction"].cli_options) == ["loss", "focal_gamma", "head_inputs", "head_hidden", "tabular",
                                                      "head_dropout", "wide"]
    assert [flag.option for flag in HEADS["transaction"].flags if flag.omit_default] == ["wide"]
