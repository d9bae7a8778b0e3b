"""The real-data path, proven on a file in IBM TabFormer's ``card_transaction.v1.csv`` layout (made here, in
code): the shipped column map reads it (every amount and time spelling of the format), ``map_export`` writes it
as a bank folder, and ``slmlab transactions pretrain -> finetune -> evaluate -> score`` run on it end to end."""

from __future__ import annotations

import json
import re

import numpy as np
import pytest

pd = pytest.importorskip("pandas")
pytest.importorskip("sklearn")

from slmlab.cli import main  # noqa: E402
from slmlab.transactions.data.adapter import (  # noqa: E402
    TABFORMER_MAP,
    load_column_map,
    map_export,
    parse_amounts,
    read_export,
    timestamps_from_parts,
)
from slmlab.transactions.data.bank import split_cuts  # noqa: E402
from slmlab.transactions.data.schema import FittedSchema, sort_transactions  # noqa: E402
from slmlab.transactions.evaluation.evaluate import verdict  # noqa: E402

HEADER = ["User", "Card", "Year", "Month", "Day", "Time", "Amount", "Use Chip", "Merchant Name", "Merchant City",
          "Merchant State", "Zip", "MCC", "Errors?", "Is Fraud?"]
CITIES = [("La Verne", "CA", "91750.0"), ("Monterey Park", "CA", "91754.0"), ("Mira Loma", "CA", "91752.0"),
          ("Houston", "TX", "77002.0"), ("Brooklyn", "NY", "11201.0"), ("Chicago", "IL", "60601.0")]
MCCS = ["5411", "5812", "5541", "5912", "4829", "5300", "5814", "5651"]
ERRORS = ["Insufficient Balance,", "Bad PIN,", "Technical Glitch,", "Bad PIN,Insufficient Balance,", "Bad CVV,"]
N_DAYS = 120
START = pd.Timestamp("2019-01-01")


