"""The demo's tab functions (slmlab.transactions.demo.tabs) on a tiny checkpoint, without a browser."""

from __future__ import annotations

import dataclasses
import json
import socket

import numpy as np
import pytest
import torch

pd = pytest.importorskip("pandas")
pytest.importorskip("sklearn")
threadpool_limits = pytest.importorskip("threadpoolctl").threadpool_limits
pytest.importorskip("matplotlib")

from slmlab.transactions import demo  # noqa: E402
from slmlab.transactions.data.schema import MASK  # noqa: E402

# a small bank (120 customers, 60 days) at a high fraud rate so that every split holds some fraud
BANK = dict(n_customers=120, n_days=60, n_physical_merchants=600, n_online_merchants=200, target_fraud_rate=0.01,
            seed=3)


@pytest.fixture(scope="module")
def state(tmp_path_factory):
    torch.manual_seed(0)
    with threadpool_limits(1):  # gradient boosting's OpenMP pool stalls when oversubscribed
        return demo.quick_state(tmp_path_factory.mktemp("demo"), pretrain_steps=3, finetune_steps=3,
                                synth_overrides=BANK, batch_size=8, stacked=False)  # stacked: its own slow test


@pytest.fixture(scope="module")
def cid(state):
    return state.customer_ids()[0]


def test_quick_state_scores_and_writes_a_checkpoint(state):
    assert set(state.test_scores) == {"hgb_raw", "hgb_rolling", "sequence"}
    assert {"generate_s", "train_s", "state_s"} <= set(state.timings)
    for s in state.test_scores.values():
        assert s.shape == state.test_y.shape and np.all((s >= 0) & (s <= 1))
    assert (state.paths["checkpoint"] / "schema.fitted.json").is_file()
    assert (state.paths["bank"] / "manifest.json").is_file()


@pytest.mark.slow
def test_stacked_model_scores_every_row(state):
    from slmlab.transactions.evaluation.baseline import hgb_scores
    from slmlab.transactions.evaluation.score import score_bank

    with threadpool_limits(1):
        scores = {"hgb_rolling": hgb_scores(state.bank, rolling=True)[0],
                  "sequence": score_bank(state.model, state.bank, state.bank.cuts["val_start"])}
        out = demo.stacked_model_scores(scores, state.bank)
    assert list(out) == ["stacked"]
    s = out["stacked"]
    test = state.bank.period_mask(state.bank.cuts["test_start"], None)
    assert s.shape == (len(state.bank.df),) and np.all((s[test] >= 0) & (s[test] <= 1))


@pytest.mark.slow
def test_reloaded_checkpoint_scores_the_same(state, cid):
    again = demo.load_state(state.paths["checkpoint"], state.paths["bank"], baselines=False)
    assert again.synth == state.synth and again.threshold == pytest.approx(state.threshold, abs=1e-6)
    np.testing.assert_allclose(again.test_scores["sequence"], state.test_scores["sequence"], rtol=1e-5, atol=1e-6)
    a, b = demo.score_view(state, cid), demo.score_view(again, cid)
    np.testing.assert_allclose(a.table["score"], b.table["score"], rtol=1e-5, atol=1e-6)


def test_data_view_columns_tokens_and_highlighting(state, cid):
    v = demo.data_view(state, cid, highlight_fraud=True)
    assert v.message == "" and 0 < len(v.table) <= demo.VIEW_ROWS
    names = state.model.encoder.feature_names
    assert {"#", "timestamp", "amount", "mcc", *(f"tok:{n}" for n in names), "is_fraud", "fraud_type"} <= set(v.table)
    assert v.table["#"].is_monotonic_increasing
    df = demo.customer_frame(state, cid)
    assert v.table["#"].iloc[-1] == len(df) - 1
    np.testing.assert_allclose(v.table["amount"].to_numpy(), df["amount"].tail(len(v.table)).to_numpy())
    assert v.fraud_rows == [i for i in range(len(v.table)) if v.table["is_fraud"].iloc[i] == 1]
    assert v.fraud_rows, "the first listed customer has a fraud in the test period"
    plain = demo.data_view(state, cid, highlight_fraud=False)
    assert plain.fraud_rows == [] and "is_fraud" not in plain.table
    assert v.map_fig is not None and v.hour_fig is not None
    hist = v.hour_fig.axes[0].patches
    assert sum(p.get_height() for p in hist[:24]) == len(v.table)  # one bar per hour, every shown transaction


