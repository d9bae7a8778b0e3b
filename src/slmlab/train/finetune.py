"""Instruction fine-tuning: a saved model, chat data, full or LoRA training on the one trainer.

``slmlab finetune RUN --data chat.jsonl`` is ``slmlab train`` with three differences, and everything
else (the :class:`~slmlab.train.trainer.Trainer` loop, checkpoints, exact ``--resume``, the run lock,
metrics, the report and its plot) is the same code:

* the model is the saved model at ``RUN`` (its newest checkpoint), with its tokenizer; the tokenizer
  gets the default chat template when it has none (:mod:`slmlab.data.chat`) and every checkpoint
  saves it;
* the data is a :class:`~slmlab.data.chat_source.ChatSource`: one conversation per row, loss only on
  the assistant's tokens, every tenth conversation held out; ``block_size`` defaults to the context
  the base model was trained on;
* with a :class:`~slmlab.train.lora.LoraSpec` only LoRA adapters train (:class:`LoraTrainer`): each
  checkpoint is then an adapter folder in peft's format (plus ``config.json``, the tokenizer and the
  trainer state), which every reader of saved models loads merged into its base
  (:func:`slmlab.train.saved.load_for_inference`).

Each checkpoint records ``finetune.json`` (the base folder and the LoRA spec); ``--resume`` refuses
another base or LoRA spec, like the protected fields of ``run.yaml``.
"""

from __future__ import annotations

import json
from pathlib import Path

import torch

from ..outputs import dumps_finite
from .checkpoint import check_checkpoint, load_trainer_files
from .config import RunConfig
from .distributed import barrier
from .lora import LoraSpec, is_adapter_folder, load_adapter_weights, save_adapter, trainable_share
from .saved import check_trainable, open_checkpoint, read_json_object, trained_context
from .session import FINETUNE, RunSession, held
from .trainer import Trainer

FINETUNE_FILE = "finetune.json"
# What a fine-tune changes from slmlab train's defaults (any of them can be overridden with key=value).
FINETUNE_DEFAULTS = {"max_steps": 300, "batch_size": 16, "eval_every": 100, "eval_batches": 0, "checkpoint_every": 100,
                     "sample_tokens": 0, "optim": {"weight_decay": 0.0}, "schedule": {"warmup": 0.1}}
FULL_LR, LORA_LR = 3e-4, 2e-3


class AdapterView:
    """What a LoRA checkpoint saves as "the model": the adapter (peft's format) and the base's config.

    :func:`slmlab.train.checkpoint.save_checkpoint` checks its parameters are finite and calls
    ``save_pretrained``; only the adapter's (trainable) parameters are in it.
    """

    def __init__(self, peft_model) -> None:
        self.peft_model = peft_model

    def named_parameters(self):
        return [(n, p) for n, p in self.peft_model.named_parameters() if p.requires_grad]

    def named_buffers(self):
        return []

    def save_pretrained(self, folder: str) -> None:
        save_adapter(self.peft_model, folder)


class LoraTrainer(Trainer):
    """The :class:`~slmlab.train.trainer.Trainer` on a model carrying LoRA adapters: it trains the model
    (whose only trainable parameters are the adapters), saves each checkpoint as an adapter folder and
    resumes from one.

    Args:
        peft_model: the ``PeftModel`` (:func:`slmlab.train.lora.add_lora`); the trainer runs its base model,
            whose target layers are LoRA layers.
        *args / **kwargs: as :class:`~slmlab.train.trainer.Trainer` after ``cfg``.
    """

    def __init__(self, cfg: RunConfig, peft_model, *args, **kwargs) -> None:
        super().__init__(cfg, peft_model.get_base_model(), *args, **kwargs)
        self.peft_model = peft_model

    def checkpoint_model(self):
        return AdapterView(self.peft_model)

    def load_checkpoint(self, ckpt: Path) -> dict:
        from .checkpoint import CheckpointError

        check_checkpoint(ckpt)
        if not is_adapter_folder(ckpt):
            raise CheckpointError(f"{ckpt} holds a full model, not a LoRA adapter; this run trains an adapter: resume"
                                  " without --lora, or start a new out_dir")
        load_adapter_weights(self.peft_model, ckpt)
        return load_trainer_files(ckpt, self.optimizer)


