"""The transaction schema: which 15 token features a transaction becomes, and how each is encoded.

``load_schema(path) -> SchemaConfig`` parses and validates the YAML (``configs/schema.yaml`` of
package); ``SchemaConfig.fit(df_train) -> FittedSchema`` learns the data-dependent parts (quantile edges,
top-K vocabularies) from training rows only; ``FittedSchema.encode(df)`` turns a transaction table into
``int16[n_txn, F]`` per customer. Every feature reserves ids 0 PAD, 1 MASK, 2 UNK (unseen value),
3 NONE (missing / not applicable); real values start at id 4. See docs/transactions.md, "Schema".
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import yaml

from .._deps import pd

PAD, MASK, UNK, NONE = 0, 1, 2, 3
SPECIALS = ("PAD", "MASK", "UNK", "NONE")
FIRST_REAL = 4
CONFIGS = Path(__file__).parents[1] / "configs"
DEFAULT_SCHEMA = CONFIGS / "schema.yaml"
REQUIRED_COLUMNS = ("transaction_id", "customer_id", "timestamp", "amount")
ENCODING_KINDS = ("fixed_edges", "range", "list", "vocab", "hash", "quantile")
DERIVES = ("seconds_since_prev", "local_hour", "local_weekday", "local_day", "km_from_home")


@dataclass(frozen=True)
class FeatureSpec:
    """One token feature: its name, type, raw source column(s), derivation and encoding."""

    name: str
    type: str
    source: tuple[str, ...]
    encoding: dict
    derive: str | None = None
    transform: str | None = None
    fallback: str | None = None

    @property
    def kind(self) -> str:
        return self.encoding["kind"]

    @property
    def vocab_size(self) -> int:
        """Ids including the 4 specials."""
        enc = self.encoding
        n = {
            "fixed_edges": lambda: len(enc["edges"]),
            "range": lambda: int(enc["high"]) - int(enc["low"]) + 1,
            "list": lambda: len(enc["values"]),
            "vocab": lambda: int(enc["top_k"]),
            "hash": lambda: int(enc["buckets"]),
            "quantile": lambda: int(enc["n_bins"]) + int(bool(enc.get("zero_token", False))),
        }[self.kind]()
        return FIRST_REAL + n


@dataclass(frozen=True)
class SchemaConfig:
    """A validated schema (frozen). ``vocab_sizes``, ``feature_types`` and ``offsets`` are derived.

    Args:
        name: schema name (also the default hash salt).
        features: the feature specs, list order == position ``f`` inside a transaction.
        score_feature: the feature whose state a fraud head reads (never the last one).
        num_transactions: default window length ``T``.
        hash_salt: salt of the ``blake2b`` bucket hash.
        column_map: real-data adapter settings (``slmlab.transactions.adapter``).
    """

    name: str
    features: tuple[FeatureSpec, ...]
    score_feature: str = "auth_method"
    num_transactions: int = 64
    hash_salt: str = "card_txn_v1"
    column_map: dict = field(default_factory=dict)

    @property
    def num_features(self) -> int:
        return len(self.features)

    @property
    def names(self) -> tuple[str, ...]:
        return tuple(f.name for f in self.features)

    @property
    def vocab_sizes(self) -> tuple[int, ...]:
        return tuple(f.vocab_size for f in self.features)

    @property
    def feature_types(self) -> tuple[str, ...]:
        return tuple(f.type for f in self.features)

    @property
    def offsets(self) -> tuple[int, ...]:
        """Prefix sums of ``vocab_sizes`` (start row of each feature in a concatenated table)."""
        return tuple(int(x) for x in np.concatenate([[0], np.cumsum(self.vocab_sizes)[:-1]]))

    @property
    def score_index(self) -> int:
        return self.names.index(self.score_feature)

    def index(self, name: str) -> int:
        if name not in self.names:
            raise ValueError(f"schema {self.name!r} has no feature {name!r}; features: {list(self.names)}")
        return self.names.index(name)

    def to_dict(self) -> dict:
        feats = []
        for f in self.features:
            d = {"name": f.name, "type": f.type, "source": list(f.source) if len(f.source) > 1 else f.source[0],
                 "encoding": f.encoding}
            for key in ("derive", "transform", "fallback"):
                if getattr(f, key):
                    d[key] = getattr(f, key)
            feats.append(d)
        return {"schema_version": 1, "name": self.name, "hash_salt": self.hash_salt, "features": feats,
                "sequence": {"num_transactions": self.num_transactions, "score_feature": self.score_feature},
                "column_map": self.column_map}

    def encode(self, df) -> None:
        """An unfitted schema cannot tokenise: quantile edges and vocabularies come from training rows."""
        raise ValueError(f"schema {self.name!r} is not fitted; call SchemaConfig.fit(df_train) and encode with the result")

    def fit(self, df_train: pd.DataFrame, customers: pd.DataFrame | None = None) -> FittedSchema:
        """Fit quantile edges and top-K vocabularies on ``df_train`` (training rows only)."""
        raw = derive_features(self, df_train, customers)
        fitted: dict[str, Any] = {}
        for f in self.features:
            col = raw[f.name]
            if f.kind == "quantile":
                vals = np.asarray(col.dropna(), dtype=np.float64)
                vals = vals[vals >= 0.005] if f.encoding.get("zero_token") else vals
                if f.transform == "abs_log1p":
                    vals = np.log1p(vals)
                n_bins = int(f.encoding["n_bins"])
                if len(vals) == 0:
                    inner = np.array([])
                else:
                    inner = np.unique(np.quantile(vals, np.linspace(0, 1, n_bins + 1)[1:-1]))  # duplicates dropped
                fitted[f.name] = {"edges": [float(e) for e in inner]}
            elif f.kind == "vocab":
                vals = col.dropna().astype(str)
                counts = vals.value_counts()
                order = sorted(counts.items(), key=lambda kv: (-kv[1], kv[0]))  # ties broken by value
                fitted[f.name] = {"values": [k for k, _ in order[: int(f.encoding["top_k"])]]}
        ts = pd.to_datetime(df_train["timestamp"], utc=True)
        info = {"rows": len(df_train), "from": str(ts.min()) if len(ts) else None, "to": str(ts.max()) if len(ts) else None,
                "columns": [c for c in self.source_columns if c in df_train and df_train[c].notna().any()],
                "table_columns": sorted(map(str, df_train.columns))}
        return FittedSchema(self, fitted, info)

    @property
    def source_columns(self) -> tuple[str, ...]:
        """The transaction columns the features are read from, in feature order."""
        return tuple(dict.fromkeys(c for f in self.features for c in f.source))


# -- loading and validation ------------------------------------------------------------------------
def load_schema(path: str | Path | None = None, features_per_transaction: int | None = None) -> SchemaConfig:
    """Parse and validate a schema YAML (default: the shipped ``card_txn_v1``).

    Args:
        path: YAML file (None = the package's ``configs/schema.yaml``).
        features_per_transaction: when given (the model config's value), ``len(features)`` must equal it.
    Raises:
        ValueError: naming the YAML key at fault.
    """
    path = Path(path) if path is not None else DEFAULT_SCHEMA
    if not path.is_file():
        raise FileNotFoundError(f"schema file {path} does not exist")
    raw = yaml.safe_load(path.read_text()) or {}
    return schema_from_dict(raw, features_per_transaction, where=str(path))


def schema_from_dict(raw: dict, features_per_transaction: int | None = None, where: str = "schema") -> SchemaConfig:
    """:func:`load_schema` on an already parsed mapping."""
    if not isinstance(raw, dict):
        raise ValueError(f"{where}: expected a mapping with `features:`")
    feats = raw.get("features")
    if not isinstance(feats, list) or not feats:
        raise ValueError(f"{where}: `features` must be a non-empty list")
    specs, seen = [], set()
    for i, item in enumerate(feats):
        key = f"features[{i}]"
        if not isinstance(item, dict) or "name" not in item:
            raise ValueError(f"{where}: `{key}.name` is missing")
        name = str(item["name"])
        if name in seen:
            raise ValueError(f"{where}: `{key}.name` duplicates feature {name!r}; feature names must be unique")
        seen.add(name)
        enc = item.get("encoding")
        if not isinstance(enc, dict) or enc.get("kind") not in ENCODING_KINDS:
            raise ValueError(f"{where}: `{key}.encoding.kind` must be one of {ENCODING_KINDS}, got {enc!r}")
        for need in {"fixed_edges": ["edges"], "range": ["low", "high"], "list": ["values"], "vocab": ["top_k"],
                     "hash": ["buckets"], "quantile": ["n_bins"]}[enc["kind"]]:
            if need not in enc:
                raise ValueError(f"{where}: `{key}.encoding.{need}` is missing for kind {enc['kind']!r}")
        if enc["kind"] == "fixed_edges" and list(enc["edges"]) != sorted(enc["edges"]):
            raise ValueError(f"{where}: `{key}.encoding.edges` must be increasing")
        derive = item.get("derive")
        if derive is not None and derive not in DERIVES:
            raise ValueError(f"{where}: `{key}.derive` must be one of {DERIVES}, got {derive!r}")
        source = item.get("source", name)
        source = tuple(source) if isinstance(source, list) else (str(source),)
        specs.append(FeatureSpec(name, str(item.get("type", "categorical")), source, dict(enc), derive,
                                 item.get("transform"), item.get("fallback")))
    if features_per_transaction is not None and len(specs) != int(features_per_transaction):
        raise ValueError(
            f"{where}: `features` has {len(specs)} entries but the model's features_per_transaction is"
            f" {features_per_transaction}; make them equal"
        )
    seq = raw.get("sequence") or {}
    score = seq.get("score_feature", "auth_method")
    names = [s.name for s in specs]
    if score not in names:
        raise ValueError(f"{where}: `sequence.score_feature` {score!r} is not a feature; features: {names}")
    if names.index(score) == len(names) - 1:
        raise ValueError(f"{where}: `sequence.score_feature` {score!r} is the last feature; it must precede the outcome")
    return SchemaConfig(
        name=str(raw.get("name", "schema")), features=tuple(specs), score_feature=score,
        num_transactions=int(seq.get("num_transactions", 64)), hash_salt=str(raw.get("hash_salt", raw.get("name", ""))),
        column_map=dict(raw.get("column_map") or {}),
    )


# -- derived raw values ----------------------------------------------------------------------------
def check_columns(df: pd.DataFrame) -> None:
    """Raise naming missing required columns, duplicate ids or unparsable timestamps."""
    missing = [c for c in REQUIRED_COLUMNS if c not in df.columns]
    if missing:
        raise ValueError(f"transactions lack the required column(s) {missing}; map them with the schema's column_map")
    dup = df["transaction_id"].duplicated()
    if dup.any():
        row = int(np.flatnonzero(dup.to_numpy())[0])
        raise ValueError(f"duplicate transaction_id {df['transaction_id'].iloc[row]!r} at row {row}; ids must be unique")
    ts = pd.to_datetime(df["timestamp"], utc=True, errors="coerce")
    bad = ts.isna() & df["timestamp"].notna() | df["timestamp"].isna()
    if bad.any():
        row = int(np.flatnonzero(bad.to_numpy())[0])
        raise ValueError(f"unparsable timestamp {df['timestamp'].iloc[row]!r} at row {row}; use ISO-8601 UTC")


def sort_transactions(df: pd.DataFrame) -> pd.DataFrame:
    """Rows grouped by customer, each customer's in time order (ties by transaction_id)."""
    check_columns(df)
    out = df.copy()
    out["timestamp"] = pd.to_datetime(out["timestamp"], utc=True)
    out["customer_id"] = out["customer_id"].astype(str)
    out["transaction_id"] = out["transaction_id"].astype(str)
    return out.sort_values(["customer_id", "timestamp", "transaction_id"], kind="stable").reset_index(drop=True)


def haversine_km(lat1, lon1, lat2, lon2) -> np.ndarray:
    p1, p2 = np.radians(lat1), np.radians(lat2)
    dphi, dlmb = p2 - p1, np.radians(lon2) - np.radians(lon1)
    a = np.sin(dphi / 2) ** 2 + np.cos(p1) * np.cos(p2) * np.sin(dlmb / 2) ** 2
    return 2 * 6371.0 * np.arcsin(np.sqrt(np.clip(a, 0, 1)))


def home_locations(df: pd.DataFrame, customers: pd.DataFrame | None) -> pd.DataFrame:
    """``home_lat/home_lon`` per customer: the profile table, else the median card-present location of
    the customer's first 30 days (the schema's fallback)."""
    if customers is not None and {"customer_id", "home_lat", "home_lon"} <= set(customers.columns):
        home = customers[["customer_id", "home_lat", "home_lon"]].copy()
        home["customer_id"] = home["customer_id"].astype(str)
        return home.set_index("customer_id")
    if not {"merchant_lat", "merchant_lon"} <= set(df.columns):
        return pd.DataFrame(columns=["home_lat", "home_lon"])
    first = df.groupby("customer_id")["timestamp"].transform("min")
    early = df[(df["timestamp"] < first + pd.Timedelta(days=30)) & df["merchant_lat"].notna()]
    return early.groupby("customer_id")[["merchant_lat", "merchant_lon"]].median().rename(
        columns={"merchant_lat": "home_lat", "merchant_lon": "home_lon"})


def derive_features(schema: SchemaConfig, df: pd.DataFrame, customers: pd.DataFrame | None = None) -> pd.DataFrame:
    """One raw value column per feature (NaN = missing), rows in :func:`sort_transactions` order."""
    df = sort_transactions(df)
    offset = df["tz_offset_min"].fillna(0).astype(np.int64) if "tz_offset_min" in df else 0
    local = df["timestamp"] + pd.to_timedelta(offset, unit="min")
    out = {}
    for f in schema.features:
        if f.derive == "seconds_since_prev":
            secs = df["timestamp"].astype("int64") // 10**6 if df["timestamp"].dtype.unit == "us" else None
            secs = (df["timestamp"] - pd.Timestamp(0, tz="UTC")).dt.total_seconds() if secs is None else secs / 1.0
            prev = secs.groupby(df["customer_id"]).shift(1)
            out[f.name] = secs - prev
        elif f.derive == "local_hour":
            out[f.name] = local.dt.hour.astype(float)
        elif f.derive == "local_weekday":
            out[f.name] = local.dt.day_of_week.astype(float)
        elif f.derive == "local_day":
            out[f.name] = local.dt.day.astype(float)
        elif f.derive == "km_from_home":
            lat_c, lon_c = f.source
            if lat_c in df and lon_c in df:
                home = home_locations(df, customers).reindex(df["customer_id"])
                out[f.name] = pd.Series(haversine_km(df[lat_c].to_numpy(float), df[lon_c].to_numpy(float),
                                                      home["home_lat"].to_numpy(float), home["home_lon"].to_numpy(float)))
            else:
                out[f.name] = pd.Series(np.nan, index=df.index)
        else:
            src = f.source[0]
            col = df[src] if src in df else pd.Series(np.nan, index=df.index, dtype=object)
            if f.fallback == "sign_of_amount":
                sign = np.where(df["amount"].to_numpy(float) < 0, "refund", "purchase")
                col = col.where(col.notna(), pd.Series(sign, index=df.index))
            if f.transform == "abs_log1p" or f.name == "amount":
                col = col.astype(float).abs()
            out[f.name] = col
    return pd.DataFrame(out).reset_index(drop=True)


def blake_bucket(salt: str, feature: str, value: str, buckets: int) -> int:
    digest = hashlib.blake2b(f"{salt}|{feature}|{value}".encode(), digest_size=8).digest()
    return int.from_bytes(digest, "little") % buckets + FIRST_REAL


def _value_str(series: pd.Series) -> pd.Series:
    """Strings for categorical values; integral floats (an mcc read back as 5411.0) lose the ``.0``."""
    if series.dtype.kind == "f":
        return series.map(lambda v: str(int(v)) if float(v).is_integer() else str(v))
    return series.astype(str)


class FittedSchema:
    """A schema plus what was fitted on training rows; it tokenises tables.

    Args:
        schema: the :class:`SchemaConfig`.
        fitted: per feature, ``{"edges": [...]}`` (quantile) or ``{"values": [...]}`` (vocab).
        info: fit row count and date range.
    """

    def __init__(self, schema: SchemaConfig, fitted: dict, info: dict | None = None) -> None:
        self.schema = schema
        self.fitted = fitted
        self.info = info or {}
        for f in schema.features:
            if f.kind in ("quantile", "vocab") and f.name not in fitted:
                raise ValueError(f"fitted schema lacks feature {f.name!r}; refit with SchemaConfig.fit(df_train)")

    # -- encoding -------------------------------------------------------------------------------
    def encode_column(self, f_index: int, col: pd.Series) -> np.ndarray:
        """Ids (int16) of one feature's raw values."""
        f = self.schema.features[f_index]
        enc = f.encoding
        missing = col.isna().to_numpy()
        ids = np.full(len(col), NONE, dtype=np.int64)
        present = ~missing
        if f.kind in ("fixed_edges", "range"):
            vals = col.to_numpy(dtype=np.float64, na_value=np.nan)
            if f.kind == "fixed_edges":
                edges = np.asarray(enc["edges"], dtype=np.float64)
                bins = np.clip(np.searchsorted(edges, vals, side="right") - 1, 0, len(edges) - 1)
                ids[present] = FIRST_REAL + bins[present]
            else:
                low, high = int(enc["low"]), int(enc["high"])
                iv = np.where(present, vals, low).astype(np.int64)
                ok = present & (iv >= low) & (iv <= high)
                ids[ok] = FIRST_REAL + iv[ok] - low
                ids[present & ~ok] = UNK
        elif f.kind == "quantile":
            vals = col.to_numpy(dtype=np.float64, na_value=np.nan)
            zero = bool(enc.get("zero_token"))
            is_zero = present & (np.abs(np.nan_to_num(vals)) < 0.005) if zero else np.zeros(len(col), bool)
            tv = np.log1p(np.abs(np.nan_to_num(vals))) if f.transform == "abs_log1p" else np.nan_to_num(vals)
            edges = np.asarray(self.fitted[f.name]["edges"], dtype=np.float64)
            bins = np.searchsorted(edges, tv, side="right")  # outer edges are -inf / +inf
            first = FIRST_REAL + int(zero)
            ids[present] = first + bins[present]
            ids[is_zero] = FIRST_REAL
        else:
            strs = _value_str(col[present])
            if f.kind == "list" or f.kind == "vocab":
                values = enc["values"] if f.kind == "list" else self.fitted[f.name]["values"]
                lookup = {str(v): FIRST_REAL + i for i, v in enumerate(values)}
                ids[present] = strs.map(lambda v: lookup.get(v, UNK)).to_numpy(np.int64)
            else:
                uniq = pd.unique(strs)
                table = {v: blake_bucket(self.schema.hash_salt, f.name, v, int(enc["buckets"])) for v in uniq}
                ids[present] = strs.map(table).to_numpy(np.int64)
        return ids.astype(np.int16)

    def encode_frame(self, df: pd.DataFrame, customers: pd.DataFrame | None = None) -> tuple[pd.DataFrame, np.ndarray]:
        """``(sorted transactions, ids int16[N, F])``: rows grouped by customer in time order."""
        sorted_df = sort_transactions(df)
        raw = derive_features(self.schema, sorted_df, customers)
        ids = np.stack([self.encode_column(i, raw[f.name]) for i, f in enumerate(self.schema.features)], axis=1)
        return sorted_df, ids

    def encode(self, df: pd.DataFrame, customers: pd.DataFrame | None = None) -> dict[str, np.ndarray]:
        """``customer_id -> int16[n_txn, F]`` (each customer's full history, oldest first)."""
        sorted_df, ids = self.encode_frame(df, customers)
        return split_by_customer(sorted_df["customer_id"].to_numpy(), ids)

    # -- decoding -------------------------------------------------------------------------------
    def num_assigned(self, f_index: int) -> int:
        """Ids ``[0, n)`` of feature ``f_index`` name a value (or a special). The ids from ``n`` up to the
        vocabulary size were left unassigned by the fit (fewer distinct training values than ``top_k``,
        or duplicate quantile edges dropped); no row ever encodes to them."""
        f = self.schema.features[f_index]
        if f.kind == "vocab":
            return FIRST_REAL + len(self.fitted[f.name]["values"])
        if f.kind == "quantile":
            return FIRST_REAL + int(bool(f.encoding.get("zero_token"))) + len(self.fitted[f.name]["edges"]) + 1
        return f.vocab_size

    def decode(self, f_index: int, token: int) -> str:
        """A readable value for id ``token`` of feature ``f_index`` (a bin range for numeric features)."""
        f = self.schema.features[f_index]
        if not 0 <= token < f.vocab_size:
            raise ValueError(f"id {token} is outside feature {f.name!r} (vocabulary {f.vocab_size})")
        if token < FIRST_REAL:
            return f"{f.name} {SPECIALS[token]}"
        k, enc = token - FIRST_REAL, f.encoding
        if f.kind == "fixed_edges":
            edges = list(enc["edges"]) + [float("inf")]
            return f"{f.name} {_num(edges[k])}–{_num(edges[k + 1])}"
        if f.kind == "range":
            return f"{f.name} {int(enc['low']) + k}"
        if f.kind == "list":
            return f"{f.name} {enc['values'][k]}"
        if f.kind == "vocab":
            values = self.fitted[f.name]["values"]
            return f"{f.name} {values[k]}" if k < len(values) else f"{f.name} (unused id {token})"
        if f.kind == "hash":
            return f"{f.name} bucket {k}"
        if enc.get("zero_token"):
            if k == 0:
                return f"{f.name} 0.00"
            k -= 1
        edges = [-np.inf] + list(self.fitted[f.name]["edges"]) + [np.inf]
        if k >= len(edges) - 1:
            return f"{f.name} (unused id {token})"
        lo, hi = edges[k], edges[k + 1]
        if f.transform == "abs_log1p":
            lo, hi = (np.expm1(lo) if np.isfinite(lo) else 0.0), np.expm1(hi) if np.isfinite(hi) else np.inf
        return f"{f.name} {_num(lo)}–{_num(hi)}"

    # -- schema drift ---------------------------------------------------------------------------
    def trained_columns(self) -> list[str]:
        """The source columns that held values in the training rows (recorded at fit; for a schema fitted
        before that was recorded, the columns a fitted vocabulary or quantile edge shows were present)."""
        if "columns" in self.info:
            return list(self.info["columns"])
        seen = [c for f in self.schema.features if (self.fitted.get(f.name) or {}).get("values")
                or (self.fitted.get(f.name) or {}).get("edges") for c in f.source]
        return list(dict.fromkeys([*REQUIRED_COLUMNS, *seen]))

    def check_drift(self, df: pd.DataFrame) -> list[str]:
        """Compare the columns of ``df`` (transactions to tokenise) with the training rows'.

        Raises:
            ValueError: a column the model was trained with is missing from every row (each such
                feature would be tokenised as missing: scores with no warning otherwise).
        Returns:
            warnings: one line per column of ``df`` unknown to the fitted schema (ignored by the model).
        """
        if df.empty:
            raise ValueError("the transactions to tokenise hold no rows; give a table with transactions")
        missing = [c for c in self.trained_columns() if c not in df.columns or not df[c].notna().any()]
        if missing:
            raise ValueError(f"column(s) {missing} the model was trained with are missing from every row of the data;"
                             " map them with the schema's column_map (or add them), or use a model trained without"
                             " them")
        known = {*self.schema.source_columns, *REQUIRED_COLUMNS, *self.info.get("table_columns", ())}
        if "table_columns" not in self.info:
            return []
        return [f"column {c!r} is unknown to the fitted schema (the model never saw it); it is ignored"
                for c in map(str, df.columns) if c not in known]

    # -- persistence ----------------------------------------------------------------------------
    def to_dict(self) -> dict:
        return {"schema": self.schema.to_dict(), "fitted": self.fitted, "info": self.info}

    @classmethod
    def from_dict(cls, data: dict) -> FittedSchema:
        return cls(schema_from_dict(data["schema"]), data["fitted"], data.get("info"))

    def save(self, path: str | Path) -> Path:
        """Write ``schema.fitted.json`` (``path`` may be the folder)."""
        path = Path(path)
        if path.is_dir() or not path.suffix:
            path.mkdir(parents=True, exist_ok=True)
            path = path / "schema.fitted.json"
        path.write_text(json.dumps(self.to_dict(), indent=1))
        return path

    @classmethod
    def load(cls, path: str | Path) -> FittedSchema:
        path = Path(path)
        if path.is_dir():
            path = path / "schema.fitted.json"
        if not path.is_file():
            raise FileNotFoundError(f"no fitted schema at {path}; fit one with SchemaConfig.fit(df_train)")
        return cls.from_dict(json.loads(path.read_text()))


def _num(x: float) -> str:
    if not np.isfinite(x):
        return "inf" if x > 0 else "-inf"
    return f"{x:.2f}" if abs(x) < 1e6 and not float(x).is_integer() else f"{int(x)}"


def split_by_customer(customer_ids: np.ndarray, ids: np.ndarray) -> dict[str, np.ndarray]:
    """Cut rows grouped by customer into ``customer -> rows`` (order kept)."""
    if len(customer_ids) == 0:
        return {}
    change = np.flatnonzero(customer_ids[1:] != customer_ids[:-1]) + 1
    starts = np.concatenate([[0], change])
    ends = np.concatenate([change, [len(customer_ids)]])
    return {str(customer_ids[s]): ids[s:e] for s, e in zip(starts, ends)}