def test_next_view_top5_sorted_probabilities_and_fixed_field(state, cid):
    v = demo.next_view(state, cid)
    assert v.message == "" and len(v.heads) == 15 and len(v.history_top) == 15
    for h in v.heads:
        assert list(h.columns) == ["rank", "id", "value", "probability", "history share"] and len(h) == 5
        p = h["probability"].to_numpy()
        assert np.all((p >= 0) & (p <= 1)) and np.all(np.diff(p) <= 0) and p.sum() <= 1 + 1e-6
        assert np.all((h["history share"] >= 0) & (h["history share"] <= 1))
    assert len(v.samples) == 5 and list(v.samples.columns) == list(state.model.encoder.feature_names)
    for h in v.history_top:  # the customer-history unigram: shares of the history's values
        assert np.all(np.diff(h["share"].to_numpy()) <= 0) and h["share"].sum() <= 1 + 1e-9
    mcc_id = int(v.heads[6]["id"].iloc[-1])  # force the 5th most likely mcc
    fixed = demo.next_view(state, cid, f"mcc={mcc_id}")
    assert fixed.fixed == {"mcc": mcc_id}
    value = state.fitted.decode(6, mcc_id).removeprefix("mcc ")
    assert (fixed.samples["mcc"] == value).all()
    for f in range(7):  # fields before mcc are conditioned on the same greedy choices
        np.testing.assert_allclose(fixed.heads[f]["probability"], v.heads[f]["probability"], rtol=1e-5, atol=1e-7)