def base_checkpoint(model: str) -> Path:
    """The checkpoint folder a fine-tune starts from (``RUN``: a run folder's newest checkpoint); a
    folder that is not an slmlab language model (a transactions run, foreign code) or a quantized one is
    refused (:func:`slmlab.train.saved.open_checkpoint`, :func:`slmlab.train.saved.check_trainable`)."""
    if not Path(model).is_dir():
        raise FileNotFoundError(f"no saved model at {model}; slmlab finetune starts from a run or checkpoint folder"
                                " (train one with slmlab train)")
    ckpt = open_checkpoint(model).checkpoint.resolve()  # checked as every reader checks it (an slmlab family)
    check_trainable(ckpt)
    return ckpt


def finetune_record(base: Path, lora: LoraSpec | None) -> dict:
    """``finetune.json``: the base checkpoint and the LoRA spec (None: full fine-tuning)."""
    return {"base": str(base), "lora": None if lora is None else lora.to_dict()}


def check_finetune_resume(ckpt: Path, wanted: dict) -> None:
    """Refuse resuming ``ckpt`` with another base model or LoRA spec than it was trained with."""
    saved = read_json_object(ckpt / FINETUNE_FILE)
    if not saved:
        raise ValueError(f"{ckpt} has no {FINETUNE_FILE}: it is not a fine-tune's checkpoint; resume it with slmlab train")
    for key in ("base", "lora"):
        if saved.get(key) != wanted[key]:
            raise ValueError(f"resuming would change the fine-tune's {key}: {saved.get(key)!r} -> {wanted[key]!r}; give"
                             " the same model and --lora, or start a new out_dir")


def build_finetune_trainer(cfg: RunConfig, lora: LoraSpec | None = None, given: frozenset[str] = frozenset(),
                           session: RunSession | None = None) -> Trainer:
    """Everything ``slmlab finetune`` builds, ready to ``train()`` (see the module docstring), started as
    ``session`` decided. Prints whether the run resumes or starts fresh.

    Args:
        cfg: the run config: ``model`` is the saved model to fine-tune, ``data`` a chat spec
            (:func:`slmlab.data.chat_data.load_chat`).
        lora: train LoRA adapters with this spec; None = full fine-tuning.
        given: the config keys the user set (``block_size`` defaults to the base's trained context).
        session: as :func:`slmlab.train.run.build_trainer`'s.
    """
    from ..data import get_tokenizer
    from ..data.chat import ensure_chat_template
    from ..data.chat_data import chat_identity
    from ..data.chat_source import ChatSource
    from .lora import add_lora
    from .resume_check import DATA_IDENTITY_FILE
    from .run import (
        build_model,
        check_tokenizer_request,
        needed_vocab,
        open_devices,
        prepare_for_training,
        record_tokenizer,
    )

    with held(session, cfg.out_dir, FINETUNE) as session:
        base = base_checkpoint(cfg.model)
        if "block_size" not in given:
            cfg.block_size = trained_context(base) or cfg.block_size
        if cfg.keep_best and lora is not None:
            raise ValueError("keep_best: a LoRA fine-tune's checkpoints are adapters; drop keep_best (every checkpoint is"
                             " kept by keep_checkpoints)")
        if cfg.sample_tokens and lora is not None:
            raise ValueError("sample_tokens: a LoRA fine-tune's report has no sample; talk to it with slmlab chat OUT_DIR")
        device, dist_info = open_devices(cfg)
        ckpt = session.checkpoint
        record = finetune_record(base, lora)
        identity = chat_identity(cfg.data) if Path(cfg.data).is_file() or cfg.data.startswith("builtin:") else None
        check_tokenizer_request(cfg, base, given)
        if ckpt is not None:
            check_finetune_resume(ckpt, record)
        session.check_resume(cfg, identity)
        origin = ckpt if ckpt is not None else base
        if not (origin / "tokenizer.json").is_file():
            raise FileNotFoundError(f"{origin} has no tokenizer.json; a fine-tune renders its chat data with the model's"
                                    " own tokenizer: save it beside the model")
        tokenizer = get_tokenizer(str(origin))
        ensure_chat_template(tokenizer)
        source = ChatSource.from_spec(cfg.data, tokenizer, cfg.block_size)
        model = build_model(cfg, needed_vocab(source, tokenizer), source.seq_len)
        max_pos = getattr(model.config, "max_position_embeddings", None)
        if max_pos is not None and max_pos < source.seq_len:
            raise ValueError(f"block_size={source.seq_len} is longer than the model's {max_pos} positions; lower"
                             " block_size")
        record_tokenizer(model, tokenizer, source.seq_len)
        prepare_for_training(model, source.seq_len)
        if lora is None:
            trainer = Trainer(cfg, model, source, tokenizer, session.run_dir, dist_info, device)
        else:
            torch.manual_seed(cfg.seed)  # the adapters' initial A (and LoRA dropout after it) come from the seed
            trainer = LoraTrainer(cfg, add_lora(model, lora, base), source, tokenizer, session.run_dir, dist_info,
                                  device)
        trainer.checkpoint_json[FINETUNE_FILE] = record
        if identity is not None:
            trainer.checkpoint_json[DATA_IDENTITY_FILE] = identity
        session.start(trainer, f"starting fresh from {base}")
        barrier(dist_info)
        if session.main:
            for note in source.notes:
                print(f"slmlab finetune: {note}")
        return trainer


