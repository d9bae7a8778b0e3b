"""The demo's tabs: one plain function per tab on a :class:`~slmlab.transactions.demo.state.DemoState`,
each returning tables (pandas) and matplotlib figures. :mod:`.app` only wires these into Gradio;
nothing here imports Gradio, so every tab is unit tested without a browser (docs/transactions.md,
"Demo").

Tabs and what their functions compute:

1. Data (:func:`data_view`): a customer's last 64 transactions, raw columns and the decoded token of
   every feature; card-present merchant locations against the customer's home; the local-hour
   histogram; ground-truth fraud shown on request.
2. Next transaction (:func:`next_view`): per feature head ``f = 0..14`` the top 5 ids with their
   probabilities, each field conditioned on the greedy choice (or the user's fixed value) of the
   earlier ones; beside each head, the customer's own history frequency of the same values; five
   sampled next transactions as readable rows.
3. Fraud scoring (:func:`score_view`, :func:`inject_spree`, :func:`occlusion_view`): every
   transaction of the history scored once by the streaming scorer (windows of ``T`` with stride
   ``T // 2``, as in evaluation), the validation 1%-FPR threshold as the alert line; a spree built
   by the generator's own pattern code appended after the newest transaction; occlusion: one earlier
   transaction replaced by MASK ids in the window ending at a target, score change reported.
4. Customer similarity (:func:`similarity_view`): customer embeddings of each customer's newest
   window, 2-D PCA coloured by archetype, cosine nearest neighbours, leave-one-out kNN archetype
   accuracy.
5. Baselines (:func:`baselines_view`): test-period PR curves of gradient boosting on raw fields, on
   rolling features, the sequence model and the stacked model; per-pattern recall at each model's validation 1%-FPR
   threshold.
6. Model and schema (:func:`model_view`): layer order, ``param_count()``, vocabulary sizes, fitted
   amount bin edges.

Bad input never raises out of a tab function: an unknown customer id, a spree on an empty history or
a malformed fixed field comes back as the view's ``message``.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch

from .._deps import pd
from ..data.schema import MASK, home_locations
from ..data.synth import (
    CT_MCCS,
    MCC,
    MCC_INDEX,
    account_takeover_block,
    blocks_to_frame,
    card_testing_attempts,
    lost_stolen_block,
    txn_block,
)
from ..data.windows import build_windows
from ..evaluation.evaluate import point_metrics
from ..generate import generate_next_transaction, next_transaction_topk
from ..heads.customer import embed_windows
from .state import (
    RAW_COLUMNS,
    SPREES,
    VIEW_ROWS,
    DemoInputError,
    DemoState,
    customer_frame,
    encode_history,
    stream_scores,
    window_scores,
)


# -- tab 1: data -------------------------------------------------------------------------------------
@dataclass
class DataView:
    """``table``: the last 64 transactions (raw columns, ``tok:<feature>`` decoded tokens, ``is_fraud``
    and ``fraud_type`` when highlighting); ``fraud_rows``: positions in ``table`` of fraudulent rows
    (empty unless highlighting); ``map_fig``, ``hour_fig``: matplotlib figures."""

    table: pd.DataFrame
    fraud_rows: list[int]
    map_fig: object | None
    hour_fig: object | None
    message: str = ""


def _plt():
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def data_view(state: DemoState, customer_id: str, highlight_fraud: bool = False,
              injected: pd.DataFrame | None = None) -> DataView:
    """Tab 1: the customer's last 64 transactions, decoded, with a location map and hour histogram."""
    try:
        df = customer_frame(state, customer_id, injected)
    except DemoInputError as err:
        return DataView(pd.DataFrame(), [], None, None, str(err))
    ids = encode_history(state, df)
    view, vids = df.tail(VIEW_ROWS).reset_index(drop=True), ids[-VIEW_ROWS:]
    table = pd.DataFrame({"#": np.arange(len(df) - len(view), len(df))})
    for c in RAW_COLUMNS:
        if c in view:
            table[c] = view[c].astype(str) if c == "timestamp" else view[c]
    for f, name in enumerate(state.model.encoder.feature_names):
        table[f"tok:{name}"] = [state.fitted.decode(f, int(t)).removeprefix(name + " ") for t in vids[:, f]]
    fraud_rows: list[int] = []
    if highlight_fraud and "is_fraud" in view:
        table["is_fraud"] = view["is_fraud"].fillna(0).astype(int).to_numpy()
        table["fraud_type"] = view["fraud_type"].astype(str).replace({"nan": "", "None": ""}).to_numpy()
        fraud_rows = [int(i) for i in np.flatnonzero(table["is_fraud"].to_numpy() == 1)]
    plt = _plt()
    home = home_locations(df, state.bank.customers).reindex([str(customer_id).strip()])
    fig_map, ax = plt.subplots(figsize=(5, 4))
    cp = view[view["merchant_lat"].notna()] if "merchant_lat" in view else view.iloc[:0]
    fr = cp["is_fraud"].fillna(0).to_numpy() == 1 if highlight_fraud and "is_fraud" in cp else np.zeros(len(cp), bool)
    ax.scatter(cp["merchant_lon"][~fr], cp["merchant_lat"][~fr], s=18, c="tab:blue", label="card-present")
    if fr.any():
        ax.scatter(cp["merchant_lon"][fr], cp["merchant_lat"][fr], s=30, c="tab:red", label="fraud")
    if len(home) and home["home_lat"].notna().all():
        ax.scatter(home["home_lon"], home["home_lat"], marker="*", s=220, c="gold", edgecolors="k", label="home")
    ax.set_xlabel("longitude")
    ax.set_ylabel("latitude")
    ax.set_title(f"Card-present locations, last {len(view)} transactions")
    ax.legend(fontsize=8)
    fig_map.tight_layout()
    local = pd.to_datetime(view["timestamp"], utc=True) + pd.to_timedelta(
        view["tz_offset_min"].astype(float).fillna(0) if "tz_offset_min" in view else 0, unit="min")
    hours = local.dt.hour.to_numpy()
    fig_h, ax = plt.subplots(figsize=(5, 3))
    ax.hist(hours, bins=np.arange(25) - 0.5, color="tab:blue", label="all")
    frv = view["is_fraud"].fillna(0).to_numpy() == 1 if highlight_fraud and "is_fraud" in view else None
    if frv is not None and frv.any():
        ax.hist(hours[frv], bins=np.arange(25) - 0.5, color="tab:red", label="fraud")
        ax.legend(fontsize=8)
    ax.set_title("Local hour of day")
    ax.set_xlabel("local hour")
    ax.set_ylabel("transactions")
    ax.set_xticks(range(0, 24, 3))
    fig_h.tight_layout()
    return DataView(table, fraud_rows, fig_map, fig_h)


