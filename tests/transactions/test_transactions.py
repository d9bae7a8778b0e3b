"""Transaction encoder: schema, windows, structured embedding, tied heads, objective, fraud head."""

from __future__ import annotations

import subprocess
import sys

import numpy as np
import pytest
import torch
import yaml

pd = pytest.importorskip("pandas")
pytest.importorskip("sklearn")

from slmlab.transactions import (  # noqa: E402
    PerFeatureLMHeads,
    StructuredEmbedding,
    TransactionEncoder,
    TransactionFraudModel,
    TxnEncoderConfig,
    build_windows,
    load_schema,
)
from slmlab.transactions.data.schema import DEFAULT_SCHEMA, FittedSchema, blake_bucket  # noqa: E402
from slmlab.transactions.heads.fraud import TransactionFraudConfig  # noqa: E402

F = 15


def tiny_model(**kw) -> TransactionEncoder:
    return TransactionEncoder(TxnEncoderConfig.from_preset("lfm2_tiny", **kw)).eval()


def random_ids(model, B=2, T=6, seed=0) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed)
    cols = [torch.randint(4, v, (B, T, 1), generator=g) for v in model.embedding.vocab_sizes]
    return torch.cat(cols, -1)


def frame(n=8, **cols) -> pd.DataFrame:
    base = {
        "transaction_id": [f"t{i}" for i in range(n)], "customer_id": ["a"] * (n // 2) + ["b"] * (n - n // 2),
        "timestamp": pd.date_range("2024-01-01", periods=n, freq="7h", tz="UTC"),
        "amount": np.linspace(1, 100, n), "mcc": ([5411, 5812] * n)[:n],
        "merchant_id": [f"m{i % 3}" for i in range(n)], "entry_mode": ["chip"] * n,
        "auth_method": ["pin"] * n, "response_code": ["approved"] * n,
    }
    base.update(cols)
    return pd.DataFrame(base)


# -- schema -------------------------------------------------------------------------------------------
def test_schema_parses_with_the_documented_vocabulary_sizes():
    s = load_schema(features_per_transaction=15)
    assert s.num_features == 15 and s.score_feature == "auth_method" and s.score_index == 13
    assert s.vocab_sizes == (26, 28, 11, 35, 9, 10, 128, 4096, 64, 17, 32, 2048, 64, 10, 12)
    assert sum(s.vocab_sizes) == 6590 and s.offsets[:3] == (0, 26, 54)


@pytest.mark.parametrize("edit, message", [
    (lambda d: d["features"].__setitem__(1, {**d["features"][1], "name": "delta_t"}), r"features\[1\]\.name.*duplicates"),
    (lambda d: d["features"].pop(), r"`features` has 14 entries.*features_per_transaction is 15"),
    (lambda d: d["sequence"].__setitem__("score_feature", "nope"), r"sequence\.score_feature.*not a feature"),
    (lambda d: d["sequence"].__setitem__("score_feature", "response_code"), r"sequence\.score_feature.*last"),
    (lambda d: d["features"][2].__setitem__("encoding", {"kind": "magic"}), r"features\[2\]\.encoding\.kind"),
    (lambda d: d["features"][6]["encoding"].pop("top_k"), r"features\[6\]\.encoding\.top_k"),
])
def test_schema_validation_errors_name_the_yaml_key(tmp_path, edit, message):
    raw = yaml.safe_load(DEFAULT_SCHEMA.read_text())
    edit(raw)
    path = tmp_path / "schema.yaml"
    path.write_text(yaml.safe_dump(raw))
    with pytest.raises(ValueError, match=message):
        load_schema(path, features_per_transaction=15)


def test_encode_decode_round_trip_and_specials():
    schema = load_schema()
    df = frame(8, device_id=[None] * 8, currency=["USD"] * 7 + ["XYZ"])
    fitted = schema.fit(df.iloc[:7])
    _, ids = fitted.encode_frame(df)
    names = schema.names
    assert ids.dtype == np.int16 and ids.shape == (8, F)
    assert ids[0, names.index("delta_t")] == 3  # first transaction of the customer: NONE
    assert fitted.decode(names.index("delta_t"), int(ids[1, 0])) == "delta_t 14400–28800"  # 7 h
    assert fitted.decode(names.index("hour"), int(ids[1, 1])) == "hour 7"
    assert fitted.decode(names.index("entry_mode"), int(ids[0, 5])) == "entry_mode chip"
    assert fitted.decode(names.index("mcc"), int(ids[1, 6])) == "mcc 5812"
    assert (ids[:, names.index("device_id")] == 3).all()  # missing -> NONE
    assert ids[7, names.index("currency")] == 2  # unseen value -> UNK
    assert (ids[:, names.index("distance_home")] == 3).all()  # no lat/lon columns -> NONE
    amount_f = names.index("amount")
    for row in range(8):
        text = fitted.decode(amount_f, int(ids[row, amount_f]))
        lo, hi = (float(x) for x in text.split(" ")[1].split("–"))
        assert lo <= df["amount"][row] <= hi or (row == 7 and df["amount"][row] >= lo)
    with pytest.raises(ValueError, match="outside feature 'hour'"):
        fitted.decode(names.index("hour"), 99)
    saved = FittedSchema.from_dict(fitted.to_dict())
    assert (saved.encode_frame(df)[1] == ids).all()


def test_quantile_edges_come_from_training_rows_only():
    schema = load_schema()
    train = frame(8, amount=np.linspace(10, 100, 8))
    fitted = schema.fit(train)
    edges = fitted.fitted["amount"]["edges"]
    assert np.log1p(10) <= min(edges) and max(edges) <= np.log1p(100)
    test = frame(2, amount=[1e6, 0.5])
    ids = fitted.encode_frame(test)[1][:, schema.index("amount")]
    n_bins = len(edges) + 1
    assert ids[0] == 5 + n_bins - 1  # above the training range: last bin
    assert ids[1] == 5  # below: first real bin (id 4 is the ZERO token)
    assert fitted.encode_frame(frame(1, amount=[0.0]))[1][0, schema.index("amount")] == 4


def test_hash_buckets_are_identical_across_processes():
    here = [blake_bucket("card_txn_v1", "merchant_id", f"M{i}", 4092) for i in range(5)]
    code = ("from slmlab.transactions.data.schema import blake_bucket;"
            "print([blake_bucket('card_txn_v1', 'merchant_id', f'M{i}', 4092) for i in range(5)])")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True,
                         env={"PYTHONHASHSEED": "123", "PATH": ""})
    assert out.stdout.strip() == str(here)


