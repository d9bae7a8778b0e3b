"""Downstream heads: customer embedding (InfoNCE), window-level fraud, next-transaction forecast."""

from __future__ import annotations

import json
import math

import pytest
import torch
import torch.nn.functional as F

pytest.importorskip("pandas")
pytest.importorskip("sklearn")

from slmlab.cli import main  # noqa: E402
from slmlab.transactions.data.bank import export  # noqa: E402
from slmlab.transactions.heads.customer import (  # noqa: E402
    CustomerEmbeddingConfig,
    CustomerEmbeddingHead,
    CustomerEmbeddingModel,
    embed_windows,
    info_nce,
    window_pairs,
)
from slmlab.transactions.heads.forecast import (  # noqa: E402
    NextTransactionModel,
    forecast_metrics,
    forecast_targets,
)
from slmlab.transactions.heads.fraud import TransactionFraudModel  # noqa: E402
from slmlab.transactions.heads.sequence import (  # noqa: E402
    SequenceFraudConfig,
    SequenceFraudHead,
    SequenceFraudModel,
    window_labels,
)
from slmlab.transactions.model import TransactionEncoder, TxnEncoderConfig  # noqa: E402
from slmlab.transactions.training import finetune  # noqa: E402
from test_transactions import random_ids, tiny_model  # noqa: E402

NF = 15


def padded_batch(model, B=3, T=8, pad=(0, 3, 5), seed=0):
    """Random ids with ``pad[b]`` left-padded rows (all PAD) and their mask."""
    ids = random_ids(model, B, T, seed)
    mask = torch.ones(B, T, dtype=torch.bool)
    for b, n in enumerate(pad):
        ids[b, :n] = 0
        mask[b, :n] = False
    return ids, mask


def scramble_padding(model, ids, mask, seed=1):
    """The same windows with random ids in the padded rows (the mask still says padding)."""
    other = random_ids(model, *ids.shape[:2], seed=seed)
    return torch.where(mask[..., None], ids, other)


def check_all_gradients(model, loss):
    loss.backward()
    missing = [n for n, p in model.named_parameters() if p.requires_grad and (p.grad is None or not p.grad.abs().sum() > 0)]
    assert not missing, missing


# -- customer embedding ------------------------------------------------------------------------------
def test_customer_head_shapes_unit_norm_and_padding_invariance():
    enc = tiny_model()
    ids, mask = padded_batch(enc)
    head = CustomerEmbeddingHead(64, dim=32, num_features=NF)
    hidden = enc.backbone_forward(ids, mask)
    z = head(hidden, mask)
    assert z.shape == (3, 32)
    torch.testing.assert_close(z.norm(dim=-1), torch.ones(3), rtol=0, atol=1e-5)
    z2 = head(enc.backbone_forward(scramble_padding(enc, ids, mask), mask), mask)
    torch.testing.assert_close(z, z2, rtol=0, atol=1e-6)
    # the pooled vector is the mean of the real rows' summary states, by hand
    by_hand = torch.stack([hidden[b, NF - 1::NF][mask[b]].mean(0) for b in range(3)])
    torch.testing.assert_close(z, F.normalize(head.proj(by_hand), dim=-1), rtol=0, atol=1e-5)


def test_embed_windows_for_encoder_fraud_and_customer_models():
    enc = tiny_model()
    ids, mask = padded_batch(enc)
    fraud = TransactionFraudModel.from_encoder(enc).eval()
    cust = CustomerEmbeddingModel.from_encoder(enc, customer_dim=16).eval()
    a, b, c = (embed_windows(m, ids, mask) for m in (enc, fraud, cust))
    assert a.shape == b.shape == (3, 64) and c.shape == (3, 16)
    torch.testing.assert_close(a, b, rtol=0, atol=1e-6)  # same encoder weights, no trained head
    for z in (a, c):
        torch.testing.assert_close(z.norm(dim=-1), torch.ones(3), rtol=0, atol=1e-5)
    scrambled = scramble_padding(enc, ids, mask)
    torch.testing.assert_close(embed_windows(cust, scrambled, mask), c, rtol=0, atol=1e-6)
    torch.testing.assert_close(embed_windows(enc, ids), a, rtol=0, atol=1e-6)  # mask from the PAD rows


