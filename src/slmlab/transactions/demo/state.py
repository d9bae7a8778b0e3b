"""The demo's state: one :class:`DemoState` (bank, fitted schema, fraud model, validation threshold,
baseline scores), how it is built (:func:`quick_state`, :func:`load_state`, :func:`build_state`), and the
per-customer helpers the tabs share (a customer's history, its encoding and streaming scores).
"""

from __future__ import annotations

import json
import time
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from .._deps import pd
from ..data.bank import Bank, export, load_bank, prepare_bank
from ..data.schema import FittedSchema
from ..data.synth import SynthConfig, generate, world_of
from ..data.windows import Windows, build_windows
from ..evaluation.baseline import hgb_scores
from ..evaluation.evaluate import threshold_at_fpr
from ..evaluation.score import score_bank, score_windows
from ..evaluation.stacking import stacked_scores
from ..heads import TransactionFraudModel
from ..model import preset_schema
from ..training import finetune, pretrain

VIEW_ROWS = 64  # transactions shown in the data and scoring tabs
SPREES = ("card_testing", "account_takeover", "lost_stolen")
RAW_COLUMNS = ("timestamp", "amount", "txn_type", "mcc", "merchant_id", "merchant_country", "entry_mode",
               "auth_method", "device_id", "response_code")


class DemoInputError(ValueError):
    """Input a tab cannot act on (shown as the tab's message, never as a traceback)."""


@dataclass
class DemoState:
    """Everything the tabs read; built once by :func:`build_state`.

    Attributes:
        model: the fine-tuned :class:`TransactionFraudModel` (eval mode).
        bank: the encoded bank (temporal split cuts, customers table).
        threshold: the score at which validation FPR is <= 1% (the alert line).
        test_scores: model name -> test-period scores (``hgb_raw``, ``hgb_rolling``, ``sequence`` and
            ``stacked``).
        test_y: test-period labels; test_type: their ``fraud_type`` ("nan" for legit rows).
        thresholds: model name -> its validation 1%-FPR threshold (``evaluate.operating_threshold``: set by the
            validation negatives alone, so it exists without a validation fraud; finite always).
        synth: the generator config of the bank when known (needed to inject sprees), else None.
        embeddings: customer -> embedding, filled on first use of the similarity tab.
        timings: seconds taken (``state_s``; ``generate_s``, ``train_s`` for the quick start).
        paths: where the quick start wrote ``bank`` and ``checkpoint``.
    """

    model: TransactionFraudModel
    bank: Bank
    threshold: float
    test_scores: dict[str, np.ndarray]
    test_y: np.ndarray
    test_type: np.ndarray
    thresholds: dict[str, float]
    synth: object | None = None
    embeddings: dict | None = None
    timings: dict = field(default_factory=dict)
    paths: dict = field(default_factory=dict)
    _world: object | None = None

    @property
    def fitted(self) -> FittedSchema:
        return self.bank.fitted

    @property
    def T(self) -> int:
        return int(self.model.config.max_transactions)

    def customer_ids(self) -> list[str]:
        """Customers in the bank, those with a fraud in the test period first."""
        df = self.bank.df
        test = self.bank.period_mask(self.bank.cuts["test_start"], None)
        fraud = set(df.loc[test & (df["is_fraud"].fillna(0).to_numpy() == 1), "customer_id"]) if "is_fraud" in df else set()
        ids = list(self.bank.starts)
        return sorted(fraud) + [c for c in ids if c not in fraud]

    def world(self):
        """The generator's world of the bank (rebuilt from its config once)."""
        if self.synth is None:
            raise DemoInputError("this bank has no generator config (manifest.json), so sprees cannot be built; "
                                 "use a bank written by `slmlab transactions generate`")
        if self._world is None:
            self._world = world_of(self.synth)
        return self._world


