"""What every export shares: what a run says about its checkpoint, and the rules for the output.

Torch and transformers are imported inside the functions that need them.
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

SPECIAL_IDS = ("bos_token_id", "eos_token_id", "pad_token_id")


@dataclass
class ExportSource:
    """A loaded checkpoint and what its run recorded about it.

    Attributes:
        checkpoint: the checkpoint folder (a run folder resolves to its newest checkpoint).
        run_dir: the run folder holding ``checkpoints/`` (None for a bare saved model).
        family: the slmlab family name (what the registry knows it by).
        model: the model in eval mode, float32, on the CPU.
        tokenizer: the tokenizer saved with the checkpoint (None if it has none).
        run_config: the checkpoint's ``run.yaml`` (empty if none).
        special_ids: ``{"bos_token_id": .., "eos_token_id": .., "pad_token_id": ..}`` (None = unset).
        trained_context: the sequence length the model was trained on (None if not recorded;
            :func:`slmlab.train.saved.trained_context`).
        evaluation: the run report's final validation figures, when they belong to this checkpoint.
        step / tokens_seen: training progress of this checkpoint (None if unknown).
    """

    checkpoint: Path
    run_dir: Path | None
    family: str
    model: object
    tokenizer: object
    run_config: dict = field(default_factory=dict)
    special_ids: dict = field(default_factory=dict)
    trained_context: int | None = None
    evaluation: dict | None = None
    step: int | None = None
    tokens_seen: int | None = None


def special_ids(model, tokenizer, run_config: dict) -> dict:
    """bos/eos/pad ids: those the checkpoint's config recorded (``slmlab train`` writes them), else
    the tokenizer's (checkpoints saved before they were recorded); never for a synthetic task, whose
    ids are its own, and never an id outside the vocabulary."""
    from ..train.saved import is_synthetic_run

    recorded = {name: getattr(model.config, name, None) for name in SPECIAL_IDS}
    if any(v is not None for v in recorded.values()):
        ids = recorded
    elif tokenizer is None or is_synthetic_run(run_config):
        ids = dict.fromkeys(SPECIAL_IDS)
    else:
        ids = {name: getattr(tokenizer, name, None) for name in SPECIAL_IDS}
    vocab = int(model.config.vocab_size)
    return {k: (int(v) if isinstance(v, int) and 0 <= v < vocab else None) for k, v in ids.items()}


def load_source(source) -> ExportSource:
    """Load a run, checkpoint or saved slmlab model (a path, or a
    :class:`slmlab.train.saved.SavedCheckpoint` already opened) for export: resolved and checked once,
    on the CPU, float32, finite weights checked, no code shipped in the folder run
    (:func:`slmlab.train.saved.load_for_inference`). The run report's validation figures are kept
    only when the report names this very checkpoint."""
    from ..models.quantize import quantized_modules
    from ..train.saved import load_for_inference, read_json_object

    loaded = load_for_inference(source, "cpu")
    ckpt, model, tokenizer, run_config = loaded.checkpoint, loaded.model, loaded.tokenizer, loaded.run_config
    if quantized_modules(model):
        raise ValueError(f"{ckpt} is a quantized copy (`slmlab quantize`); export the float run it came from"
                         " (llama.cpp quantizes a GGUF itself: --to gguf --dtype q8_0 or q4_0)")
    run_dir = ckpt.parent.parent if ckpt.parent.name == "checkpoints" else None
    state = read_json_object(ckpt / "trainer" / "state.json")
    evaluation = None
    if run_dir is not None:
        report = read_json_object(run_dir / "report.json")
        named = report.get("checkpoint")
        if named and Path(named).name == ckpt.name and isinstance(report.get("final_eval"), dict):
            evaluation = report["final_eval"]
    return ExportSource(
        checkpoint=ckpt, run_dir=run_dir, family=loaded.family.name, model=model, tokenizer=tokenizer,
        run_config=run_config, special_ids=special_ids(model, tokenizer, run_config),
        trained_context=loaded.trained_context, evaluation=evaluation, step=state.get("step"),
        tokens_seen=state.get("tokens_seen"),
    )


def check_output_folder(out: Path, *, force: bool, source: Path | None = None) -> None:
    """Refuse an output that is a file, an existing non-empty folder (unless ``force``), or, even
    with ``force``, a folder that holds the source itself (replacing it would delete the model)."""
    out = Path(out)
    if out.is_symlink():  # replacing it would replace the link (or, with --force, delete where it points)
        raise ValueError(f"output {out} is a symbolic link (to {os.readlink(out)}); name the folder itself or a new one")
    if out.exists() and not out.is_dir():
        raise ValueError(f"output {out} is a file; choose a folder for the export")
    if out.is_dir() and any(out.iterdir()):
        if not force:
            raise ValueError(f"output folder {out} exists and is not empty; choose another folder, or pass --force to"
                             " replace its contents")
        if source is not None:
            src, dst = Path(source).resolve(), out.resolve()
            if src == dst or dst in src.parents:
                raise ValueError(f"output folder {out} holds the model being exported ({source}); --force would delete"
                                 " it: choose another folder")


@contextlib.contextmanager
def output_folder(out: Path, *, force: bool, source: Path | None = None) -> Iterator[Path]:
    """A temporary folder beside ``out`` to write the export into; when the block ends without an
    error it replaces ``out`` (an interrupted export leaves ``out`` as it was and no temporary). The
    house's one output-folder contract (:func:`slmlab.outputs.staged_folder`), with ``--force`` as what
    lets an earlier folder be replaced."""
    from ..outputs import staged_folder

    check_output_folder(out, force=force, source=source)
    with staged_folder(out, "output", own=lambda _: force) as tmp:
        yield tmp