# -- tab 2: next transaction -------------------------------------------------------------------------
@dataclass
class NextView:
    """``heads``: one table per feature ``f = 0..14`` with columns ``rank, id, value, probability``
    (descending) and ``history share`` (the value's share in the customer's history: the
    customer-history unigram); ``history_top``: per feature the customer's 5 most frequent values;
    ``samples``: sampled next transactions, one readable row each; ``fixed``: the fields forced."""

    heads: list[pd.DataFrame]
    history_top: list[pd.DataFrame]
    samples: pd.DataFrame
    fixed: dict[str, int]
    message: str = ""


def parse_fixed(state: DemoState, text: str) -> dict[str, int]:
    """``"mcc=17, amount=30"`` -> ``{"mcc": 17, "amount": 30}`` (feature name = token id)."""
    names = state.model.encoder.feature_names
    out: dict[str, int] = {}
    for part in (text or "").replace(";", ",").split(","):
        if not part.strip():
            continue
        name, _, value = part.partition("=")
        name, value = name.strip(), value.strip()
        if name not in names:
            raise DemoInputError(f"fixed field {name!r} is not a feature; write name=id with a name from {list(names)}")
        f = names.index(name)
        v = state.fitted.schema.features[f].vocab_size
        if not value.isdigit() or not 2 <= int(value) < v:
            raise DemoInputError(f"fixed value of {name!r} must be a token id in [2, {v}) (see the id column), "
                                 f"got {value!r}")
        out[name] = int(value)
    return out