def finetune_run(run: str, files: list[str], overrides: list[str], lora: str | None = None,
                 resume: str | bool = False, allow_change: tuple[str, ...] = (), merge: bool = False) -> int:
    """The whole of ``slmlab finetune RUN --data ...`` after its arguments: the config (``FINETUNE_DEFAULTS``
    under ``files`` and ``overrides``; ``out_dir`` defaults to ``RUN-full`` / ``RUN-lora``), one
    :class:`~slmlab.train.session.RunSession`, the trainer, the run, its report with the fine-tune's
    section and, with ``merge``, ``OUT/merged``; returns the exit status
    (:func:`slmlab.train.run.train_and_report`).

    Args:
        run: the run, checkpoint or saved model folder to fine-tune.
        lora: the ``--lora`` spec text (:func:`slmlab.train.lora.parse_lora_spec`); None = full fine-tuning.
        resume / allow_change: as :class:`~slmlab.train.session.RunSession`'s.
    """
    from .config import load_config
    from .lora import parse_lora_spec, require_peft
    from .run import format_report, given_keys, train_and_report

    spec = None
    if lora is not None:
        spec = parse_lora_spec(lora)
        require_peft()
    given = given_keys(files, overrides)
    defaults = {**FINETUNE_DEFAULTS, "optim": {**FINETUNE_DEFAULTS["optim"], "lr": LORA_LR if spec else FULL_LR},
                "out_dir": f"{str(run).rstrip('/')}-{'lora' if spec else 'full'}", "tokenizer": str(Path(run))}
    cfg = load_config(files, overrides, base=defaults)
    with RunSession(cfg.out_dir, FINETUNE, resume, allow_change) as session:
        trainer = build_finetune_trainer(cfg, spec, given, session)
        summary = finetune_summary(trainer, spec)
        how = "full fine-tune" if spec is None else f"LoRA r={spec.r} alpha={spec.alpha:g}"
        header = (f"slmlab finetune: {cfg.model} ({how}: {summary['trainable_parameters']:,} of"
                  f" {summary['total_parameters']:,} parameters trainable, {100 * summary['trainable_share']:.2f}%)"
                  f" on {cfg.data} ({summary['conversations']['train']:,} conversations), {cfg.max_steps} steps x"
                  f" {cfg.batch_size * cfg.grad_accum * trainer.dist.world_size} conversations -> {cfg.out_dir}")

        def show(report: dict) -> None:
            add_to_report(trainer.run_dir, summary)
            print(format_report(report).rstrip())
            print(f"- trainable parameters: {summary['trainable_parameters']:,} of {summary['total_parameters']:,}"
                  f" ({100 * summary['trainable_share']:.2f}%); validation loss = held-out assistant-token loss")

        status = train_and_report(session, trainer, header, show)
        if merge and status == 0 and session.main:
            merged = write_merged(trainer.last_checkpoint(), Path(cfg.out_dir) / "merged", replace_own=True)
            print(f"slmlab finetune: wrote the merged model to {merged}")
        return status


def finetune_summary(trainer: Trainer, lora: LoraSpec | None) -> dict:
    """What a fine-tune adds to its report: the method, trainable and total parameters, the data's
    conversations and scored (assistant) tokens per split."""
    trainable, total = trainable_share(trainer.model)
    source = trainer.source
    return {
        "method": "full" if lora is None else "lora",
        "lora": None if lora is None else lora.to_dict(),
        "trainable_parameters": trainable,
        "total_parameters": total,
        "trainable_share": trainable / max(total, 1),
        "conversations": {split: len(rows) for split, rows in source.rows.items()},
        "scored_tokens": {split: source.scored_tokens(split) for split in source.rows},
    }