# -- building the state ----------------------------------------------------------------------------
def build_state(model: TransactionFraudModel, bank: Bank, synth=None, baselines: bool = True,
                stacked: bool = True) -> DemoState:
    """Score validation and test with the model, (``baselines``) both gradient-boosting baselines and
    (``stacked``, with the baselines) the stacked model, and fix each model's validation 1%-FPR
    threshold.

    The baselines are fitted as in evaluation (train labels known by the end of train). The
    thresholds use the validation labels known by the end of the data: the demo looks back at a
    finished period, and on a short bank (the quick start's 60 days) almost no validation fraud is
    confirmed by the start of test, which is the cut-off evaluation uses."""
    model.eval()
    t0 = time.perf_counter()
    df = bank.df
    test = bank.period_mask(bank.cuts["test_start"], None)
    val = bank.period_mask(bank.cuts["val_start"], bank.cuts["val_end"])
    y_val = bank.labels(bank.cuts["end"])
    val_ok = val & (y_val >= 0)
    scores = {"hgb_raw": hgb_scores(bank, rolling=False)[0], "hgb_rolling": hgb_scores(bank, rolling=True)[0]} \
        if baselines else {}
    scores["sequence"] = score_bank(model, bank, bank.cuts["val_start"])
    if baselines and stacked:
        scores.update(stacked_model_scores(scores, bank))
    thresholds = {name: threshold_at_fpr(y_val[val_ok], s[val_ok], 0.01) for name, s in scores.items()}
    y = df["is_fraud"].fillna(0).to_numpy().astype(int) if "is_fraud" in df else np.zeros(len(df), int)
    ftype = df["fraud_type"].astype(str).to_numpy() if "fraud_type" in df else np.full(len(df), "nan")
    return DemoState(model, bank, thresholds["sequence"], {k: v[test] for k, v in scores.items()}, y[test],
                     ftype[test], thresholds, synth, timings={"state_s": time.perf_counter() - t0})


def stacked_model_scores(scores: dict[str, np.ndarray], bank: Bank) -> dict[str, np.ndarray]:
    """``{"stacked": scores [N]}``: the report's stacker (:func:`~slmlab.transactions.evaluation.stacking.stacked_scores`:
    a monotone blend of HGB-rolling and the sequence score fitted on validation, or the better of the two
    when the blend does not beat it out of fold), with the validation labels known by the end of the data
    (as the demo's thresholds)."""
    return {"stacked": stacked_scores(bank, scores, labels_at=bank.cuts["end"])[0]}


def load_state(checkpoint: str | Path, data: str | Path, baselines: bool = True) -> DemoState:
    """A state from a fine-tuned run or checkpoint folder and a bank folder.

    The schema the model was trained with tokenises the bank: the folder's ``schema.fitted.json`` (itself
    or its resolved checkpoint; every pretraining and fine-tuning run writes one), else the fitted schema
    recorded in the model's config.
    """
    from ...train.checkpoint import resolve_checkpoint

    checkpoint = Path(checkpoint)
    if not checkpoint.exists():
        raise ValueError(f"checkpoint {checkpoint} does not exist; pass a fine-tuned run folder or use --quick")
    ckpt = resolve_checkpoint(checkpoint)
    model = TransactionFraudModel.from_pretrained(str(ckpt))
    if getattr(model.config, "tabular_features", None) is not None:
        raise ValueError(f"checkpoint {checkpoint} is a joint-fusion model (it reads rolling features the demo's"
                         " edited histories do not carry); show a sequence-only fraud model, and score this one"
                         " with `slmlab transactions score` or `evaluate --also`")
    schema_file = next((p / "schema.fitted.json" for p in (checkpoint, ckpt) if (p / "schema.fitted.json").is_file()),
                       None)
    fitted = FittedSchema.load(schema_file) if schema_file is not None else model.config.fitted_schema
    if fitted is None:
        raise ValueError(f"checkpoint {checkpoint} has no schema.fitted.json and its config records no fitted schema;"
                         " copy the pretraining run's schema.fitted.json into it (or use --quick)")
    data = Path(data)
    bank_data = load_bank(data)
    bank = prepare_bank(bank_data.transactions, fitted, bank_data.customers)
    synth = None
    manifest = data / "manifest.json"
    if manifest.is_file() and json.loads(manifest.read_text()).get("config"):
        synth = SynthConfig(**json.loads(manifest.read_text())["config"])
    return build_state(model, bank, synth, baselines)


