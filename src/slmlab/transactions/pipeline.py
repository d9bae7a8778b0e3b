"""One function per ``slmlab transactions`` subcommand, from folders and options to results: the
command (:mod:`slmlab.commands.transactions`) parses its arguments, calls one of these and prints.

Every function takes the subcommand's options by their argparse names (``data``: a bank folder,
``out``: where results go, ``threads``: torch's CPU threads, ``device``: ``auto`` / ``cpu`` / ``cuda``;
``files`` and ``overrides``: run-config YAML files and ``key=value`` overrides of the harness's run
config, as the command split them).
"""

from __future__ import annotations

import json
import shutil
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

import torch

from ..outputs import dumps_finite, staged_folder
from ..train.checkpoint import resolve_checkpoint
from ..train.session import RunSession
from ..train.trainer import Trainer, resolve_device
from . import training
from .data.bank import Bank, export, label_customers, load_bank, parse_customer_slice, prepare_bank, subset_customers
from .data.schema import FittedSchema, SchemaConfig
from .data.synth import SynthConfig, SynthData, generate
from .evaluation.evaluate import evaluate_models
from .evaluation.score import score_transactions
from .heads import HEADS, TransactionFraudModel, head_spec
from .model import PRESETS, TransactionEncoder, TxnEncoderConfig, preset_schema
from .run_folder import TRANSACTIONS, check_out_dir, check_out_file, is_non_empty, require_encoder, require_fraud_model


def setup(threads: int = 0, device: str = "auto") -> str:
    """Set torch's CPU threads (``threads`` > 0) and resolve ``device`` (``auto``: CUDA when present)."""
    if threads:
        torch.set_num_threads(threads)
    return str(resolve_device(device))


def load_model(path: str | Path, cls):
    """``cls.from_pretrained`` of a run folder (its newest checkpoint) or a checkpoint folder."""
    return cls.from_pretrained(str(resolve_checkpoint(path)))


def warn(message: str) -> None:
    print(f"slmlab transactions: warning: {message}", file=sys.stderr)


def check_drift(fitted: FittedSchema | None, transactions) -> None:
    """Refuse data missing a column the model was trained with; warn of columns it does not know."""
    if fitted is not None:
        for line in fitted.check_drift(transactions):
            warn(line)


def load_prepared_bank(data: str | Path, schema: SchemaConfig | FittedSchema, customer_disjoint: bool = False) -> Bank:
    """The bank folder ``data`` split and encoded with ``schema`` (fitted on its training rows unless
    already fitted: then the data's columns are checked against the training rows' first)."""
    tables = load_bank(data)
    if isinstance(schema, FittedSchema):
        check_drift(schema, tables.transactions)
    return prepare_bank(tables.transactions, schema, tables.customers, customer_disjoint=customer_disjoint)


# -- generate --------------------------------------------------------------------------------------------
@dataclass
class Generated:
    """What :func:`generate_bank` wrote: the tables, the manifest and the generation time."""

    data: SynthData
    manifest: dict
    seconds: float


def _refuse_a_bank_folder(out: str | Path, force: bool) -> None:
    """``generate`` and ``subset`` write a bank into ``out``: a folder that already holds files (a bank, a
    mapped real export) is refused unless ``force``."""
    check_out_dir(out)
    if not force and is_non_empty(out):
        raise ValueError(f"--out {out} is not empty (it may hold a bank or a mapped real export); pass --force to"
                         " overwrite its files, or choose another folder")


def generate_bank(out: str | Path, preset: str = "tiny", seed: int | None = None, fmt: str = "parquet",
                  labels_separate: bool = False, overrides: dict | None = None, force: bool = False) -> Generated:
    """Generate the synthetic bank of ``preset`` (``configs/synth.yaml``) with ``overrides`` (generator
    settings, e.g. ``{"n_customers": 1000}``; ``seed`` wins over theirs) and write it to ``out``: a
    folder that already holds files (a bank, a mapped real export) is refused unless ``force``."""
    _refuse_a_bank_folder(out, force)
    overrides = dict(overrides or {})
    if seed is not None:
        overrides["seed"] = seed
    try:
        cfg = SynthConfig.from_preset(preset, **overrides)
    except TypeError as err:
        raise ValueError(f"unknown generator setting ({err}); see configs/synth.yaml for the keys") from None
    t0 = time.perf_counter()
    data = generate(cfg, progress=True)
    seconds = time.perf_counter() - t0
    return Generated(data, export(data, out, fmt, labels_separate, cfg), seconds)


