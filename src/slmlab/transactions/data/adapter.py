"""Real exports -> the canonical transaction columns, driven by a ``column_map`` (YAML).

Keys of a column map:
    transaction_id: ``row_number`` to synthesise ids when the export has none.
    rename: ``{raw column: canonical column}``.
    timestamp: ``{column: X}`` (ISO text) or ``{from: [Year, Month, Day, Time]}``; ``tz_offset_min``.
    amount: ``{column: X, strip: "$"}``.
    values: per canonical column, ``{column, map, first_of, empty, us_states}``: take the first item of
        a ``first_of``-separated list, map it through ``map`` (US state codes -> ``us_states``), an
        empty cell becomes ``empty``; values outside the map are kept, so the schema tokenises them
        to UNK. A missing optional column tokenises to NONE.
Only ``transaction_id``, ``customer_id``, ``timestamp`` and ``amount`` are required.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import yaml

from .._deps import pd
from .schema import CONFIGS, check_columns

TABFORMER_MAP = CONFIGS / "tabformer_column_map.yaml"
US_STATES = set("AL AK AZ AR CA CO CT DE FL GA HI ID IL IN IA KS KY LA ME MD MA MI MN MS MO MT NE NV NH NJ NM NY NC ND "
                "OH OK OR PA RI SC SD TN TX UT VT VA WA WV WI WY DC".split())


def load_column_map(path: str | Path) -> dict:
    path = Path(path)
    if not path.is_file():
        raise FileNotFoundError(f"column map {path} does not exist")
    cmap = yaml.safe_load(path.read_text()) or {}
    if not isinstance(cmap, dict):
        raise ValueError(f"{path}: a column map is a mapping (keys rename, timestamp, amount, values)")
    return cmap


def _need(df: pd.DataFrame, cols: list[str], key: str) -> None:
    missing = [c for c in cols if c not in df.columns]
    if missing:
        raise ValueError(f"column map `{key}` names raw column(s) {missing} that the export lacks")


def apply_column_map(raw: pd.DataFrame, cmap: dict) -> pd.DataFrame:
    """The canonical table of ``raw`` under ``cmap`` (see the module docstring)."""
    out = pd.DataFrame(index=raw.index)
    for src, dst in (cmap.get("rename") or {}).items():
        _need(raw, [src], "rename")
        out[dst] = raw[src].astype(str) if dst in ("customer_id", "card_id", "merchant_id") else raw[src]
    ts = cmap.get("timestamp") or {}
    if "from" in ts:
        cols = list(ts["from"])
        _need(raw, cols, "timestamp.from")
        y, m, d, t = (raw[c] for c in cols)
        text = y.astype(str) + "-" + m.astype(str).str.zfill(2) + "-" + d.astype(str).str.zfill(2) + " " + t.astype(str)
        out["timestamp"] = pd.to_datetime(text, utc=True, errors="coerce")
    elif "column" in ts:
        _need(raw, [ts["column"]], "timestamp.column")
        out["timestamp"] = pd.to_datetime(raw[ts["column"]], utc=True, errors="coerce")
    if "tz_offset_min" in ts:
        out["tz_offset_min"] = np.int16(ts["tz_offset_min"])
    amt = cmap.get("amount") or {}
    if amt:
        _need(raw, [amt["column"]], "amount.column")
        col = raw[amt["column"]].astype(str)
        if amt.get("strip"):
            col = col.str.replace(str(amt["strip"]), "", regex=False)
        out["amount"] = pd.to_numeric(col.str.replace(",", "", regex=False), errors="coerce")
    for dst, spec in (cmap.get("values") or {}).items():
        if spec["column"] not in raw:
            continue  # optional: tokenises to NONE
        col = raw[spec["column"]]
        empty = col.isna() | (col.astype(str).str.strip() == "")
        text = col.astype(str).str.strip()
        if spec.get("first_of"):
            text = text.str.split(spec["first_of"]).str[0].str.strip()
        if spec.get("us_states"):
            text = text.where(~text.isin(US_STATES), spec["us_states"])
        mapping = spec.get("map") or {}
        mapped = text.map(lambda v, table=mapping: table.get(v, v))
        mapped = mapped.where(~empty, spec.get("empty"))
        out[dst] = mapped
    if cmap.get("transaction_id") == "row_number":
        out["transaction_id"] = np.arange(len(raw)).astype(str)
    if "is_fraud" in out:
        out["is_fraud"] = pd.to_numeric(out["is_fraud"], errors="coerce").fillna(0).astype(np.int8)
    check_columns(out)
    return out.reset_index(drop=True)


def read_export(path: str | Path, column_map: str | Path | dict) -> pd.DataFrame:
    """Read a CSV/Parquet export and map it to the canonical columns."""
    path = Path(path)
    if not path.is_file():
        raise FileNotFoundError(f"no export at {path}")
    raw = pd.read_parquet(path) if path.suffix == ".parquet" else pd.read_csv(path, dtype=str, keep_default_na=False)
    cmap = column_map if isinstance(column_map, dict) else load_column_map(column_map)
    return apply_column_map(raw, cmap)