def test_bad_tables_are_refused_with_the_row():
    schema = load_schema()
    with pytest.raises(ValueError, match=r"required column\(s\) \['amount'\]"):
        schema.fit(frame().drop(columns=["amount"]))
    with pytest.raises(ValueError, match="duplicate transaction_id 't0' at row 1"):
        schema.fit(frame(transaction_id=["t0"] * 8))
    ts = [str(t) for t in frame()["timestamp"]]
    ts[3] = "yesterday"
    with pytest.raises(ValueError, match="unparsable timestamp 'yesterday' at row 3"):
        schema.fit(frame(timestamp=ts))
    with pytest.raises(ValueError, match="not fitted"):
        schema.encode(frame())


# -- windows ------------------------------------------------------------------------------------------
def test_windows_left_pad_and_align_labels():
    enc = {"a": np.arange(1, 6)[:, None].repeat(F, 1) + 3, "b": np.arange(1, 12)[:, None].repeat(F, 1) + 3}
    labels = {"a": np.array([0, 0, 1, 0, 0], np.int8), "b": np.zeros(11, np.int8)}
    w = build_windows(enc, T=8, stride=4, labels=labels)
    assert len(w) == 2 + 3  # ends (1, 5) for a, (3, 7, 11) for b
    first = w.ids[1]
    assert (first[:3] == 0).all() and (first[3:, 0] == np.arange(4, 9)).all()  # newest at t = T-1
    assert w.txn_mask[1].tolist() == [False] * 3 + [True] * 5
    assert w.labels[1].tolist() == [-1, -1, -1, 0, 0, 1, 0, 0]
    assert w.rows[1].tolist() == [-1, -1, -1, 0, 1, 2, 3, 4]
    assert w.score_from[:2].tolist() == [7, 4]
    # every row of every customer is scored by exactly one window
    scored = np.concatenate([w.rows[i][w.score_from[i]:] for i in range(len(w))])
    assert sorted(scored.tolist()) == list(range(16))