def subset_bank(data: str | Path, out: str | Path, customers: str, force: bool = False) -> Generated:
    """Write the bank of the customers ``customers`` (``START:STOP`` over the sorted customer ids, e.g.
    ``:6500``) of the bank folder ``data`` to ``out``, in the source's format, every merchant kept; the
    manifest records the source and the slice. E.g. a disjoint pretraining bank (``6500:``) for an
    encoder whose states join a booster fitted on ``:6500``."""
    _refuse_a_bank_folder(out, force)
    which = parse_customer_slice(customers)
    t0 = time.perf_counter()
    sub = subset_customers(load_bank(data), which)
    fmt = "parquet" if Path(data, "transactions.parquet").is_file() else "csv"
    with staged_folder(out, "--out", own=lambda _: force) as tmp:  # a failure midway leaves no partial bank
        manifest = export(sub, tmp, fmt, labels_separate=Path(data, "labels.csv").is_file())
        source = Path(data, "manifest.json")
        if source.is_file():  # the generator settings that made the rows (None for a mapped real export)
            manifest["config"] = json.loads(source.read_text()).get("config")
        manifest["subset"] = {"source": str(data), "customers": customers,
                              "n_customers": int(sub.transactions["customer_id"].nunique())}
        Path(tmp, "manifest.json").write_text(dumps_finite(manifest, indent=1))
    return Generated(sub, manifest, time.perf_counter() - t0)


# -- pretrain / finetune -------------------------------------------------------------------------------------
def pretrain(data: str | Path, out: str | Path, preset: str = "lfm2_tiny", files=(), overrides=(), device: str = "auto",
             threads: int = 0, customer_disjoint: bool = False, resume: bool = False,
             max_transactions: int | None = None, allow_change: tuple[str, ...] = (),
             val_windows: int | None = None) -> Trainer:
    """Pretrain an encoder of ``preset`` on the bank ``data`` into the run folder ``out``; returns the
    harness's ``Trainer`` (``state.last_eval``: the validation report on all validation windows, or on a
    seeded sample of ``val_windows``). The run's session is opened before the bank is loaded: a held or
    non-empty folder is refused before minutes of loading."""
    setup(threads, device)
    if preset not in PRESETS:
        raise ValueError(f"unknown preset {preset!r}; use one of {sorted(PRESETS)}")
    with RunSession(out, TRANSACTIONS, resume, allow_change) as session:
        bank = load_prepared_bank(data, preset_schema(preset), customer_disjoint)
        return training.pretrain(bank, preset, out, [f"device={device}", *overrides], files=list(files),
                                 max_transactions=max_transactions, val_windows=val_windows, session=session)


def finetune(data: str | Path, out: str | Path, encoder: str | Path | None = None, preset: str = "lfm2_tiny",
             files=(), overrides=(), device: str = "auto", threads: int = 0, customer_disjoint: bool = False,
             head: str = "transaction", linear_probe: bool = False, resume: bool = False,
             allow_change: tuple[str, ...] = (), val_windows: int | None = None, **options) -> Trainer:
    """Fine-tune the head ``head`` (a name of :data:`~slmlab.transactions.heads.HEADS`) from the
    pretrained run folder ``encoder`` (else from scratch) on the bank ``data`` into ``out``; returns
    the harness's ``Trainer`` (``val_windows``: validate on a seeded sample of that many windows).

    ``options``: the command's head options (``keep_negative``, ``fraud_share``, ``label_fraction``,
    ``loss``, ``focal_gamma``, ``head_inputs``, ``head_hidden``, ``head_dropout``, ``tabular``, ``recent_k``); each head takes the ones
    its spec names (``data_options``, ``cli_options``) and ignores the others."""
    spec = head_spec(head)
    known = {"keep_negative", "fraud_share", "label_fraction", "seed"} | {k for s in HEADS.values() for k in s.cli_options}
    if set(options) - known:
        raise ValueError(f"unknown finetune options {sorted(set(options) - known)}; known: {sorted(known)}")
    setup(threads, device)
    if encoder:
        require_encoder(encoder)
    with RunSession(out, TRANSACTIONS, resume, allow_change) as session:  # as pretrain's: before the loading
        model = load_model(encoder, TransactionEncoder) if encoder else None
        schema = model.config.fitted_schema if model is not None else preset_schema(preset)
        bank = load_prepared_bank(data, schema, customer_disjoint)
        window_options = {k: v for k, v in options.items() if k in spec.data_options}
        head_config = spec.head_config(options)
        return training.finetune(bank, out, model, preset, [f"device={device}", *overrides], linear_probe,
                                 files=list(files), head=head, val_windows=val_windows, session=session,
                                 **window_options, **head_config)


def pretrain_summary(trainer: Trainer, out: str | Path) -> list[str]:
    """What ``slmlab transactions pretrain`` prints of its run: the steps, the validation cross-entropy and,
    per feature, its cross-entropy beside the training and customer-history unigrams'."""
    ev = trainer.state.last_eval
    lines = [f"pretrained {trainer.state.step} steps; validation CE {ev.get('loss', float('nan')):.4f} -> {out}"]
    for name in trainer.model.feature_names:
        lines.append(f"  {name:<16} CE {ev[f'ce/{name}']:.3f}  unigram {ev[f'unigram/{name}']:.3f}"
                     f"  history {ev[f'history/{name}']:.3f}")
    return lines