def test_info_nce_closed_form_and_minimal_for_identical_embeddings():
    B, tau = 4, 0.1
    z = torch.eye(8)[:B]
    want = math.log(1 + (B - 1) * math.exp(-1 / tau))  # diagonal 1/tau, off-diagonal 0
    assert abs(float(info_nce(z, z, tau)) - want) < 1e-5
    g = torch.Generator().manual_seed(0)
    z = F.normalize(torch.randn(6, 16, generator=g), dim=-1)
    same = float(info_nce(z, z))
    for _ in range(5):
        perm = torch.randperm(6, generator=g)
        if bool((perm == torch.arange(6)).all()):
            continue
        assert float(info_nce(z, z[perm])) > same
    noisy = F.normalize(z + 0.3 * torch.randn(6, 16, generator=g), dim=-1)
    assert float(info_nce(z, noisy)) > same
    with pytest.raises(ValueError, match="tau"):
        info_nce(z, z, 0.0)


def test_customer_model_pair_batch_loss_and_gradients():
    torch.manual_seed(0)
    model = CustomerEmbeddingModel(CustomerEmbeddingConfig.from_preset("lfm2_tiny", customer_dim=16)).train()
    enc = model.encoder
    ids = torch.stack([random_ids(enc, 4, 6, seed=1), random_ids(enc, 4, 6, seed=2)], 1)  # [4, 2, 6, F]
    mask = torch.ones(4, 2, 6 * NF, dtype=torch.long)
    out = model(input_ids=ids, attention_mask=mask, labels=torch.zeros(4))
    assert out.embeddings.shape == (4, 2, 16)
    torch.testing.assert_close(out.loss, info_nce(out.embeddings[:, 0], out.embeddings[:, 1]), rtol=0, atol=1e-6)
    check_all_gradients(model, out.loss)
    with pytest.raises(ValueError, match="pair batch"):
        model(input_ids=ids[:, :1, :, :, None])


# -- window-level fraud ------------------------------------------------------------------------------
def test_window_label_rule_on_hand_built_windows():
    T = 12
    mask = torch.ones(5, T, dtype=torch.bool)
    mask[:, :2] = False  # two padded rows: the 8 newest real rows are t = 4..11
    labels = torch.zeros(5, T, dtype=torch.long)
    labels[:, :2] = -1
    labels[0, 3] = 1      # an old fraud
    labels[1, 10] = 1     # a recent fraud
    labels[2, 3] = -1     # an old unknown label
    labels[4, 1] = 1      # a "fraud" in a padded row: not counted
    assert window_labels(labels, mask).tolist() == [1, 1, -100, 0, 0]
    assert window_labels(labels, mask, recent_k=8).tolist() == [0, 1, 0, 0, 0]
    assert window_labels(labels, mask, recent_k=9).tolist() == [1, 1, -100, 0, 0]
    with pytest.raises(ValueError, match="recent_k"):
        window_labels(labels, mask, recent_k=0)


def test_sequence_head_shapes_padding_gradients_and_loss_by_hand():
    torch.manual_seed(0)
    model = SequenceFraudModel(SequenceFraudConfig.from_preset("lfm2_tiny", pos_weight=3.0)).eval()
    enc = model.encoder
    ids, mask = padded_batch(enc)
    out = model(input_ids=ids, attention_mask=mask)
    assert out.logits.shape == (3,)
    again = model(input_ids=scramble_padding(enc, ids, mask), attention_mask=mask)
    torch.testing.assert_close(out.logits, again.logits, rtol=0, atol=1e-6)
    head = SequenceFraudHead(64, NF)
    empty = head(torch.randn(2, 4 * NF, 64), torch.zeros(2, 4, dtype=torch.bool))
    assert bool(torch.isfinite(empty).all())  # no real rows: zero pooled vectors, no NaN
    labels = torch.tensor([1, 0, -100])
    out = model(input_ids=ids, attention_mask=mask, labels=labels)
    want = F.binary_cross_entropy_with_logits(out.logits[:2], torch.tensor([1.0, 0.0]), pos_weight=torch.tensor(3.0))
    torch.testing.assert_close(out.loss, want, rtol=0, atol=1e-6)
    model.train()
    check_all_gradients(model, model(input_ids=ids, attention_mask=mask, labels=labels).loss)