# -- embedding and heads --------------------------------------------------------------------------------
def test_embedding_shape_padding_and_zero_rows():
    model = tiny_model()
    emb = model.embedding
    assert all(float(emb.table_weight(f)[0].detach().abs().sum()) == 0 for f in range(F))  # row 0 zero after construction
    ids = random_ids(model, B=2, T=5)
    ids[0, :2] = 0
    out = emb(ids)
    assert out.shape == (2, 5 * F, 64)
    assert float(out[0, : 2 * F].detach().abs().max()) == 0.0  # padded transactions are exact zeros
    manual = emb.table_weight(7)[ids[1, 3, 7]] + emb.feature_emb.weight[7] + emb.txn_index_emb.weight[3]
    torch.testing.assert_close(out[1, 3 * F + 7], manual, rtol=0, atol=1e-6)  # p = t*F + f
    with pytest.raises(ValueError, match="feature 'merchant_id' must lie in"):
        bad = ids.clone()
        bad[0, 0, 7] = 1020 + 4
        emb(bad)
    with pytest.raises(ValueError, match="T=17 exceeds max_transactions=16"):
        emb(random_ids(model, T=17))


def test_heads_are_tied_to_the_tables_and_strided_targets_match_every_head():
    model = tiny_model()
    heads: PerFeatureLMHeads = model.lm_heads
    for g in range(F):
        assert heads.head_weight(g).data_ptr() == model.embedding.table_weight(g).data_ptr()
    assert model.param_count()["lm_heads_tied"] == 0
    hidden = torch.randn(2, 4 * F, 64)
    full, strided = heads(hidden), heads.forward_targets(hidden)
    for g in range(F):
        positions = [p for p in range(4 * F - 1) if (p + 1) % F == g]
        torch.testing.assert_close(strided[g], full[g][:, positions], rtol=0, atol=1e-6)


def test_objective_on_a_hand_built_two_transaction_example():
    model = tiny_model()
    ids = random_ids(model, B=1, T=2, seed=3)
    ids[0, 1, 4] = 1  # a MASK target is ignored
    hidden = model.backbone_forward(ids)
    loss, stats = model.lm_heads.lm_loss(hidden, ids, names=model.feature_names)
    full = model.lm_heads(hidden)
    flat = ids.reshape(1, -1)
    per_feature = {g: [] for g in range(F)}
    for p in range(2 * F - 1):  # position p is scored by head (p+1) % F against token p+1
        g = (p + 1) % F
        if int(flat[0, p + 1]) in (0, 1):
            continue
        per_feature[g].append(torch.nn.functional.cross_entropy(full[g][0, p:p + 1], flat[0, p + 1:p + 2]))
    assert len(per_feature[0]) == 1  # the cross-transaction step: response_code(t=0) -> delta_t(t=1)
    assert len(per_feature[4]) == 1  # txn_type of t=1 was MASK: only t=0 counts
    expected = torch.stack([torch.stack(v).mean() for v in per_feature.values() if v]).mean()
    torch.testing.assert_close(loss, expected, rtol=1e-5, atol=1e-5)
    assert stats["delta_t"][2] == 1 and stats["hour"][2] == 2
    out = model(ids, labels=ids)
    torch.testing.assert_close(out.loss, loss)


def test_causality_perturbing_position_q_leaves_earlier_logits_unchanged():
    model = tiny_model()
    ids = random_ids(model, B=1, T=4, seed=1)
    base = torch.cat(model.per_feature_logits(ids), -1)
    for q in (5, 17, 31, 59):
        t, f = divmod(q, F)
        other = ids.clone()
        other[0, t, f] = 4 if int(ids[0, t, f]) != 4 else 5
        out = torch.cat(model.per_feature_logits(other), -1)
        torch.testing.assert_close(out[:, :q], base[:, :q], rtol=0, atol=1e-5)
        assert not torch.allclose(out[:, q:], base[:, q:])