def test_score_view_one_score_per_transaction_equal_to_own_window(state, cid):
    v = demo.score_view(state, cid)
    df = demo.customer_frame(state, cid)
    assert v.message == "" and len(v.table) == min(len(df), demo.VIEW_ROWS)
    assert {"#", "timestamp", "amount", "score", "alert", "injected"} <= set(v.table)
    s = v.table["score"].to_numpy(float)
    assert np.all(np.isfinite(s)) and np.all((s >= 0) & (s <= 1))
    assert (v.table["alert"] == (s >= state.threshold)).all()
    # the streaming scorer gives each transaction the score of a window holding >= T/2 earlier rows;
    # where it has the full T-1 (the window ending at it), it equals the one-window reference
    ids = demo.encode_history(state, df)
    full, tokens = demo.stream_scores(state.model, ids)
    T = state.T
    last = np.array([len(df) - 1])
    np.testing.assert_allclose(demo.window_scores(state.model, ids, last), full[last], rtol=1e-5, atol=1e-6)
    assert tokens == int(np.ceil(len(df) / (T // 2))) * T * 15
    assert v.tokens == tokens


def test_injected_sprees_are_appended_labelled_and_rescored(state, cid):
    df = demo.customer_frame(state, cid)
    inj = None
    for kind in demo.SPREES:
        before = 0 if inj is None else len(inj)
        inj, msg = demo.inject_spree(state, cid, kind, inj)
        assert kind.replace("_", " ") in msg
        new = inj.iloc[before:]
        assert len(new) >= 2 and (new["fraud_type"] == kind).all() and (new["is_fraud"] == 1).all()
        assert (new["timestamp"] > df["timestamp"].max()).all() and (new["customer_id"] == cid).all()
        assert not set(new["transaction_id"]) & set(df["transaction_id"])
    ls = inj[inj.fraud_type == "lost_stolen"]
    assert ((ls.amount >= 60) & (ls.amount < 100)).all() and (ls.entry_mode == "contactless").all()
    ato = inj[inj.fraud_type == "account_takeover"]
    assert (ato.entry_mode == "ecommerce").all() and ato.device_id.nunique() == 1
    v = demo.score_view(state, cid, inj)
    both = demo.customer_frame(state, cid, inj)
    assert len(both) == len(df) + len(inj)
    assert v.table["injected"].sum() == min(len(inj), demo.VIEW_ROWS)
    full, _ = demo.stream_scores(state.model, demo.encode_history(state, both))
    np.testing.assert_allclose(v.table["score"].to_numpy(float), full[-len(v.table):], rtol=1e-6)
    assert np.all((full >= 0) & (full <= 1))


def test_occlusion_deltas_match_rescoring_the_occluded_history(state, cid):
    table, msg = demo.occlusion_view(state, cid, top=5, per_target=3)
    assert msg == "" and len(table) == 15 and table["target #"].nunique() == 5
    df = demo.customer_frame(state, cid)
    ids = demo.encode_history(state, df)
    for _, r in table.iterrows():
        e, j = int(r["target #"]), int(r["occluded #"])
        assert j < e and e - j < state.T
        occluded = ids.copy()
        occluded[j] = MASK
        s = demo.window_scores(state.model, occluded, np.array([e]))[0]
        base = demo.window_scores(state.model, ids, np.array([e]))[0]
        assert r["occluded score"] == pytest.approx(s, abs=1e-6)
        assert r["target base score"] == pytest.approx(base, abs=1e-6)
        assert r["delta"] == pytest.approx(s - base, abs=1e-6)
    for _, g in table.groupby("target #", sort=False):
        assert np.all(np.diff(np.abs(g["delta"].to_numpy())) <= 1e-12)  # largest |delta| first


def test_similarity_view_neighbours_and_knn(state, cid):
    pytest.importorskip("slmlab.transactions.heads.customer")
    v = demo.similarity_view(state, cid)
    assert v.message == "" and len(v.neighbours) == 5 and cid not in set(v.neighbours["customer_id"])
    c = v.neighbours["cosine"].to_numpy()
    assert np.all(np.diff(c) <= 0) and np.all(c <= 1 + 1e-6)
    assert 0 <= v.knn_accuracy <= 1 and 0 < v.chance <= 1
    labels = np.array(["a", "a", "a", "b", "b", "b"])
    x = np.array([[1, 0], [1, .1], [1, -.1], [0, 1], [.1, 1], [-.1, 1]], float)
    assert demo.knn_accuracy(x, labels, k=2) == 1.0


def test_baselines_and_model_views(state):
    assert all(np.isfinite(t) for t in state.thresholds.values())  # set by validation negatives, never inf
    b = demo.baselines_view(state)
    if b.message:  # no test-period fraud in this bank
        assert b.table.empty
    else:
        assert list(b.table["model"]) == list(state.test_scores)
        rec = b.table.filter(like="recall ").to_numpy()
        assert rec.shape[1] >= 1 and np.all((rec >= 0) & (rec <= 1))
        assert np.all((b.table["pr_auc"] >= 0) & (b.table["pr_auc"] <= 1))
    m = demo.model_view(state)
    assert list(m.layers["type"]) == ["conv", "attn", "conv", "attn"]
    counts = dict(zip(m.params["part"], m.params["parameters"]))
    assert counts["embedding"] == 128_832 and counts["backbone"] == 254_976
    assert list(m.schema["vocab size"])[:3] == [26, 28, 11] and len(m.schema) == 15
    e = m.amount_edges
    assert e["from"].iloc[0] == 0 and np.isinf(e["to"].iloc[-1]) and (e["from"].to_numpy()[1:] == e["to"].to_numpy()[:-1]).all()


def test_bad_inputs_come_back_as_messages(state, cid):
    for view in (demo.data_view(state, "C999999"), demo.score_view(state, "C999999"), demo.next_view(state, "nobody"),
                 demo.similarity_view(state, "")):
        assert "not in the bank" in view.message
    assert "not a feature" in demo.next_view(state, cid, "colour=4").message
    assert "token id in [2, 128)" in demo.next_view(state, cid, "mcc=999").message
    inj, msg = demo.inject_spree(state, "C999999", "card_testing")
    assert inj is None and "not in the bank" in msg
    inj, msg = demo.inject_spree(state, cid, "skimming")
    assert inj is None and "unknown spree" in msg
    # a customer with a profile but no transactions: an empty history, sprees refused
    profiles = pd.concat([state.bank.customers, state.bank.customers.tail(1).assign(customer_id="C000999")])
    with_empty = dataclasses.replace(state, bank=dataclasses.replace(state.bank, customers=profiles))
    assert len(demo.customer_frame(with_empty, "C000999")) == 0
    inj, msg = demo.inject_spree(with_empty, "C000999", "lost_stolen")
    assert inj is None and "empty history" in msg
    assert "no transactions" in demo.next_view(with_empty, "C000999").message
    assert demo.score_view(with_empty, "C000999").table["score"].size == 0


def test_load_state_names_the_missing_fitted_schema(state, tmp_path):
    """No schema file: the schema recorded in the model's config tokenises the bank (here the bank is
    missing, so the next error is about the bank); with neither, the error names the file."""
    state.model.save_pretrained(tmp_path / "ckpt")
    with pytest.raises(FileNotFoundError, match="no transactions.parquet"):
        demo.load_state(tmp_path / "ckpt", tmp_path / "bank")
    config = json.loads((tmp_path / "ckpt" / "config.json").read_text())
    config["schema"]["fitted"] = None
    (tmp_path / "ckpt" / "config.json").write_text(json.dumps(config))
    with pytest.raises(ValueError, match="schema.fitted.json"):
        demo.load_state(tmp_path / "ckpt", tmp_path / "bank")


def test_occupied_port_is_refused_naming_it():
    from slmlab.transactions.demo.app import check_port

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        s.listen()
        port = s.getsockname()[1]
        with pytest.raises(ValueError, match=f"port {port} on 127.0.0.1 is in use"):
            check_port("127.0.0.1", port)


def test_quick_demo_removes_its_temporary_folder(monkeypatch, tmp_path):
    import tempfile
    from types import SimpleNamespace

    from slmlab.transactions import pipeline
    from slmlab.transactions.demo import app
    from slmlab.transactions.demo import state as state_mod

    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))
    seen = []

    def quick_state(work):
        (work / "bank").mkdir(parents=True)
        seen.append(work)
        return SimpleNamespace(timings={"generate_s": 0.0, "train_s": 0.0, "state_s": 0.0})

    monkeypatch.setattr(state_mod, "quick_state", quick_state)
    monkeypatch.setattr(app, "check_port", lambda host, port: None)
    monkeypatch.setattr(app, "launch", lambda state, host, port: "served")
    assert pipeline.demo(quick=True, log=lambda *_: None) == "served"
    assert seen[0].name.startswith("slmlab-demo-") and not seen[0].exists()
    monkeypatch.setattr(app, "launch", lambda state, host, port: (_ for _ in ()).throw(KeyboardInterrupt()))
    with pytest.raises(KeyboardInterrupt):  # Ctrl-C while serving: removed too
        pipeline.demo(quick=True, log=lambda *_: None)
    assert not seen[1].exists() and not list(tmp_path.glob("slmlab-demo-*"))
    kept = tmp_path / "mine"
    monkeypatch.setattr(app, "launch", lambda state, host, port: "served")
    pipeline.demo(quick=True, data=kept, log=lambda *_: None)
    assert (kept / "bank").is_dir()  # an explicit --data folder stays