def quick_state(work_dir: str | Path, pretrain_steps: int = 60, finetune_steps: int = 60,
                synth_overrides: dict | None = None, batch_size: int = 32, stacked: bool = True) -> DemoState:
    """Generate the ``tiny`` bank into ``work_dir/bank``, pretrain ``lfm2_tiny`` and fine-tune the
    fraud head (``work_dir/pretrain``, ``work_dir/finetune``, which gets ``schema.fitted.json`` so
    ``--checkpoint work_dir/finetune`` reloads it). ``timings`` holds ``generate_s`` and ``train_s``."""
    work = Path(work_dir)
    cfg = SynthConfig.from_preset("tiny", **(synth_overrides or {}))
    t0 = time.perf_counter()
    data = generate(cfg)
    export(data, work / "bank", "parquet", cfg=cfg)
    t_gen = time.perf_counter() - t0
    t1 = time.perf_counter()
    bank = prepare_bank(data.transactions, preset_schema("lfm2_tiny"), data.customers)
    run = ["progress=false", "device=cpu", f"batch_size={batch_size}"]
    enc = pretrain(bank, "lfm2_tiny", work / "pretrain", [*run, f"max_steps={pretrain_steps}"]).model
    model = finetune(bank, work / "finetune", enc, overrides=[*run, f"max_steps={finetune_steps}"],
                     fraud_share=0.3).model
    model.save_pretrained(work / "finetune")
    bank.fitted.save(work / "finetune")
    t_train = time.perf_counter() - t1
    state = build_state(model, bank, cfg, stacked=stacked)
    state.timings.update(generate_s=t_gen, train_s=t_train)
    state.paths.update(bank=work / "bank", checkpoint=work / "finetune")
    return state


# -- a customer's history ---------------------------------------------------------------------------
def customer_frame(state: DemoState, customer_id: str, injected: pd.DataFrame | None = None) -> pd.DataFrame:
    """The customer's transactions (plus ``injected`` rows), oldest first, with an ``injected`` flag."""
    cid = str(customer_id or "").strip()
    starts = state.bank.starts
    profiles = state.bank.customers
    known = cid in starts or (profiles is not None and cid in set(profiles["customer_id"].astype(str)))
    if not known:
        raise DemoInputError(f"customer {cid!r} is not in the bank; pick one from the list (e.g. {next(iter(starts))})")
    df = state.bank.df[state.bank.df["customer_id"] == cid].drop(columns=["row"], errors="ignore").assign(injected=False)
    if injected is not None and len(injected):
        extra = injected[injected["customer_id"] == cid]
        df = pd.concat([df, extra.assign(injected=True)], ignore_index=True)
    return df.sort_values(["timestamp", "transaction_id"], kind="stable").reset_index(drop=True)


def encode_history(state: DemoState, df: pd.DataFrame) -> np.ndarray:
    """``int64 [n, F]`` ids of one customer's rows (``df`` oldest first), encoded with the model's
    fitted schema (``delta_t`` over the whole given history)."""
    if not len(df):
        return np.zeros((0, len(state.fitted.schema.features)), np.int64)
    sorted_df, ids = state.fitted.encode_frame(df.drop(columns=["injected"], errors="ignore"), state.bank.customers)
    order = pd.Index(sorted_df["transaction_id"]).get_indexer(df["transaction_id"].astype(str))
    return ids[order].astype(np.int64)


def stream_scores(model, ids: np.ndarray) -> tuple[np.ndarray, int]:
    """Every transaction of one history ``[n, F]`` scored exactly once (windows of ``T``, stride
    ``T // 2``, each scoring only its newest rows); returns (scores ``[n]``, backbone tokens run)."""
    T = int(model.config.max_transactions)
    w = build_windows({"c": ids}, T, T // 2)
    rows, scores = score_windows(model, w)
    out = np.full(len(ids), np.nan)
    out[rows] = scores
    return out, len(w) * T * ids.shape[1]


def own_windows(ids: np.ndarray, ends: np.ndarray, T: int) -> Windows:
    """One window per ``e`` in ``ends``: the ``T`` transactions of the history ``ids [n, F]`` ending at
    ``e`` (left padded), each scoring only its newest row."""
    F = ids.shape[1]
    w = np.zeros((len(ends), T, F), np.int64)
    m = np.zeros((len(ends), T), bool)
    rows = np.full((len(ends), T), -1, np.int64)
    for i, e in enumerate(ends):
        lo = max(0, e - T + 1)
        w[i, T - (e + 1 - lo):] = ids[lo:e + 1]
        m[i, T - (e + 1 - lo):] = True
        rows[i, T - (e + 1 - lo):] = np.arange(lo, e + 1)
    return Windows(w, m, np.where(m, 0, -1).astype(np.int8), rows, np.full(len(ends), T - 1, np.int64))


def window_scores(model, ids: np.ndarray, ends: np.ndarray, batch_size: int = 64) -> np.ndarray:
    """The score of transaction ``e`` for each ``e`` in ``ends``, read from its own window (the ``T``
    transactions ending at ``e``, left padded); the one-window-per-transaction reference."""
    _, scores = score_windows(model, own_windows(ids, np.asarray(ends), int(model.config.max_transactions)),
                              batch_size)
    return scores