def next_view(state: DemoState, customer_id: str, fixed_text: str = "", injected: pd.DataFrame | None = None,
              n_samples: int = 5, seed: int = 0, k: int = 5) -> NextView:
    """Tab 2: top-``k`` per head with greedy (or fixed) conditioning and ``n_samples`` sampled rows."""
    try:
        df = customer_frame(state, customer_id, injected)
        fixed = parse_fixed(state, fixed_text)
        if not len(df):
            raise DemoInputError(f"customer {customer_id!r} has no transactions to condition on")
    except DemoInputError as err:
        return NextView([], [], pd.DataFrame(), {}, str(err))
    ids = encode_history(state, df)
    hist = torch.from_numpy(ids[-(state.T - 1):])
    top = next_transaction_topk(state.model, hist, fixed=fixed or None, k=k)
    names = state.model.encoder.feature_names
    heads, history_top = [], []
    for f, (name, pairs) in enumerate(zip(names, top)):
        counts = np.bincount(ids[:, f], minlength=state.fitted.schema.features[f].vocab_size) / len(ids)
        heads.append(pd.DataFrame({
            "rank": np.arange(1, len(pairs) + 1), "id": [i for i, _ in pairs],
            "value": [state.fitted.decode(f, i).removeprefix(name + " ") for i, _ in pairs],
            "probability": [p for _, p in pairs], "history share": [float(counts[i]) for i, _ in pairs]}))
        order = np.argsort(-counts, kind="stable")[:k]
        order = order[counts[order] > 0]
        history_top.append(pd.DataFrame({"id": order, "value": [state.fitted.decode(f, int(i)).removeprefix(name + " ")
                                                               for i in order], "share": counts[order]}))
    gen = torch.Generator().manual_seed(int(seed))
    sampled = generate_next_transaction(state.model, hist, n_samples=n_samples, fixed=fixed or None, generator=gen)
    samples = pd.DataFrame([{k2: v.removeprefix(k2 + " ") for k2, v in row.items()} for row in sampled.rows])
    return NextView(heads, history_top, samples, fixed)


# -- tab 3: fraud scoring ----------------------------------------------------------------------------
@dataclass
class ScoreView:
    """``table``: the last 64 transactions with columns ``#, timestamp, amount, mcc, txn_type,
    response_code, injected, fraud_type, score`` (in [0, 1]) and ``alert`` (score >= threshold);
    ``fig``: the score timeline with the threshold line."""

    table: pd.DataFrame
    fig: object | None
    threshold: float
    tokens: int = 0
    message: str = ""


def score_view(state: DemoState, customer_id: str, injected: pd.DataFrame | None = None) -> ScoreView:
    """Tab 3: stream-score the customer's whole history, show the newest 64 and the timeline."""
    try:
        df = customer_frame(state, customer_id, injected)
    except DemoInputError as err:
        return ScoreView(pd.DataFrame(), None, state.threshold, 0, str(err))
    ids = encode_history(state, df)
    scores, tokens = stream_scores(state.model, ids) if len(ids) else (np.zeros(0), 0)
    view = df.tail(VIEW_ROWS)
    s = scores[-VIEW_ROWS:] if len(scores) else scores
    table = pd.DataFrame({"#": np.arange(len(df) - len(view), len(df)), "timestamp": view["timestamp"].astype(str),
                          "amount": view["amount"].to_numpy(), "mcc": view["mcc"].to_numpy(),
                          "txn_type": view["txn_type"].to_numpy(), "response_code": view["response_code"].to_numpy(),
                          "injected": view["injected"].to_numpy(),
                          "fraud_type": view["fraud_type"].astype(str).replace({"nan": "", "None": ""}).to_numpy()
                          if "fraud_type" in view else "", "score": s, "alert": s >= state.threshold})
    plt = _plt()
    fig, ax = plt.subplots(figsize=(8, 3.2))
    x = np.arange(len(scores))
    ax.plot(x, scores, lw=1, color="tab:blue", label="score")
    fr = df["is_fraud"].fillna(0).to_numpy() == 1 if "is_fraud" in df else np.zeros(len(df), bool)
    inj = df["injected"].to_numpy(bool)
    ax.scatter(x[fr & ~inj], scores[fr & ~inj], c="tab:red", s=16, zorder=3, label="fraud (ground truth)")
    ax.scatter(x[inj], scores[inj], c="tab:orange", marker="x", s=28, zorder=3, label="injected")
    if np.isfinite(state.threshold):
        ax.axhline(state.threshold, color="k", ls="--", lw=1, label=f"validation 1%-FPR threshold {state.threshold:.3f}")
    ax.set_title("Fraud score of every transaction (streaming scorer)")
    ax.set_xlabel("transaction # (whole history)")
    ax.set_ylabel("fraud score")
    ax.set_ylim(-0.02, 1.02)
    ax.legend(fontsize=7, loc="upper left")
    fig.tight_layout()
    return ScoreView(table, fig, state.threshold, tokens)