def finetune_summary(trainer: Trainer, head: str, out: str | Path) -> list[str]:
    """What ``slmlab transactions finetune`` prints of its run: the transaction head's validation PR-AUC
    (and its best, kept in ``out/checkpoints/best``), or another head's validation figures."""
    ev, st = trainer.state.last_eval, trainer.state
    if head != "transaction":
        return [f"fine-tuned the {head} head {st.step} steps -> {out}",
                *(f"  {key:<34} {ev[key]:.4f}" for key in sorted(ev) if isinstance(ev[key], (int, float)))]
    lines = [f"fine-tuned {st.step} steps; validation PR-AUC {ev.get('pr_auc', float('nan')):.4f} -> {out}"]
    if st.best_step >= 0:
        lines.append(f"best validation PR-AUC {st.best_acc:.4f} at step {st.best_step}"
                     f" -> {Path(out, 'checkpoints', 'best')}")
    return lines


def exit_status(trainer: Trainer) -> int:
    """The exit status of a ``pretrain`` or ``finetune`` run (0; 130 / 143 when Ctrl-C / SIGTERM stopped it,
    saying on stderr how to resume): :meth:`slmlab.train.session.RunKind.exit_status`."""
    return TRANSACTIONS.exit_status(trainer.state.stop_reason)


# -- evaluate / score ----------------------------------------------------------------------------------------
def evaluate(data: str | Path, out: str | Path, model: str | Path | None = None, bootstrap: int = 1000,
             label_fraction: float | None = None, encoder: str | Path | None = None,
             keep_negative: float = 1.0, files=(), overrides=(), device: str = "auto", threads: int = 0,
             customer_disjoint: bool = False, also: dict[str, str] | None = None, cache: str | Path | None = None,
             val_windows: int | None = None, seeds: int | None = None, primary: str | None = None) -> dict:
    """The test-period report of the fine-tuned run folder ``model`` (omitted: the baselines only) on
    the bank ``data`` against gradient boosting, written to ``out`` (``report.md``, ``metrics.json``,
    ``pr_curve.png``); returns the metrics.

    With ``model`` the report holds ``sequence`` and ``stacked`` (the monotone blend of out-of-fit scores,
    fitted on validation and checked out of fold, :mod:`.evaluation.stacking`). ``encoder`` (a pretrained
    run folder) adds ``hgb_rolling_encoder``; with ``label_fraction`` it also fine-tunes from it and from
    scratch on that share of the labels, ``seeds`` times each (default 3; ``keep_negative``, ``files`` and
    ``overrides`` as ``finetune``'s), for criterion 4. ``also``: further fine-tuned run folders by report
    name (e.g. ``{"joint": "runs/ftj"}``; one whose head reads tabular features is fused and a stacker input,
    :func:`.evaluation.kinds.fraud_model_kind`, whatever its name); ``cache``: a
    folder keeping the boosters' scores between evaluations of the same bank; ``val_windows``: the
    few-label runs validate on a seeded sample of that many windows; ``primary``: criterion 2's pre-declared
    comparison, ``stacked`` (needs ``model``) or ``hgb_rolling_encoder`` (needs ``encoder``); default
    ``stacked`` with a model, else ``hgb_rolling_encoder``."""
    device = setup(threads, device)
    check_out_dir(out)
    if label_fraction is not None and encoder is None:
        raise ValueError("--label-fraction and --encoder go together; pass both (e.g. --label-fraction 0.1"
                         " --encoder runs/pre) or neither")
    if seeds is not None and label_fraction is None:
        raise ValueError(f"--seeds {seeds} counts the --label-fraction fine-tunes per arm; pass --label-fraction"
                         " and --encoder too, or drop --seeds")
    if seeds is not None and seeds < 1:
        raise ValueError(f"--seeds must be >= 1, got {seeds}")
    needs = {"stacked": (model, "--model FT"), "hgb_rolling_encoder": (encoder, "--encoder PRE")}
    if primary is not None:
        if primary not in needs:
            raise ValueError(f"--primary {primary!r} is not a primary comparison; choose one of {', '.join(needs)}")
        if not needs[primary][0]:
            raise ValueError(f"--primary {primary} needs {needs[primary][1]}; pass it, or choose the other primary")
    if label_fraction is not None:
        label_customers([], label_fraction)  # fail before loading anything
    if encoder is not None:
        require_encoder(encoder)
    for name, path in (also or {}).items():
        require_fraud_model(path, f"--also {name}")
    if model:
        require_fraud_model(model)
    fraud = load_model(model, TransactionFraudModel).to(device) if model else None
    extras = {name: load_model(path, TransactionFraudModel).to(device) for name, path in (also or {}).items()}
    reference = fraud if fraud is not None else next(iter(extras.values()), None)
    for name, extra in extras.items():
        if extra.config.schema != reference.config.schema:
            raise ValueError(f"--also {name} holds another fitted schema than --model; fine-tune both from the same"
                             " encoder (the bank is tokenised once, with one schema)")
    schema = reference.config.fitted_schema if reference is not None else preset_schema("lfm2_tiny")
    models, arms = {}, None
    enc = load_model(encoder, TransactionEncoder).to(device) if encoder is not None else None
    if enc is not None and reference is not None and enc.config.schema != reference.config.schema:
        raise ValueError("--encoder and --model hold different fitted schemas; pass the encoder the model was"
                         " fine-tuned from")
    if enc is not None:
        schema = enc.config.fitted_schema
    bank = load_prepared_bank(data, schema, customer_disjoint)
    if label_fraction is not None:
        models, arms = training.finetune_label_fraction_arms(
            bank, Path(out, "label_fraction"), enc, label_fraction, [f"device={device}", *overrides], keep_negative,
            files=list(files), val_windows=val_windows, seeds=range(3 if seeds is None else seeds))
    models.update(extras)
    return evaluate_models(bank, fraud, out, bootstrap, device=device, progress=True, models=models,
                           cache_dir=cache, encoder=enc, primary=primary, arms=arms)