def test_fraud_score_ignores_the_transactions_own_response_code():
    model = TransactionFraudModel(TxnEncoderConfig.from_preset("lfm2_tiny")).eval()
    ids = random_ids(model.encoder, B=1, T=5, seed=2)
    base = model(ids).logits
    other = ids.clone()
    other[0, 3, 14] = 4 if int(ids[0, 3, 14]) != 4 else 5
    out = model(other).logits
    torch.testing.assert_close(out[:, :4], base[:, :4], rtol=0, atol=1e-6)  # t = 3 and earlier unchanged
    assert not torch.allclose(out[:, 4], base[:, 4])  # the next transaction may read it
    labels = torch.tensor([[0, 1, -100, 0, 0]])
    loss = TransactionFraudModel(TransactionFraudConfig.from_preset("lfm2_tiny", pos_weight=2.0)).eval()(ids, labels=labels).loss
    assert torch.isfinite(loss)


@pytest.mark.parametrize("preset, emb, backbone", [("lfm2_small", 1_707_264, 6_627_712), ("lfm2_tiny", 128_832, 254_976)])
def test_parameter_counts_match_the_seed_and_the_spec(preset, emb, backbone):
    with torch.device("meta"):
        model = TransactionEncoder(TxnEncoderConfig.from_preset(preset))
    counts = model.param_count()
    assert counts == {"embedding": emb, "backbone": backbone, "lm_heads_tied": 0, "total_unique": emb + backbone}


def test_from_config_files_reads_the_seed_layout():
    with torch.device("meta"):
        model = TransactionEncoder.from_config_files()
    assert model.param_count()["total_unique"] == 8_334_976


def test_save_load_round_trip_and_schema_mismatch_refused(tmp_path):
    import json

    from transformers import AutoModel

    model = tiny_model()
    model.save_pretrained(tmp_path)
    again = AutoModel.from_pretrained(tmp_path).eval()
    ids = random_ids(model, T=3)
    torch.testing.assert_close(again.backbone_forward(ids), model.backbone_forward(ids), rtol=0, atol=0)
    cfg = json.loads((tmp_path / "config.json").read_text())
    cfg["schema"]["schema"]["features"][7]["encoding"]["buckets"] = 999  # tables no longer match
    (tmp_path / "config.json").write_text(json.dumps(cfg))
    with pytest.raises((ValueError, RuntimeError), match="merchant_id|size"):
        AutoModel.from_pretrained(tmp_path)


def test_embedding_module_alone():
    emb = StructuredEmbedding([6, 7], ["a", "b"], hidden_size=8, max_transactions=4)
    ids = torch.tensor([[[0, 0], [4, 5]]])
    out = emb(ids)
    assert out.shape == (1, 4, 8) and float(out[0, :2].abs().sum()) == 0


def test_focal_loss_by_hand_and_selected_by_the_config():
    from slmlab.transactions.heads.fraud import FocalLoss, WeightedBCE

    z = torch.tensor([[2.0, -1.0, 0.5]])
    y = torch.tensor([[1, 0, 0]])
    p = torch.sigmoid(z)
    pt = torch.where(y == 1, p, 1 - p)
    w = torch.where(y == 1, torch.tensor(3.0), torch.tensor(1.0))
    torch.testing.assert_close(WeightedBCE(3.0)(z, y), -w * pt.log())
    torch.testing.assert_close(FocalLoss(3.0, gamma=2.0)(z, y), -w * (1 - pt) ** 2 * pt.log())
    torch.testing.assert_close(FocalLoss(3.0, gamma=0.0)(z, y), WeightedBCE(3.0)(z, y))
    big = torch.tensor([[40.0, -40.0]])  # confident and right: no NaN, ~0
    assert torch.isfinite(FocalLoss(1.0)(big, torch.tensor([[1, 0]]))).all()
    bce = TransactionFraudModel(TransactionFraudConfig.from_preset("lfm2_tiny", pos_weight=2.0)).eval()
    focal = TransactionFraudModel(TransactionFraudConfig.from_preset("lfm2_tiny", pos_weight=2.0, fraud_loss="focal"))
    focal.load_state_dict(bce.state_dict())  # the loss holds no weights
    focal.eval()
    ids = random_ids(bce.encoder, B=1, T=5, seed=2)
    labels = torch.tensor([[0, 1, -100, 0, 0]])
    with torch.no_grad():
        a, b = bce(ids, labels=labels), focal(ids, labels=labels)
    torch.testing.assert_close(a.logits, b.logits)
    assert isinstance(focal.loss_fn, FocalLoss) and 0 < float(b.loss) < float(a.loss)
    with pytest.raises(ValueError, match="fraud_loss"):
        TransactionFraudConfig.from_preset("lfm2_tiny", fraud_loss="hinge")