def inject_spree(state: DemoState, customer_id: str, kind: str, injected: pd.DataFrame | None = None,
                 seed: int = 0) -> tuple[pd.DataFrame | None, str]:
    """Append a ``kind`` spree (card testing, account takeover, lost/stolen), built by the generator's
    pattern functions, starting one hour after the customer's newest transaction.

    Returns ``(injected rows of every customer so far, message)``; on bad input the rows are unchanged
    and the message says why.
    """
    try:
        if kind not in SPREES:
            raise DemoInputError(f"unknown spree {kind!r}; use one of {list(SPREES)}")
        df = customer_frame(state, customer_id, injected)
        if not len(df):
            raise DemoInputError(f"customer {customer_id!r} has an empty history; a spree needs at least one "
                                 "transaction to follow")
        w, cfg = state.world(), state.synth
    except DemoInputError as err:
        return injected, str(err)
    cid = str(customer_id).strip()
    idx = int(cid.lstrip("C"))
    start = pd.Timestamp(cfg.start, tz="UTC")
    t_last = int((df["timestamp"].max() - start).total_seconds())
    t0 = t_last + 3600
    rng = np.random.default_rng([int(seed), idx, SPREES.index(kind), len(injected) if injected is not None else 0])
    tz = int(df["tz_offset_min"].iloc[-1]) if "tz_offset_min" in df else 0
    if kind == "card_testing":
        pool = np.concatenate([w.online.get(MCC_INDEX[m], np.zeros(0, int)) for m in CT_MCCS])
        cashout = np.concatenate([w.online.get(MCC_INDEX[m], np.zeros(0, int)) for m in (5732, 6540, 5944)])
        merchants = pool[rng.integers(0, len(pool), int(rng.integers(1, 3)))]
        ev = card_testing_attempts(rng, merchants, cashout, t0, 20_000 + 9_000 + idx, cfg.difficulty, cfg.behaviour)
        block = txn_block(len(ev["t"]), t=ev["t"], merchant=ev["merchant"], amount=ev["amount"], txn_type=ev["txn_type"],
                       entry=4, auth=ev["auth"], device=ev["device"], response=ev["response"], tz=tz)
    elif kind == "account_takeover":
        counts = df["mcc"].value_counts()
        mcc_w = np.zeros(len(MCC))
        for m, c in counts.items():
            if int(m) in MCC_INDEX:
                mcc_w[MCC_INDEX[int(m)]] = c
        block = account_takeover_block(rng, w, mcc_w / max(mcc_w.sum(), 1), df["amount"].to_numpy(float),
                                       cfg.difficulty, tz, 10_000 + 900 + len(df), (t0, t0 + 1), cfg.behaviour)
    else:
        home = state.bank.customers
        city = 0
        if home is not None and "home_city" in home:
            row = home[home["customer_id"].astype(str) == cid]
            city = int(str(row["home_city"].iloc[0]).split("_")[-1]) if len(row) else 0
        block = lost_stolen_block(rng, w, city, cfg.difficulty, tz, (t0, t0 + 1), cfg.behaviour)
    n_before = 0 if injected is None else len(injected)
    rows = blocks_to_frame([block], w, cfg, idx, 90_000 + n_before, kind, case=99)
    for col in ("merchant_city", "device_id", "fraud_type", "fraud_case_id"):
        rows[col] = rows[col].astype(str)
    out = rows if injected is None or not len(injected) else pd.concat([injected, rows], ignore_index=True)
    return out, f"injected a {kind.replace('_', ' ')} spree of {len(rows)} transactions after transaction #{len(df) - 1}"


@torch.no_grad()
def occlusion_view(state: DemoState, customer_id: str, injected: pd.DataFrame | None = None, top: int = 5,
                   per_target: int = 3) -> tuple[pd.DataFrame, str]:
    """Occlusion attribution for the ``top`` highest-scored transactions of the shown history.

    For a target ``e``, the window of the ``T`` transactions ending at ``e`` is scored as is (``base``)
    and with each earlier transaction ``j`` of it replaced by MASK ids in every field; ``delta =
    occluded - base`` (negative: ``j`` pushed the score up). The ``per_target`` transactions with the
    largest ``|delta|`` are listed per target. Columns: ``target #, target base score, occluded #,
    occluded mcc, occluded amount, occluded score, delta``.
    """
    try:
        df = customer_frame(state, customer_id, injected)
        if len(df) < 2:
            raise DemoInputError(f"customer {customer_id!r} has fewer than 2 transactions; nothing to occlude")
    except DemoInputError as err:
        return pd.DataFrame(), str(err)
    ids = encode_history(state, df)
    scores, _ = stream_scores(state.model, ids)
    lo = max(0, len(df) - VIEW_ROWS)
    cand = np.arange(max(lo, 1), len(df))
    targets = cand[np.argsort(-scores[cand], kind="stable")[:top]]
    T = state.T
    rows = []
    for e in targets:
        past = np.arange(max(0, e - T + 1), e)
        variants = np.repeat(ids[None], len(past) + 1, 0)
        for i, j in enumerate(past):
            variants[i + 1, j] = MASK
        s = np.array([window_scores(state.model, v, np.array([e]))[0] for v in variants])
        base, occl = s[0], s[1:]
        delta = occl - base
        for i in np.argsort(-np.abs(delta), kind="stable")[:per_target]:
            j = past[i]
            rows.append({"target #": int(e), "target base score": float(base), "occluded #": int(j),
                         "occluded mcc": int(df["mcc"].iloc[j]), "occluded amount": float(df["amount"].iloc[j]),
                         "occluded score": float(occl[i]), "delta": float(delta[i])})
    return pd.DataFrame(rows), ""


