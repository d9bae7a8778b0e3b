"""The two training stages through the harness's ``Trainer``: next-token pretraining of the encoder and
fine-tuning of a head of :data:`~slmlab.transactions.heads.HEADS` (progress bar, checkpoints, exact
resume and the non-finite stop are the harness's)."""

from __future__ import annotations

import shutil
from functools import partial
from pathlib import Path

import torch

from ..outputs import dumps_finite
from ..train.checkpoint import list_checkpoints
from ..train.config import load_config
from ..train.resume_check import compare_for_resume
from ..train.saved import saved_run_config
from ..train.session import RunSession, held, interruption
from ..train.signals import exit_status
from ..train.trainer import Trainer
from .data.bank import Bank, label_customers
from .data.windows import TransactionWindows, WindowOptions, fraud_positions, sample_windows
from .evaluation.cache import weights_key
from .evaluation.pretrain import pretrain_report, unigram_counts
from .heads import TransactionFraudModel, head_spec
from .model import TransactionEncoder, TxnEncoderConfig
from .run_folder import TRANSACTIONS, bank_fingerprint

PRETRAIN_DEFAULTS = {"batch_size": 32, "max_steps": 200, "eval_every": 0, "checkpoint_every": 0, "log_every": 10,
                     "tensorboard": False, "optim": {"lr": 1e-3, "weight_decay": 0.1}, "schedule": {"warmup": 0.1}}
MIN_VAL_FRAUDS = 150  # the fine-tuning validation sample grows until it holds this many frauds (or all)
FINETUNE_DEFAULTS = {"batch_size": 32, "max_steps": 200, "eval_every": 0, "checkpoint_every": 0, "log_every": 10,
                     "tensorboard": False, "optim": {"lr": 1e-3, "lr_scales": {"encoder.": 0.1}},
                     "schedule": {"warmup": 0.1}}


def _run_config(defaults: dict, out_dir: str | Path, overrides: list[str], files: list[str] = (), bank: Bank | None = None,
                model_config: dict | None = None):
    """The harness's run config; ``data`` names the bank's content and ``model_config`` the model and head
    settings, so that ``--resume`` refuses a change of either (:meth:`slmlab.train.session.RunSession.check_resume`)."""
    base = {**defaults, "out_dir": str(out_dir), "model": "transactions",
            "data": bank_fingerprint(bank) if bank is not None else "transactions", "model_config": model_config or {}}
    return load_config(list(files), list(overrides), base=base)


def _sampled(val_windows: int | None) -> dict:
    """The run identity's entry for a validation sample (none for the whole split, as before it existed)."""
    return {} if val_windows is None else {"val_windows": int(val_windows)}


def pretrain(bank: Bank, preset: str, out_dir: str | Path, overrides: list[str] = (), resume: bool = False,
             model: TransactionEncoder | None = None, files: list[str] = (),
             max_transactions: int | None = None, allow_change: tuple[str, ...] = (),
             val_windows: int | None = None, session: RunSession | None = None) -> Trainer:
    """Pretrain an encoder of ``preset`` on the bank's training windows (stride ``T // 2``);
    validation reports per-feature CE against the training and customer-history unigrams.
    ``max_transactions`` sets the window length ``T`` (default: the preset's); fine-tuning and
    scoring read ``T`` back from the saved encoder config. ``val_windows``: validate on a seeded sample
    of that many validation windows (default: all of them; a large bank's validation period costs
    minutes of CPU per pass).

    The run is a :class:`~slmlab.train.session.RunSession` of :data:`.run_folder.TRANSACTIONS`: locked
    while it lasts, refused when the folder already holds a run unless ``resume`` (which refuses a changed
    seed, bank or model and trims ``metrics.jsonl``). ``session``: one the caller opened on ``out_dir``
    before loading the bank (it decided ``resume`` and ``allow_change``); None: opened here."""
    length = {} if max_transactions is None else {"max_transactions": max_transactions}
    identity = {"stage": "pretrain", "preset": preset, **length, **_sampled(val_windows)}
    cfg = _run_config(PRETRAIN_DEFAULTS, out_dir, overrides, files, bank, identity)
    with held(session, out_dir, TRANSACTIONS, resume, allow_change) as session:
        return _pretrain(bank, preset, cfg, session, model, length, val_windows)