# -- next-transaction forecast -----------------------------------------------------------------------
def test_forecast_target_alignment_on_a_hand_built_window():
    ids = torch.zeros(1, 5, NF, dtype=torch.long)
    ids[0, 2:, 7] = torch.tensor([10, 11, 12])  # rows 0-1 padded
    ids[0, 2:, :7] = 4
    mask = torch.tensor([[False, False, True, True, True]])
    tgt, valid = forecast_targets(ids, mask, 7)
    assert valid.tolist() == [[False, False, True, True, False]]
    assert tgt[0, 2:4].tolist() == [11, 12]


def test_forecast_model_shapes_loss_by_hand_and_gradients():
    torch.manual_seed(0)
    model = NextTransactionModel(TxnEncoderConfig.from_preset("lfm2_tiny")).eval()
    enc = model.encoder
    ids, mask = padded_batch(enc)
    out = model(input_ids=ids, attention_mask=mask, labels=ids)
    vs = enc.embedding.vocab_sizes
    for name, lg in out.logits.items():
        assert lg.shape == (3, 8, vs[enc.feature_names.index(name)])
    want = 0.0
    for name, lg in out.logits.items():
        f = enc.feature_names.index(name)
        terms = [F.cross_entropy(lg[b, t], ids[b, t + 1, f]) for b in range(3) for t in range(7)
                 if mask[b, t] and mask[b, t + 1]]
        want = want + torch.stack(terms).mean()
    torch.testing.assert_close(out.loss, want, rtol=0, atol=1e-5)
    again = model(input_ids=scramble_padding(enc, ids, mask), attention_mask=mask)
    for name in out.logits:
        torch.testing.assert_close(out.logits[name][mask], again.logits[name][mask], rtol=0, atol=1e-6)
    model.train()
    check_all_gradients(model, model(input_ids=ids, attention_mask=mask, labels=ids).loss)


def test_forecast_metrics_on_hand_made_logits():
    ids = torch.zeros(1, 4, 2, dtype=torch.long)
    ids[0, :, 0] = 4
    ids[0, :, 1] = torch.tensor([4, 5, 4, 7])  # targets of rows 0..2: 5, 4, 7
    mask = torch.ones(1, 4, dtype=torch.bool)
    probs = torch.full((1, 4, 8), 0.5 / 7)
    probs[0, 1] = 0.05
    probs[0, 2] = 0.01
    probs[0, 0, 5] = 0.5
    probs[0, 1, 6], probs[0, 1, 4] = 0.42, 0.28
    probs[0, 2, 2], probs[0, 2, 6], probs[0, 2, 7] = 0.45, 0.10, 0.40  # bimodal: argmax 2, median 6
    m = forecast_metrics({"amount": probs.log()}, ids, mask, {"amount": 1})
    close = dict(rel_tol=0, abs_tol=1e-5)
    assert m["n/amount"] == 3
    assert math.isclose(m["amount/top1"], 1 / 3, **close) and math.isclose(m["amount/top5"], 1.0, **close)
    assert math.isclose(m["amount/logloss"], -(math.log(0.5) + math.log(0.28) + math.log(0.4)) / 3, **close)
    assert math.isclose(m["amount/abs_bucket_error"], (0 + 2 + 1) / 3, **close)  # medians 5, 6, 6
    # history unigram: counts over rows 0..t, add-one over V = 8, ties to the lower id, PAD/MASK unranked
    assert math.isclose(m["history/amount/top1"], 1 / 3, **close)  # t1: 4 and 5 tie, 4 wins (right)
    assert math.isclose(m["history/amount/top5"], 2 / 3, **close)  # t0 ranks [4,2,3,5,6]; t2 misses 7
    assert math.isclose(m["history/amount/logloss"], (math.log(9) + math.log(5) + math.log(11)) / 3, **close)
    assert math.isclose(m["history/amount/abs_bucket_error"], (1 + 0 + 3) / 3, **close)  # medians 4, 4, 4
    assert math.isclose(m["loss"], m["amount/logloss"], **close) and math.isclose(m["acc"], 1 / 3, **close)