# -- tab 4: customer similarity -----------------------------------------------------------------------
@dataclass
class SimilarityView:
    """``fig``: 2-D PCA of the embeddings coloured by archetype; ``neighbours``: columns
    ``customer_id, archetype, cosine`` (descending); ``knn_accuracy``: leave-one-out 5-NN archetype
    accuracy in [0, 1]; ``chance``: the majority archetype's share."""

    fig: object | None
    neighbours: pd.DataFrame
    knn_accuracy: float
    chance: float
    message: str = ""


def customer_embeddings(state: DemoState, batch_size: int = 64) -> tuple[list[str], np.ndarray]:
    """One embedding per customer from its newest window of ``T`` transactions, centred (the mean
    over customers subtracted: masked means of backbone states share a large common direction, which
    would make every cosine close to 1) and L2-normalised (cached)."""
    if state.embeddings is None:
        enc = state.bank.encoded()
        custs = list(enc)
        w = build_windows({c: enc[c][-state.T:] for c in custs}, state.T, state.T)
        with torch.no_grad():
            vecs = [embed_windows(state.model, b.ids, b.txn_mask).float().numpy() for b in w.batches(batch_size)]
        x = np.concatenate(vecs).astype(np.float64)
        x -= x.mean(0, keepdims=True)
        x /= np.maximum(np.linalg.norm(x, axis=1, keepdims=True), 1e-12)
        state.embeddings = dict(zip(custs, x))
    return list(state.embeddings), np.stack(list(state.embeddings.values()))


def knn_accuracy(x: np.ndarray, labels: np.ndarray, k: int = 5) -> float:
    """Leave-one-out ``k``-nearest-neighbour (cosine) majority-vote accuracy."""
    xn = x / np.maximum(np.linalg.norm(x, axis=1, keepdims=True), 1e-12)
    sim = xn @ xn.T
    np.fill_diagonal(sim, -np.inf)
    nn = np.argsort(-sim, axis=1, kind="stable")[:, :k]
    hits = 0
    for i, row in enumerate(nn):
        vals, cnt = np.unique(labels[row], return_counts=True)
        hits += vals[np.argmax(cnt)] == labels[i]
    return hits / len(labels)


def similarity_view(state: DemoState, customer_id: str, k: int = 5) -> SimilarityView:
    """Tab 4: PCA of customer embeddings, the selected customer's cosine neighbours, kNN accuracy."""
    from sklearn.decomposition import PCA

    cid = str(customer_id or "").strip()
    if cid not in state.bank.starts:  # (a customer without transactions has no embedding either)
        return SimilarityView(None, pd.DataFrame(), float("nan"), float("nan"),
                              f"customer {cid!r} is not in the bank; pick one from the list")
    custs, x = customer_embeddings(state)
    arch_of = {}
    if state.bank.customers is not None and "archetype" in state.bank.customers:
        arch_of = dict(zip(state.bank.customers["customer_id"].astype(str), state.bank.customers["archetype"]))
    arch = np.array([arch_of.get(c, "unknown") for c in custs])
    xn = x / np.maximum(np.linalg.norm(x, axis=1, keepdims=True), 1e-12)
    i = custs.index(cid)
    sim = xn @ xn[i]
    sim[i] = -np.inf
    nn = np.argsort(-sim, kind="stable")[:k]
    neighbours = pd.DataFrame({"customer_id": [custs[j] for j in nn], "archetype": arch[nn], "cosine": sim[nn]})
    acc = knn_accuracy(x, arch, k)
    _, counts = np.unique(arch, return_counts=True)
    xy = PCA(2, random_state=0).fit_transform(xn)
    plt = _plt()
    fig, ax = plt.subplots(figsize=(6, 4.5))
    for a in sorted(set(arch)):
        sel = arch == a
        ax.scatter(xy[sel, 0], xy[sel, 1], s=12, label=a, alpha=0.7)
    ax.scatter(xy[i, 0], xy[i, 1], marker="*", s=250, c="k", label=cid)
    ax.set_xlabel("PC 1")
    ax.set_ylabel("PC 2")
    ax.set_title(f"Customer embeddings (2-D PCA); {k}-NN archetype accuracy {acc:.2f}")
    ax.legend(fontsize=7, loc="best")
    fig.tight_layout()
    return SimilarityView(fig, neighbours, float(acc), float(counts.max() / counts.sum()))


