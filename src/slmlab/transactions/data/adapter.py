"""Real exports -> the canonical transaction columns, driven by a ``column_map`` (YAML).

Keys of a column map:
    transaction_id: ``row_number`` to synthesise ids when the export has none (zero-padded to one width,
        so that their text order is the file's order: same-minute rows keep it when sorted).
    rename: ``{raw column: canonical column}``.
    timestamp: ``{column: X}`` (ISO text) or ``{from: [Year, Month, Day, Time]}`` (``Time`` as ``H:MM``,
        ``HH:MM`` or ``HH:MM:SS``; numbers may be written ``2002.0``; the time column may be left out);
        ``tz_offset_min``.
    amount: ``{column: X, strip: "$"}``: every ``strip`` text (a string or a list) removed, thousands
        commas and spaces dropped; the sign may stand before or after the symbol (``$-5.00``,
        ``-$5.00``) and ``($5.00)`` is negative.
    values: per canonical column, ``{column, map, first_of, empty, us_states}``: take the first item of
        a ``first_of``-separated list, map it through ``map`` (US state codes -> ``us_states``), an
        empty cell becomes ``empty``; values outside the map are kept, so the schema tokenises them
        to UNK. A missing optional column tokenises to NONE. ``is_fraud`` is the exception: after its
        map every value must be 0 or 1 (an empty cell is 0); any other value is refused, never read
        as legitimate.
Only ``transaction_id``, ``customer_id``, ``timestamp`` and ``amount`` are required. A timestamp or
amount that cannot be read raises a ``ValueError`` naming the row and the raw text.
:func:`map_export` writes a mapped export as a bank folder that every ``slmlab transactions`` command reads.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import yaml

from ...outputs import dumps_finite
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
        out["timestamp"] = timestamps_from_parts(raw, cols)
    elif "column" in ts:
        _need(raw, [ts["column"]], "timestamp.column")
        out["timestamp"] = pd.to_datetime(raw[ts["column"]], utc=True, errors="coerce")
    if "tz_offset_min" in ts:
        out["tz_offset_min"] = np.int16(ts["tz_offset_min"])
    amt = cmap.get("amount") or {}
    if amt:
        _need(raw, [amt["column"]], "amount.column")
        out["amount"] = parse_amounts(raw[amt["column"]], amt.get("strip"), amt["column"])
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
        out["transaction_id"] = row_ids(len(raw))
    if "is_fraud" in out:
        out["is_fraud"] = fraud_labels(out["is_fraud"], (cmap.get("values") or {}).get("is_fraud", {}).get("column"))
    check_columns(out)
    return out.reset_index(drop=True)


def row_ids(n: int) -> np.ndarray:
    """``"0".."n-1"`` zero-padded to one width: their text order is the row order (``"10" < "9"`` otherwise,
    and the schema breaks same-timestamp ties by ``transaction_id``)."""
    width = len(str(max(n - 1, 0)))
    return np.array([f"{i:0{width}d}" for i in range(n)], dtype=object)


def _first_bad(bad: np.ndarray, what: str, values: pd.Series, advice: str) -> None:
    if bad.any():
        i = int(np.flatnonzero(bad)[0])
        raise ValueError(f"{what} {values.iloc[i]!r} at row {i} ({int(bad.sum())} such row(s)) cannot be read; {advice}")


def parse_amounts(col: pd.Series, strip=None, name: str = "amount") -> pd.Series:
    """Amount text -> float: ``strip`` (a currency symbol, or a list of them) removed wherever it stands,
    thousands commas and spaces dropped, ``($5.00)`` negative; ``$1,234.56``, ``$-77.00``, ``-$77.00``,
    `` $12 `` and ``134.09`` all read. An empty or unreadable cell raises a ``ValueError`` naming its row."""
    if col.dtype.kind in "if":
        values = col.astype(float)
        _first_bad(values.isna().to_numpy(), f"{name} column value", col,
                   "every transaction needs an amount: drop or fill those rows")
        return values
    raw = col.astype(str)
    text = raw.str.strip()
    paren = text.str.startswith("(") & text.str.endswith(")")
    text = text.where(~paren, text.str.slice(1, -1))
    for symbol in [strip] if isinstance(strip, str) else list(strip or []):
        text = text.str.replace(str(symbol), "", regex=False)
    text = text.str.replace(",", "", regex=False).str.replace(" ", "", regex=False)
    values = pd.to_numeric(text, errors="coerce").astype(float)
    values = values.where(~paren, -values.abs())
    _first_bad(values.isna().to_numpy(), f"{name} text", raw,
               f"write amounts as numbers with an optional currency symbol (`amount.strip`: {strip!r}), e.g. $1,234.56"
               " or $-5.00, and drop or fill empty cells")
    return values


def timestamps_from_parts(raw: pd.DataFrame, cols: list[str]) -> pd.Series:
    """UTC timestamps from ``[year, month, day]`` or ``[year, month, day, time]`` columns; the time is
    ``H:MM``, ``HH:MM`` or ``HH:MM:SS``, numbers may carry a ``.0``. A row that is not a real date and
    time raises a ``ValueError`` naming the row and its raw values."""
    if len(cols) not in (3, 4):
        raise ValueError(f"column map `timestamp.from` lists {cols}; give [Year, Month, Day] or [Year, Month, Day, Time]")

    def number(c: str) -> pd.Series:
        return pd.to_numeric(raw[c].astype(str).str.strip(), errors="coerce")

    parts = {"year": number(cols[0]), "month": number(cols[1]), "day": number(cols[2])}
    if len(cols) == 4:
        hms = raw[cols[3]].astype(str).str.strip().str.split(":")
        n = hms.str.len()
        for k, key in enumerate(("hour", "minute", "second")):
            parts[key] = pd.to_numeric(hms.str[k], errors="coerce")
        parts["second"] = parts["second"].where(n != 2, 0.0)
        ok = n.isin([2, 3]) & parts["hour"].between(0, 23) & parts["minute"].between(0, 59) & parts["second"].between(0, 59)
    else:
        ok = pd.Series(True, index=raw.index)
    frame = pd.DataFrame(parts)
    whole = (frame.notna().all(axis=1) & (frame.fillna(0) % 1 == 0).all(axis=1) & ok).to_numpy()
    ts = pd.Series(pd.NaT, index=raw.index, dtype="datetime64[ns, UTC]")
    if whole.any():  # an impossible date (September 31) stays NaT
        ts[whole] = pd.to_datetime(frame[whole].astype(np.int64), errors="coerce", utc=True)
    bad = ts.isna().to_numpy()
    if bad.any():
        i = int(np.flatnonzero(bad)[0])
        shown = " ".join(str(raw[c].iloc[i]) for c in cols)
        raise ValueError(f"timestamp.from {cols}: {shown!r} at row {i} ({int(bad.sum())} such row(s)) cannot be read;"
                         " each row needs a real date and a time written H:MM, HH:MM or HH:MM:SS")
    return ts


def fraud_labels(col: pd.Series, column: str | None = None) -> pd.Series:
    """``is_fraud`` after the column map: 0/1 (numbers or their text), an empty cell 0; any other value
    (an unmapped ``yes``) raises instead of being read as legitimate."""
    empty = col.isna() | (col.astype(str).str.strip() == "")
    values = pd.to_numeric(col.where(~empty, 0), errors="coerce")
    bad = ~values.isin([0, 1]).to_numpy()
    if bad.any():
        seen = sorted({str(v) for v in col[bad]})[:5]
        raise ValueError(f"fraud label column {column or 'is_fraud'!r} holds {seen} ({int(bad.sum())} row(s)), neither"
                         " 0/1 nor mapped to them; add those values to the column map's `values.is_fraud.map`")
    return values.astype(np.int8)


def read_export(path: str | Path, column_map: str | Path | dict) -> pd.DataFrame:
    """Read a CSV/Parquet export and map it to the canonical columns."""
    path = Path(path)
    if not path.is_file():
        raise FileNotFoundError(f"no export at {path}")
    raw = pd.read_parquet(path) if path.suffix == ".parquet" else pd.read_csv(path, dtype=str, keep_default_na=False)
    cmap = column_map if isinstance(column_map, dict) else load_column_map(column_map)
    return apply_column_map(raw, cmap)


def map_export(path: str | Path, column_map: str | Path | dict, out: str | Path, fmt: str = "parquet") -> pd.DataFrame:
    """Map the export ``path`` with ``column_map`` and write it as a bank folder ``out``
    (``transactions.<fmt>`` and a ``manifest.json`` naming the source, the map and the counts), which
    ``slmlab transactions pretrain / finetune / evaluate / score --data OUT`` read. Returns the table."""
    if fmt not in ("parquet", "csv"):
        raise ValueError(f"format must be 'parquet' or 'csv', got {fmt!r}")
    df = read_export(path, column_map)
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    target = out / f"transactions.{fmt}"
    if fmt == "parquet":
        df.to_parquet(target, index=False)
    else:
        text = df.copy()
        text["timestamp"] = text["timestamp"].dt.strftime("%Y-%m-%dT%H:%M:%SZ")
        text.to_csv(target, index=False, lineterminator="\n")
    manifest = {"source": str(path), "column_map": str(column_map) if not isinstance(column_map, dict) else column_map,
                "rows": {"transactions": len(df)}, "customers": int(df["customer_id"].nunique()),
                "fraud_rate": float(df["is_fraud"].mean()) if "is_fraud" in df and len(df) else None,
                "columns": list(df.columns)}
    (out / "manifest.json").write_text(dumps_finite(manifest, indent=1, default=str))
    return df
