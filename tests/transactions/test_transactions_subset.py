"""``slmlab transactions subset``: a bank of a slice of the sorted customer ids, e.g. a pretraining bank
disjoint from the customers a booster is fitted on."""

from __future__ import annotations

import json

import pytest

pd = pytest.importorskip("pandas")

from slmlab.cli import main  # noqa: E402
from slmlab.transactions.data.bank import export, load_bank, parse_customer_slice, subset_customers  # noqa: E402
from slmlab.transactions.data.synth import SynthConfig  # noqa: E402


def test_two_slices_partition_the_bank_and_keep_every_merchant(bank_data):
    ids = sorted(bank_data.transactions["customer_id"].unique())
    k = len(ids) // 3
    head, rest = subset_customers(bank_data, slice(None, k)), subset_customers(bank_data, slice(k, None))
    assert sorted(head.transactions["customer_id"].unique()) == ids[:k]
    assert sorted(rest.transactions["customer_id"].unique()) == ids[k:]
    for name in ("transactions", "customers", "fraud_cases"):
        whole = getattr(bank_data, name)
        parts = pd.concat([getattr(head, name), getattr(rest, name)])
        assert len(parts) == len(whole), name
        key = "transaction_id" if name == "transactions" else list(whole.columns)[0]
        assert set(parts[key]) == set(whole[key]), name
    pd.testing.assert_frame_equal(head.merchants, bank_data.merchants)
    # rows keep their values and their order
    tx = bank_data.transactions
    pd.testing.assert_frame_equal(head.transactions, tx[tx["customer_id"].isin(ids[:k])].reset_index(drop=True))


@pytest.mark.parametrize("text,want", [(":6500", slice(None, 6500)), ("6500:", slice(6500, None)),
                                       ("10:20", slice(10, 20)), (":", slice(None, None))])
def test_slice_text(text, want):
    assert parse_customer_slice(text) == want


@pytest.mark.parametrize("text", ["5", "a:b", "-1:", "1:2:3", ""])
def test_bad_slice_text_is_refused_with_the_form(text):
    with pytest.raises(ValueError, match="START:STOP"):
        parse_customer_slice(text)


def test_cli_writes_the_subset_and_records_it(bank_data, tmp_path, capsys):
    export(bank_data, tmp_path / "bank", "parquet", labels_separate=True, cfg=SynthConfig.from_preset("tiny", seed=3))
    assert main(["transactions", "subset", "--data", str(tmp_path / "bank"), "--customers", "5:",
                 "--out", str(tmp_path / "rest")]) == 0
    n = bank_data.transactions["customer_id"].nunique() - 5
    assert f"{n:,} customers" in capsys.readouterr().out
    manifest = json.loads((tmp_path / "rest" / "manifest.json").read_text())
    assert manifest["subset"] == {"source": str(tmp_path / "bank"), "customers": "5:", "n_customers": n}
    assert manifest["config"] == SynthConfig.from_preset("tiny", seed=3).to_dict()  # the generator that made the rows
    assert (tmp_path / "rest" / "labels.csv").is_file()  # the source's layout is kept
    got = load_bank(tmp_path / "rest").transactions
    assert got["customer_id"].nunique() == n and got["is_fraud"].notna().all()


def test_cli_refusals_exit_2_with_what_to_do(bank_data, tmp_path, capsys):
    export(bank_data, tmp_path / "bank", "csv")
    base = ["transactions", "subset", "--data", str(tmp_path / "bank")]
    assert main([*base, "--customers", "100000:", "--out", str(tmp_path / "none")]) == 2
    assert "selects none of the bank's" in capsys.readouterr().err
    assert main([*base, "--customers", "4", "--out", str(tmp_path / "x")]) == 2
    assert "START:STOP" in capsys.readouterr().err
    assert main([*base, "--customers", ":3", "--out", str(tmp_path / "bank")]) == 2  # not empty, no --force
    assert "--force" in capsys.readouterr().err


def test_a_failure_midway_leaves_no_partial_bank(bank_data, tmp_path, monkeypatch):
    from slmlab.transactions import pipeline

    export(bank_data, tmp_path / "bank", "parquet")

    def half_written(data, out, *args, **kwargs):
        (out / "transactions.parquet").write_bytes(b"partial")
        raise OSError("disk full")

    monkeypatch.setattr(pipeline, "export", half_written)
    with pytest.raises(OSError, match="disk full"):
        pipeline.subset_bank(tmp_path / "bank", tmp_path / "sub", ":5")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["bank"]  # no target, no temporary left behind