# -- tab 5: baselines ---------------------------------------------------------------------------------
@dataclass
class BaselinesView:
    """``fig``: test-period PR curves; ``table``: per model ``pr_auc, roc_auc, threshold`` and recall
    of each fraud pattern at the model's validation 1%-FPR threshold (values in [0, 1])."""

    fig: object | None
    table: pd.DataFrame
    message: str = ""


def baselines_view(state: DemoState) -> BaselinesView:
    """Tab 5: precision-recall curves and the per-pattern table."""
    from sklearn.metrics import precision_recall_curve

    y = state.test_y
    if y.sum() == 0:
        return BaselinesView(None, pd.DataFrame(), "the test period holds no fraud; nothing to compare")
    patterns = sorted(set(state.test_type[y == 1]))
    rows = []
    plt = _plt()
    fig, ax = plt.subplots(figsize=(6, 4.5))
    for name, s in state.test_scores.items():
        m = point_metrics(y, s)
        p, r, _ = precision_recall_curve(y, s)
        ax.plot(r, p, label=f"{name} (AP {m['pr_auc']:.3f})")
        thr = state.thresholds[name]
        row = {"model": name, "pr_auc": m["pr_auc"], "roc_auc": m["roc_auc"], "threshold": thr}
        for pat in patterns:
            sel = state.test_type == pat
            row[f"recall {pat}"] = float((s[sel] >= thr).mean())
        rows.append(row)
    ax.set_xlabel("recall")
    ax.set_ylabel("precision")
    ax.set_title(f"Test period: {len(y):,} transactions, {int(y.sum())} frauds")
    ax.legend(fontsize=8)
    fig.tight_layout()
    return BaselinesView(fig, pd.DataFrame(rows))


# -- tab 6: model and schema --------------------------------------------------------------------------
@dataclass
class ModelView:
    """``layers``: ``index, type``; ``params``: ``part, parameters``; ``schema``: ``f, feature, kind,
    vocab size``; ``amount_edges``: ``bin id, from, to`` (the fitted amount bins, in currency units)."""

    layers: pd.DataFrame
    params: pd.DataFrame
    schema: pd.DataFrame
    amount_edges: pd.DataFrame


def model_view(state: DemoState) -> ModelView:
    """Tab 6: layer order, parameter counts, schema table and fitted amount bin edges."""
    enc = state.model.encoder
    order = list(enc.config.backbone_config().layer_order)
    layers = pd.DataFrame({"index": range(len(order)), "type": order})
    counts = dict(enc.param_count())
    counts["fraud_head"] = sum(p.numel() for p in state.model.fraud_head.parameters())
    params = pd.DataFrame({"part": list(counts), "parameters": list(counts.values())})
    feats = state.fitted.schema.features
    schema = pd.DataFrame({"f": range(len(feats)), "feature": [f.name for f in feats], "kind": [f.kind for f in feats],
                           "vocab size": [f.vocab_size for f in feats]})
    edges = [-np.inf] + list(state.fitted.fitted["amount"]["edges"]) + [np.inf]
    f_amt = [f.name for f in feats].index("amount")
    first = 5 if feats[f_amt].encoding.get("zero_token") else 4
    lo = [0.0 if not np.isfinite(a) else float(np.expm1(a)) for a in edges[:-1]]
    hi = [float("inf") if not np.isfinite(b) else float(np.expm1(b)) for b in edges[1:]]
    amount_edges = pd.DataFrame({"bin id": np.arange(first, first + len(lo)), "from": lo, "to": hi})
    return ModelView(layers, params, schema, amount_edges)
