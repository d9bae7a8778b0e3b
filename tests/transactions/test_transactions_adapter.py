"""The real-export adapter: TabFormer's CSV layout through the shipped column map (nothing downloaded)."""

from __future__ import annotations

import numpy as np
import pytest

pd = pytest.importorskip("pandas")
pytest.importorskip("sklearn")

from slmlab.transactions.data.adapter import TABFORMER_MAP, load_column_map, read_export  # noqa: E402
from slmlab.transactions.model import preset_schema  # noqa: E402

# Ten rows in card_transaction.v1.csv's format (header and value spellings as in the public file).
TABFORMER_CSV = """User,Card,Year,Month,Day,Time,Amount,Use Chip,Merchant Name,Merchant City,Merchant State,Zip,MCC,Errors?,Is Fraud?
0,0,2002,9,1,06:21,$134.09,Swipe Transaction,3527213246127876953,La Verne,CA,91750.0,5300,,No
0,0,2002,9,1,06:42,$38.48,Swipe Transaction,-727612092139916043,Monterey Park,CA,91754.0,5411,,No
0,0,2002,9,2,06:22,$120.34,Chip Transaction,-727612092139916043,Monterey Park,CA,91754.0,5411,,No
0,0,2002,9,2,17:45,$128.95,Online Transaction,3414527459579106770,ONLINE,,,5651,,No
0,0,2002,9,3,06:23,$-104.71,Swipe Transaction,5817218446178736267,La Verne,CA,91750.0,5912,,No
1,0,2002,9,3,13:53,$1.12,Chip Transaction,-7146670748125200898,Rome,Italy,,5813,"Bad PIN,Insufficient Balance",No
1,0,2002,9,4,05:51,$43.41,Online Transaction,-1288082279022882052,ONLINE,,,5814,,Yes
1,0,2002,9,4,06:09,$99.00,Chip Transaction,2027553650310142703,Mira Loma,CA,91752.0,5541,Technical Glitch,No
1,1,2002,9,5,06:14,$7.27,Swipe Transaction,-6571010470072147219,Mira Loma,Atlantis,91752.0,5411,,Yes
1,1,2002,9,5,09:35,$6.67,Chip Transaction,-5475680618560174533,Mira Loma,CA,91752.0,5942,Bad Zipcode,No
"""


def test_tabformer_rows_map_to_the_canonical_columns(tmp_path):
    path = tmp_path / "card_transaction.v1.csv"
    path.write_text(TABFORMER_CSV)
    df = read_export(path, TABFORMER_MAP)
    assert len(df) == 10 and df["transaction_id"].tolist() == [str(i) for i in range(10)]
    assert str(df["timestamp"][0]) == "2002-09-01 06:21:00+00:00"
    np.testing.assert_allclose(df["amount"][:5], [134.09, 38.48, 120.34, 128.95, -104.71])
    assert df["entry_mode"].tolist()[:4] == ["swipe", "swipe", "chip", "ecommerce"]
    country = df["merchant_country"]
    assert country[6] is None or pd.isna(country[6])  # online: no state -> missing
    assert [country[i] for i in (4, 5, 7, 8)] == ["US", "IT", "US", "Atlantis"]
    assert df["response_code"].tolist()[4:8] == ["approved", "bad_pin", "approved", "technical_error"]
    assert df["response_code"][9] == "do_not_honor"
    assert df["is_fraud"].tolist() == [0, 0, 0, 0, 0, 0, 1, 0, 1, 0]
    schema = preset_schema("lfm2_tiny")
    fitted = schema.fit(df.iloc[:8])
    _, ids = fitted.encode_frame(df)
    for name in ("distance_home", "device_id", "currency", "auth_method"):  # absent in TabFormer: NONE
        assert (ids[:, schema.index(name)] == 3).all(), name
    country = ids[:, schema.index("merchant_country")]
    assert country[8] == 2  # "Atlantis": an unseen value -> UNK
    assert ids[:, schema.index("txn_type")][4] == 5  # negative amount -> refund (sign fallback)


def test_column_map_errors_name_what_is_missing(tmp_path):
    path = tmp_path / "export.csv"
    path.write_text(TABFORMER_CSV.replace("User,", "Person,"))
    with pytest.raises(ValueError, match=r"`rename` names raw column\(s\) \['User'\]"):
        read_export(path, TABFORMER_MAP)
    cmap = load_column_map(TABFORMER_MAP)
    cmap["rename"] = {k: v for k, v in cmap["rename"].items() if v != "customer_id"}
    path.write_text(TABFORMER_CSV)
    with pytest.raises(ValueError, match=r"required column\(s\) \['customer_id'\]"):
        read_export(path, cmap)