# -- fine-tuning through the harness, end to end -----------------------------------------------------------
STEPS = ["max_steps=2", "batch_size=8", "progress=false", "device=cpu"]


def test_window_pairs_are_disjoint_windows_of_one_customer(bank):
    cust = bank.df["customer_id"].astype(str).to_numpy()
    for split in ("train", "validation"):
        pairs = window_pairs(bank, 16, split)
        assert pairs.ids.shape[1:] == (2, 16, NF) and len(pairs) > 0
        rows = pairs.rows
        for older, newer, m_old, m_new in zip(rows[:, 0], rows[:, 1], pairs.txn_mask[:, 0], pairs.txn_mask[:, 1]):
            assert not set(older[m_old]) & set(newer[m_new])  # disjoint
            assert len({*cust[older[m_old]], *cust[newer[m_new]]}) == 1  # one customer
            assert older[m_old].max() + 1 == newer[m_new].min()  # adjacent
    val = window_pairs(bank, 16, "validation")
    newest = bank.df["timestamp"].iloc[val.rows[:, 1, -1]]
    assert bool((newest >= bank.cuts["val_start"]).all() and (newest < bank.cuts["val_end"]).all())


@pytest.mark.parametrize("head, cls, key", [("sequence", SequenceFraudModel, "pr_auc"),
                                            ("forecast", NextTransactionModel, "mcc/top1"),
                                            ("customer", CustomerEmbeddingModel, "retrieval_top1")])
def test_finetune_each_head_then_reload(bank, tmp_path, head, cls, key):
    encoder = TransactionEncoder(TxnEncoderConfig.from_preset("lfm2_tiny", schema=bank.fitted))
    recent_k = {"sequence_recent_k": 8} if head == "sequence" else {}
    trainer = finetune(bank, tmp_path, encoder if head == "forecast" else None, overrides=STEPS, head=head, **recent_k)
    ev = trainer.state.last_eval
    assert trainer.state.step == 2 and key in ev and math.isfinite(ev["loss"])
    loaded = cls.from_pretrained(str(tmp_path / "checkpoints" / "step_000002")).eval()
    trainer.model.eval()
    w = trainer.source.windows["validation"]
    ids, mask = torch.from_numpy(w.ids[:4]), torch.from_numpy(w.txn_mask[:4])
    if head == "customer":
        ids, mask = ids[:, 0], mask[:, 0]
        torch.testing.assert_close(embed_windows(loaded, ids, mask), embed_windows(trainer.model, ids, mask),
                                   rtol=0, atol=1e-6)
    else:
        a, b = loaded(input_ids=ids, attention_mask=mask).logits, trainer.model(input_ids=ids, attention_mask=mask).logits
        for x, y in zip(*(v.values() if isinstance(v, dict) else [v] for v in (a, b))):
            torch.testing.assert_close(x, y, rtol=0, atol=1e-6)
    assert loaded.config.freeze_backbone is False
    with pytest.raises(ValueError, match="unknown head"):
        finetune(bank, tmp_path, head="nope")


def test_cli_finetune_head_option(bank_data, tmp_path, capsys):
    export(bank_data, tmp_path / "bank", "parquet")
    common = ["--data", str(tmp_path / "bank"), "--threads", "1", "--device", "cpu"]
    assert main(["transactions", "finetune", *common, "--out", str(tmp_path / "seq"), "--head", "sequence",
                 "--recent-k", "8", "max_steps=2", "batch_size=8", "progress=false"]) == 0
    out = capsys.readouterr().out
    assert "fine-tuned the sequence head 2 steps" in out and "pr_auc" in out
    saved = json.loads((tmp_path / "seq" / "checkpoints" / "step_000002" / "config.json").read_text())
    assert saved["sequence_recent_k"] == 8 and saved["pos_weight"] >= 1
    assert main(["transactions", "finetune", *common, "--out", str(tmp_path / "x"), "--head", "sequence",
                 "--recent-k", "0"]) == 2
    assert "slmlab transactions: error: recent_k must be >= 1" in capsys.readouterr().err