def _pretrain(bank: Bank, preset: str, cfg, session: RunSession, model: TransactionEncoder | None, length: dict,
              val_windows: int | None = None) -> Trainer:
    session.check_resume(cfg)
    torch.manual_seed(cfg.seed)
    model = model or TransactionEncoder(TxnEncoderConfig.from_preset(preset, schema=bank.fitted, **length))
    T = model.config.max_transactions
    windows = {"train": bank.windows(T, T // 2, "train", jitter_seed=cfg.seed),
               "validation": sample_windows(bank.windows(T, T // 2, "validation"), val_windows, cfg.seed)}
    source = TransactionWindows(windows)
    counts = unigram_counts(windows["train"], list(model.config.schema_config.vocab_sizes))
    bs = cfg.eval_batch_size or cfg.batch_size

    def evaluator(m, split):
        return pretrain_report(m, windows[split], counts, bs, next(m.parameters()).device)

    trainer = Trainer(cfg, model, source, evaluator=evaluator)
    session.start(trainer)
    bank.fitted.save(Path(cfg.out_dir))
    trainer.train()
    return trainer


def finetune(bank: Bank, out_dir: str | Path, encoder: TransactionEncoder | None = None, preset: str = "lfm2_tiny",
             overrides: list[str] = (), linear_probe: bool = False, keep_negative: float = 1.0, seed: int = 0,
             files: list[str] = (), fraud_share: float = 0.0, label_fraction: float = 1.0, head: str = "transaction",
             resume: bool = False, allow_change: tuple[str, ...] = (), val_windows: int | None = None,
             session: RunSession | None = None, **head_config) -> Trainer:
    """Fine-tune the head ``head`` of :data:`~slmlab.transactions.heads.HEADS` (default the
    per-transaction fraud head) from ``encoder`` (else from scratch).

    The head's spec gives its training and validation windows (``keep_negative``, ``fraud_share``,
    ``label_fraction`` and ``seed`` select them, for the heads whose ``data_options`` name them), the
    config values those fix (``pos_weight``), its batch labels and its validation metrics, which reach
    the harness through its ``evaluator`` hook (``acc``: transaction or window PR-AUC, mean top-1 of the
    forecast, pair retrieval top-1). ``head_config``: the head's own config fields (e.g. ``fraud_loss``,
    ``focal_gamma``, ``fraud_head_inputs``, ``fraud_hidden`` for ``transaction``; ``sequence_recent_k``
    for ``sequence``); ``linear_probe`` freezes the embedding and backbone. The run is a session as
    :func:`pretrain`'s (``resume``: continue its newest checkpoint; ``session``: the caller's)."""
    spec = head_spec(head)
    cfg = finetune_run_config(bank, out_dir, encoder, preset, overrides, linear_probe, keep_negative, seed, files,
                              fraud_share, label_fraction, head, val_windows, **head_config)
    with held(session, out_dir, TRANSACTIONS, resume, allow_change) as session:
        return _finetune(bank, cfg, session, encoder, preset, linear_probe, keep_negative, seed, fraud_share,
                         label_fraction, spec, head_config, val_windows)


def finetune_run_config(bank: Bank, out_dir: str | Path, encoder: TransactionEncoder | None = None,
                        preset: str = "lfm2_tiny", overrides: list[str] = (), linear_probe: bool = False,
                        keep_negative: float = 1.0, seed: int = 0, files: list[str] = (), fraud_share: float = 0.0,
                        label_fraction: float = 1.0, head: str = "transaction", val_windows: int | None = None,
                        **head_config):
    """The run config :func:`finetune` trains with the same arguments (its ``model_config``: the run's
    identity, what ``--resume`` holds fixed)."""
    spec = head_spec(head)
    unknown = set(head_config) - set(spec.config_fields)
    if unknown:
        raise ValueError(f"{sorted(unknown)} are not config fields of the {head} head; its fields: {spec.config_fields}")
    identity = {"stage": "finetune", "head": head, "preset": preset if encoder is None else None,
                "encoder": getattr(encoder.config, "_name_or_path", "") or None if encoder is not None else None,
                "linear_probe": bool(linear_probe), "keep_negative": keep_negative, "window_seed": seed,
                "fraud_share": fraud_share, "label_fraction": label_fraction, **_sampled(val_windows), **head_config}
    return _run_config(FINETUNE_DEFAULTS, out_dir, overrides, files, bank, identity)


def _finetune(bank, cfg, session, encoder, preset, linear_probe, keep_negative, seed, fraud_share, label_fraction, spec,
              head_config, val_windows=None) -> Trainer:
    session.check_resume(cfg)
    torch.manual_seed(cfg.seed)
    T = encoder.config.max_transactions if encoder is not None else TxnEncoderConfig.from_preset(preset).max_transactions
    options = WindowOptions(keep_negative, fraud_share, label_fraction, seed)
    windows, fixed = spec.windows(bank, T, options, head_config)
    unbalanced = windows.pop("probe", None)
    windows["validation"] = sample_windows(windows["validation"], val_windows, cfg.seed, MIN_VAL_FRAUDS)
    val_frauds = fraud_positions(windows["validation"])
    config = {**head_config, **fixed, "freeze_backbone": linear_probe}
    if encoder is None:
        model = spec.model_class(spec.config_class.from_preset(preset, schema=bank.fitted, **config))
    else:
        model = spec.model_class.from_encoder(encoder, **config)
    if spec.initialise is not None and session.checkpoint is None:  # a resumed run reads its weights from the checkpoint
        started = spec.initialise(model, bank, options)
        if started:
            Path(cfg.out_dir, "initialised.json").write_text(dumps_finite(started, indent=1))
    source = TransactionWindows(windows, partial(spec.labels, config=model.config))
    bs = cfg.eval_batch_size or cfg.batch_size
    # with a validation sample, each evaluation also scores as many training windows, drawn before any
    # rebalancing (the base rate of the training period, as validation's): the train-vs-validation gap of the
    # metrics.jsonl lines then compares like with like
    probe = sample_windows(unbalanced if unbalanced is not None else windows["train"], val_windows,
                           cfg.seed) if val_windows else None

    def evaluator(m, split):
        out = {**spec.evaluate(m, windows[split], bs), "val_frauds": val_frauds}
        if probe is not None:
            out.update({f"train_{k}": v for k, v in spec.evaluate(m, probe, bs).items() if k != "acc"})
        return out

    trainer = Trainer(cfg, model, source, evaluator=evaluator)
    session.start(trainer)
    model.config.fitted_schema.save(Path(cfg.out_dir))  # as pretraining: the run folder says how to tokenise a bank
    trainer.train()
    return trainer


ENCODER_KEY_FILE = "encoder.key"


def _same_encoder(out_dir: str | Path, encoder: TransactionEncoder) -> bool:
    """Whether the label-fraction runs in ``out_dir`` started from ``encoder``'s weights (their hash,
    :func:`.evaluation.cache.weights_key`, kept in ``out_dir/encoder.key``; written now for the runs to come)."""
    key, path = weights_key(encoder), Path(out_dir, ENCODER_KEY_FILE)
    same = path.is_file() and path.read_text().strip() == key
    Path(out_dir).mkdir(parents=True, exist_ok=True)
    path.write_text(key + "\n")
    return same


def _same_run(folder: Path, cfg) -> bool:
    """Whether the run folder ``folder`` holds a checkpoint of the run ``cfg`` describes, every field equal
    (so resuming it, or loading it when finished, gives what a fresh run would)."""
    checkpoints = list_checkpoints(folder / "checkpoints")
    if not checkpoints:
        return False
    try:
        changes = compare_for_resume(saved_run_config(checkpoints[-1]), cfg.to_dict())
    except ValueError:  # a protected field differs
        return False
    return all(line.startswith("out_dir:") for line in changes)  # the same folder, spelled another way


def finetune_label_fraction_arms(bank: Bank, out_dir: str | Path, encoder: TransactionEncoder,
                                 label_fraction: float, overrides: list[str] = (), keep_negative: float = 1.0,
                                 seeds=(0, 1, 2), files: list[str] = (),
                                 val_windows: int | None = None) -> tuple[dict[str, TransactionFraudModel], dict]:
    """Does pretraining pay with few labels? For each seed ``k``, fine-tune twice with one recipe, budget
    and label subset (drawn with seed ``k``, as the window order and the run's ``seed``): from ``encoder``
    (``lf_pretrained_s<k>``, in ``out_dir/pretrained-s<k>``) and from a freshly initialised encoder of the
    same architecture and schema (``lf_scratch_s<k>``, in ``out_dir/scratch-s<k>``). Returns the trained
    models and the arms, ``{"lf_pretrained": [names], "lf_scratch": [names]}``, for the report's seeded
    criterion 4 (``val_windows``: validation on a seeded sample, as :func:`finetune`'s).

    A run folder already in ``out_dir`` made by the same call (every run setting equal, from the same
    encoder weights) is kept: loaded when finished, continued from its newest checkpoint when not; any
    other is replaced. A rerun of a killed evaluation so trains only what was left."""
    label_customers([], label_fraction)  # validate before minutes of training
    same_encoder = _same_encoder(out_dir, encoder)
    out, arms = {}, {"lf_pretrained": [], "lf_scratch": []}
    for k in seeds:
        torch.manual_seed(k)
        scratch = TransactionEncoder(TxnEncoderConfig(**encoder.config.encoder_dict()))
        for name, enc in (("pretrained", encoder), ("scratch", scratch)):
            folder = Path(out_dir, f"{name}-s{k}")
            kw = dict(overrides=[*overrides, f"seed={k}"], keep_negative=keep_negative, seed=k, files=files,
                      label_fraction=label_fraction, val_windows=val_windows)
            resume = same_encoder and _same_run(folder, finetune_run_config(bank, folder, enc, **kw))
            if folder.exists() and not resume:  # another command's run, or one killed before its first checkpoint
                shutil.rmtree(folder)
            trainer = finetune(bank, folder, enc, resume=resume, **kw)
            if exit_status(trainer.state.stop_reason):  # Ctrl-C or SIGTERM ends every arm, not only this one
                raise interruption(trainer.state.stop_reason)
            out[f"lf_{name}_s{k}"] = trainer.model
            arms[f"lf_{name}"].append(f"lf_{name}_s{k}")
    return out, arms