def score(data: str | Path, out: str | Path, model: str | Path | None = None, device: str = "auto",
          threads: int = 0):
    """Stream-score every transaction of the bank ``data`` with the fine-tuned run folder ``model`` and
    write ``transaction_id, score`` to the CSV file ``out``; returns that table."""
    device = setup(threads, device)
    if not model:
        raise ValueError("score needs --model; pass a fine-tuned run folder")
    check_out_file(out)
    require_fraud_model(model)
    fraud = load_model(model, TransactionFraudModel).to(device)
    tables = load_bank(data)
    check_drift(fraud.config.fitted_schema, tables.transactions)
    table = score_transactions(fraud, tables.transactions, tables.customers, device=device)
    Path(out).parent.mkdir(parents=True, exist_ok=True)
    table.to_csv(out, index=False)
    return table


# -- audit / demo --------------------------------------------------------------------------------------------
def audit(preset: str = "lfm2_small") -> dict:
    """``param_count()`` of an encoder of ``preset`` (built on the meta device: no memory, no init)."""
    with torch.device("meta"):
        model = TransactionEncoder(TxnEncoderConfig.from_preset(preset))
    return {"preset": preset, **model.param_count()}


def demo(quick: bool = False, checkpoint: str | Path | None = None, data: str | Path | None = None,
         host: str = "127.0.0.1", port: int = 7860, threads: int = 0, log=print):
    """Serve the six-tab demo on ``host:port`` until interrupted: ``quick`` generates the tiny bank into
    ``data`` (default: a new temporary folder) and trains ``lfm2_tiny`` first; else the fine-tuned
    ``checkpoint`` on the bank ``data``. ``log`` receives the progress lines."""
    from threadpoolctl import threadpool_limits

    from .demo.app import check_port, launch
    from .demo.state import load_state, quick_state

    setup(threads)
    if quick and data:
        check_out_dir(data, "--data")
        if is_non_empty(data):
            raise ValueError(f"--data {data} is not empty; --quick writes a new bank and runs there: choose an empty or"
                             " new folder (or omit --data for a temporary one)")
    if not quick:
        if not data:
            raise ValueError("--checkpoint needs --data, the bank folder the demo shows")
        require_fraud_model(checkpoint, "--checkpoint")
    # the demo's gradient-boosting fits are small; a full OpenMP pool on busy cores stalls them for minutes
    threadpool_limits(threads or 1)
    check_port(host, port)  # before minutes of training
    if not quick:
        state = load_state(checkpoint, data)
        log(f"demo on http://{host}:{port} (Ctrl-C stops it)")
        return launch(state, host, port)
    temporary = not data  # a folder of our own: removed when the demo stops, however it stops
    work = Path(data) if data else Path(tempfile.mkdtemp(prefix="slmlab-demo-"))
    try:
        state = quick_state(work)
        t = state.timings
        log(f"quick: generated the tiny bank in {t['generate_s']:.1f} s, trained lfm2_tiny in {t['train_s']:.1f} s"
            f" (baselines and threshold {t['state_s']:.1f} s) -> {work}{' (temporary)' if temporary else ''}")
        log(f"demo on http://{host}:{port} (Ctrl-C stops it)")
        return launch(state, host, port)
    finally:
        if temporary:
            shutil.rmtree(work, ignore_errors=True)