def tabformer_frame(n_users: int = 240, seed: int = 0) -> pd.DataFrame:
    """A deterministic export in TabFormer's layout and spellings: ``$134.09`` / ``$-77.00`` /
    ``$1,234.56`` amounts, ``HH:MM`` times, three ``Use Chip`` values, empty ``Merchant State`` and ``Zip``
    for online rows, ``Errors?`` mostly empty, ``Is Fraud?`` Yes/No. One user in four has a fraud spree
    (online, night-time, large amounts, abroad half the time), their days spread over the whole range, so
    the train, validation and test periods each hold several."""
    rng = np.random.default_rng(seed)
    merchants = rng.integers(-(2**62), 2**62, size=400)
    rows = []

    def add(user, card, when, amount, chip, merchant, city, state, zip_, mcc, error, fraud):
        text = f"${amount:,.2f}" if abs(amount) >= 1000 else f"${amount:.2f}"  # "$-77.00": sign after the symbol
        rows.append([user, card, when.year, when.month, when.day, when.strftime("%H:%M"), text, chip, merchant, city,
                     state, zip_, mcc, error, "Yes" if fraud else "No"])

    for user in range(n_users):
        home = CITIES[user % len(CITIES)]
        favourites = rng.choice(merchants[:300], size=6, replace=False)
        n = int(rng.integers(25, 45))
        days = np.sort(rng.uniform(0, N_DAYS, n))
        for d in days:
            when = START + pd.Timedelta(days=float(d))
            when = when.replace(hour=int(rng.integers(7, 22)))
            online = rng.random() < 0.15
            chip = "Online Transaction" if online else ("Chip Transaction" if rng.random() < 0.7 else "Swipe Transaction")
            amount = float(np.round(rng.lognormal(3.3, 0.8), 2)) * (-1 if rng.random() < 0.03 else 1)
            error = str(rng.choice(ERRORS)) if rng.random() < 0.03 else ""
            city, state, zip_ = ("ONLINE", "", "") if online else home
            add(user, int(rng.integers(0, 2)), when, amount, chip, int(rng.choice(favourites)), city, state, zip_,
                str(rng.choice(MCCS)), error, False)
        if user % 4 == 0:  # a spree: 3-6 online or foreign transactions in a few hours at night
            day = (user // 4 * 7.3 + 3) % (N_DAYS - 2)
            first = START + pd.Timedelta(days=float(int(day))) + pd.Timedelta(hours=1)
            for k in range(int(rng.integers(3, 7))):
                when = first + pd.Timedelta(minutes=int(17 * k + rng.integers(0, 10)))
                abroad = k % 2 == 1
                add(user, 0, when, float(np.round(rng.uniform(400, 2500), 2)),
                    "Chip Transaction" if abroad else "Online Transaction", int(rng.choice(merchants[300:])),
                    "Rome" if abroad else "ONLINE", "Italy" if abroad else "", "", "5732" if abroad else "5816",
                    "", True)
    df = pd.DataFrame(rows, columns=HEADER)
    order = np.lexsort((df["Time"], df["Day"], df["Month"], df["Year"], df["User"]))  # as the file: user, then time
    return df.iloc[order].reset_index(drop=True)


@pytest.fixture(scope="module")
def tabformer_bank(tmp_path_factory):
    root = tmp_path_factory.mktemp("tabformer")
    csv = root / "card_transaction.v1.csv"
    raw = tabformer_frame()
    raw.to_csv(csv, index=False)
    df = map_export(csv, TABFORMER_MAP, root / "bank")
    return root, raw, df


def test_the_generated_file_has_tabformer_s_spellings(tabformer_bank):
    root, raw, _ = tabformer_bank
    head = (root / "card_transaction.v1.csv").read_text().splitlines()[0]
    assert head == ",".join(HEADER[:12]) + ",MCC,Errors?,Is Fraud?"
    amounts = raw["Amount"]
    assert amounts.str.startswith("$").all() and amounts.str.startswith("$-").any() and amounts.str.contains(",").any()
    assert raw["Time"].str.fullmatch(r"\d\d:\d\d").all()
    assert set(raw["Use Chip"]) == {"Swipe Transaction", "Chip Transaction", "Online Transaction"}
    assert set(raw["Is Fraud?"]) == {"Yes", "No"}
    assert (raw["Zip"] == "").any() and (raw["Errors?"] == "").mean() > 0.9


def test_tabformer_export_maps_to_a_bank_with_fraud_in_every_period(tabformer_bank):
    root, raw, df = tabformer_bank
    assert len(df) == len(raw) and df["customer_id"].nunique() == 240
    amount_text = raw["Amount"].str.replace("$", "", regex=False).str.replace(",", "", regex=False).astype(float)
    np.testing.assert_allclose(df["amount"], amount_text)
    assert (df["amount"] < 0).sum() == raw["Amount"].str.startswith("$-").sum() > 0
    first = raw.iloc[0]
    assert df["timestamp"][0] == pd.Timestamp(f"{first.Year}-{first.Month:02d}-{first.Day:02d} {first.Time}", tz="UTC")
    assert df["is_fraud"].sum() == (raw["Is Fraud?"] == "Yes").sum()
    assert set(df["entry_mode"]) == {"swipe", "chip", "ecommerce"}
    assert df["merchant_country"][raw["Merchant State"] == ""].isna().all()
    assert set(df["merchant_country"].dropna()) == {"US", "IT"}
    assert (df["response_code"] == "approved").mean() > 0.9
    assert set(df["response_code"]) <= {"approved", "insufficient_funds", "bad_pin", "technical_error", "bad_cvv"}
    cuts = split_cuts(df)
    for lo, hi in (("start", "train_end"), ("val_start", "val_end"), ("test_start", "end")):
        period = (df["timestamp"] >= cuts[lo]) & (df["timestamp"] < cuts[hi])
        assert df["is_fraud"][period].sum() >= 5, (lo, hi)
    manifest = json.loads((root / "bank" / "manifest.json").read_text())
    assert manifest["rows"]["transactions"] == len(df) and manifest["customers"] == 240


def test_pretrain_finetune_evaluate_score_run_on_the_mapped_export(tabformer_bank, tmp_path, capsys):
    root, raw, df = tabformer_bank
    bank, pre, ft, rep, scores = (str(root / "bank"), str(tmp_path / "pre"), str(tmp_path / "ft"), str(tmp_path / "rep"),
                                  str(tmp_path / "scores.csv"))
    tiny = ["max_steps=2", "batch_size=8", "eval_batch_size=64"]
    assert main(["transactions", "pretrain", "--data", bank, "--preset", "lfm2_tiny", "--out", pre, "--threads", "1",
                 *tiny]) == 0
    assert main(["transactions", "finetune", "--data", bank, "--encoder", pre, "--out", ft, "--threads", "1", *tiny]) == 0
    assert main(["transactions", "evaluate", "--data", bank, "--model", ft, "--out", rep, "--threads", "1",
                 "--bootstrap", "30"]) in (0, 1)
    assert main(["transactions", "score", "--data", bank, "--model", ft, "--out", scores, "--threads", "1"]) == 0
    out = capsys.readouterr().out
    assert "pretrained 2 steps" in out and "fine-tuned 2 steps" in out and "# Fraud evaluation" in out

    fitted = FittedSchema.load(pre)
    assert set(fitted.trained_columns()) >= {"amount", "timestamp", "entry_mode", "mcc", "merchant_id",
                                             "merchant_country", "response_code"}
    assert not {"device_id", "currency", "auth_method", "merchant_lat", "txn_type"} & set(fitted.trained_columns())
    _, ids = fitted.encode_frame(df)
    names = fitted.schema.names
    for name in ("distance_home", "device_id", "currency", "auth_method"):  # absent in TabFormer: all NONE
        assert (ids[:, names.index(name)] == 3).all(), name
    refund = ids[:, names.index("txn_type")] == 4 + 1  # sign of the amount: "$-77.00" -> refund
    assert refund.sum() == (df["amount"] < 0).sum()

    metrics = json.loads((tmp_path / "rep" / "metrics.json").read_text())
    test = df["timestamp"] >= split_cuts(df)["test_start"]
    assert metrics["n_test"] == int(test.sum()) and metrics["n_test_fraud"] == int(df["is_fraud"][test].sum()) >= 5
    base_rate = metrics["n_test_fraud"] / metrics["n_test"]
    models = metrics["models"]
    assert set(models) == {"hgb_raw", "hgb_rolling", "hgb_rolling_risk", "token_lr", "sequence", "stacked"}
    for name, m in models.items():
        assert 0 < m["pr_auc"] <= 1 and 0 < m["roc_auc"] <= 1, name
        lo, hi = metrics["bootstrap"][name]["pr_auc"]
        assert lo < hi or lo == hi == m["pr_auc"], name  # the resamples vary, unless every one ranks perfectly
    assert models["hgb_raw"]["pr_auc"] > 5 * base_rate  # night-time, large, online/abroad sprees: easy for trees
    for name in ("hgb_raw", "hgb_rolling", "hgb_rolling_risk"):  # no coordinates: no distance (it once crashed the fit)
        assert metrics["hgb"][name]["empty_features_left_out"] == ["distance_home"], name
    assert [c["criterion"] for c in metrics["criteria"]] == ["1 parity", "2 useful", "3 strong"]
    for c in metrics["criteria"]:  # each verdict is its CI's, against its own margin
        assert c["verdicts"]["pr_auc"] == verdict(c["pr_auc_ci"], c["pr_auc_threshold"]), c["criterion"]
        assert c["pr_auc_ci"] == metrics["bootstrap"][c["difference"]]["pr_auc"], c["criterion"]
    assert (tmp_path / "rep" / "report.md").read_text().startswith("# Fraud evaluation")

    scored = pd.read_csv(scores, dtype={"transaction_id": str})
    assert len(scored) == len(df) and set(scored["transaction_id"]) == set(df["transaction_id"])
    assert scored["score"].between(0, 1).all()


# -- value level: every spelling of the format ------------------------------------------------------------
def test_every_amount_spelling_reads():
    text = pd.Series(["$134.09", "$1,234.56", "$-77.00", "-$77.00", " $12 ", "($3.50)", "0", "$12,345,678.90"])
    assert parse_amounts(text, "$").tolist() == [134.09, 1234.56, -77.0, -77.0, 12.0, -3.5, 0.0, 12345678.9]
    assert parse_amounts(pd.Series(["EUR 5", "€-6.00", "-€1,000"]), ["EUR", "€"]).tolist() == [5.0, -6.0, -1000.0]
    assert parse_amounts(pd.Series([1.5, -2.0])).tolist() == [1.5, -2.0]  # a Parquet export's numbers


@pytest.mark.parametrize("bad", ["abc", "", "$1.2.3", "USD 3"])
def test_an_unreadable_amount_is_refused_with_its_row(bad):
    with pytest.raises(ValueError, match=rf"amount text {re.escape(repr(bad))} at row 1 .*cannot be read; write amounts"):
        parse_amounts(pd.Series(["$1.00", bad]), "$")


def test_every_time_spelling_reads():
    raw = pd.DataFrame({"Y": ["2002", "2002.0", "2019", "2020"], "M": ["9", "09", "12", "2"],
                        "D": ["1", "1", "31", "29"], "T": ["6:05", "06:21:33", "23:59", "00:00"]})
    ts = timestamps_from_parts(raw, ["Y", "M", "D", "T"])
    assert [str(t) for t in ts] == ["2002-09-01 06:05:00+00:00", "2002-09-01 06:21:33+00:00",
                                    "2019-12-31 23:59:00+00:00", "2020-02-29 00:00:00+00:00"]
    assert str(timestamps_from_parts(raw, ["Y", "M", "D"])[2]) == "2019-12-31 00:00:00+00:00"


@pytest.mark.parametrize("time_text", ["24:00", "6", "06:60", "ab:cd", "6:05 PM"])
def test_an_impossible_time_is_refused_with_its_row(time_text):
    raw = pd.DataFrame({"Y": ["2002", "2002"], "M": ["9", "9"], "D": ["1", "1"], "T": ["06:00", time_text]})
    with pytest.raises(ValueError, match=r"timestamp.from \['Y', 'M', 'D', 'T'\]: '2002 9 1 .*' at row 1"):
        timestamps_from_parts(raw, ["Y", "M", "D", "T"])
    with pytest.raises(ValueError, match=r"'2002 9 31 06:00' at row 0"):  # September has 30 days
        timestamps_from_parts(pd.DataFrame({"Y": ["2002"], "M": ["9"], "D": ["31"], "T": ["06:00"]}), ["Y", "M", "D", "T"])


def _rows(times, fraud=None):
    n = len(times)
    return pd.DataFrame({"User": ["0"] * n, "Card": ["0"] * n, "Year": ["2002"] * n, "Month": ["9"] * n,
                         "Day": ["1"] * n, "Time": times, "Amount": [f"${i}.00" for i in range(n)],
                         "Use Chip": ["Chip Transaction"] * n, "Merchant Name": ["1"] * n, "Merchant City": ["a"] * n,
                         "Merchant State": ["CA"] * n, "Zip": [""] * n, "MCC": ["5411"] * n, "Errors?": [""] * n,
                         "Is Fraud?": fraud or ["No"] * n})


def test_same_minute_rows_keep_the_file_order(tmp_path):
    path = tmp_path / "same_minute.csv"
    _rows(["06:21"] * 12).to_csv(path, index=False)
    df = read_export(path, TABFORMER_MAP)
    assert df["transaction_id"].tolist() == [f"{i:02d}" for i in range(12)]
    ordered = sort_transactions(df)  # ties broken by transaction_id: must be the file order
    assert ordered["amount"].tolist() == [float(i) for i in range(12)]


def test_an_unmapped_fraud_label_is_refused_not_read_as_legitimate(tmp_path):
    path = tmp_path / "labels.csv"
    _rows(["06:21", "06:22", "06:23"], fraud=["No", "yes", "Yes"]).to_csv(path, index=False)
    with pytest.raises(ValueError, match=r"fraud label column 'Is Fraud\?' holds \['yes'\] \(1 row\(s\)\).*"
                                         r"`values.is_fraud.map`"):
        read_export(path, TABFORMER_MAP)
    cmap = load_column_map(TABFORMER_MAP)
    cmap["values"]["is_fraud"]["map"]["yes"] = 1
    assert read_export(path, cmap)["is_fraud"].tolist() == [0, 1, 1]