def add_to_report(run_dir: Path, summary: dict) -> None:
    """Add the fine-tune's summary to ``report.json`` and a section to ``report.md``."""
    run_dir = Path(run_dir)
    report_json = run_dir / "report.json"
    report = json.loads(report_json.read_text())
    report["finetune"] = summary
    report_json.write_text(dumps_finite(report, indent=2))
    lines = ["", "## Fine-tune", "",
             f"- method: {summary['method']}" + (f" ({', '.join(f'{k}={v}' for k, v in summary['lora'].items())})"
                                                 if summary["lora"] else ""),
             f"- trainable parameters: {summary['trainable_parameters']:,} of {summary['total_parameters']:,}"
             f" ({100 * summary['trainable_share']:.2f}%)",
             f"- conversations: {summary['conversations']['train']:,} train, {summary['conversations']['validation']:,}"
             f" held out ({summary['scored_tokens']['validation']:,} scored assistant tokens); the validation loss is the"
             " held-out assistant-token loss"]
    with (run_dir / "report.md").open("a", encoding="utf-8") as stream:
        stream.write("\n".join(lines) + "\n")


def is_merged_output(folder: Path) -> bool:
    """Whether ``folder`` is what :func:`write_merged` writes (its ``finetune.json`` names ``merged_from``):
    a fine-tune's own ``OUT/merged``, which the next ``--merge`` of that run replaces."""
    return "merged_from" in read_json_object(Path(folder) / FINETUNE_FILE)


def write_merged(source: str | Path, out: str | Path, replace_own: bool = False) -> Path:
    """A plain checkpoint at ``out`` from a fine-tune (an adapter folder is merged into its base):
    ``config.json``, ``model.safetensors``, generation config and the tokenizer with its chat template.

    ``out`` keeps the promise of :mod:`slmlab.outputs`: refused when it is not empty (with
    ``replace_own``, unless it is an earlier merge, :func:`is_merged_output`: a fine-tune's own
    ``OUT/merged``), written through a temporary sibling; a source that changes while it is read is
    refused.

    Raises:
        ValueError: the above, or a quantized source (nothing to merge; its weights are not float).
    """
    from ..outputs import check_output_folder, check_unchanged, snapshot, staged_folder
    from .checkpoint import quiet_hf_progress
    from .saved import load_for_inference, open_checkpoint

    own = is_merged_output if replace_own else None
    check_output_folder(out, "--out", own)  # refused before any weight is read
    saved = open_checkpoint(source)
    check_trainable(saved.checkpoint)  # a quantized folder has no float weights to write
    before = snapshot(saved.checkpoint)
    loaded = load_for_inference(saved, "cpu")
    with staged_folder(out, "--out", own) as tmp:
        with quiet_hf_progress():
            loaded.model.save_pretrained(str(tmp))
        if loaded.tokenizer is not None:
            loaded.tokenizer.save_pretrained(str(tmp))
        record = read_json_object(loaded.checkpoint / FINETUNE_FILE)
        (tmp / FINETUNE_FILE).write_text(json.dumps({**record, "merged_from": str(loaded.checkpoint.resolve())},
                                                    indent=1) + "\n")
        check_unchanged(saved.checkpoint, before)
    return Path(out)


def evaluate_chat(path: str | Path, data: str, block_size: int | None = None, device: str = "auto",
                  batch_size: int = 16) -> dict:
    """The held-out assistant-token figures of a saved model (a base model, a fine-tune, an adapter
    folder) on chat data: the validation split of :class:`~slmlab.data.chat_source.ChatSource`, scored
    on the assistant's tokens only, as a fine-tune's own validation (``slmlab finetune --eval-only``).

    Returns:
        :func:`slmlab.evaluate.lm.evaluate_source`'s ``loss`` (nats per assistant token), ``ppl``,
        ``tokens``, ``acc``, ..., plus the ``checkpoint`` read.
    """
    from ..data.chat import ensure_chat_template
    from ..data.chat_source import ChatSource
    from ..evaluate.lm import evaluate_source, family_forward_inputs
    from .saved import load_for_inference

    loaded = load_for_inference(path, device)
    if loaded.tokenizer is None:
        raise ValueError(f"{loaded.checkpoint} has no tokenizer; chat data is rendered with the model's own tokenizer")
    ensure_chat_template(loaded.tokenizer)
    source = ChatSource.from_spec(data, loaded.tokenizer, loaded.context(block_size, "block_size"))
    result = evaluate_source(loaded.model, source, "validation", batch_size, None, family_forward_inputs(loaded.model),
                             loaded.device, None)
    return {**result, "checkpoint": str(loaded.checkpoint)}
