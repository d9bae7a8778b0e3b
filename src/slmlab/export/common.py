"""What every export shares: what a run says about its checkpoint, and the rules for the output.

Torch and transformers are imported inside the functions that need them.
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

SPECIAL_IDS = ("bos_token_id", "eos_token_id", "pad_token_id")
# transformers' "no limit" model_max_length (int(1e30)); anything this large was never a trained context
_UNSET_LENGTH = 10**9


@dataclass
class ExportSource:
    """A loaded checkpoint and what its run recorded about it.

    Attributes:
        checkpoint: the checkpoint folder (a run folder resolves to its newest checkpoint).
        run_dir: the run folder holding ``checkpoints/`` (None for a bare saved model).
        family: the slmlab family name (``lumen``, ``lfm2``, ...).
        model: the model in eval mode, float32, on the CPU.
        tokenizer: the tokenizer saved with the checkpoint (None if it has none).
        run_config: the checkpoint's ``run.yaml`` (empty if none).
        special_ids: ``{"bos_token_id": .., "eos_token_id": .., "pad_token_id": ..}`` (None = unset).
        trained_context: the sequence length the model was trained on (None if not recorded).
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


def _read_json(path: Path) -> dict:
    try:
        data = json.loads(path.read_text())
    except (OSError, json.JSONDecodeError, UnicodeDecodeError):
        return {}
    return data if isinstance(data, dict) else {}


def _is_synthetic(run_config: dict) -> bool:
    from ..data import parse_task_spec

    data = run_config.get("data")
    return isinstance(data, str) and parse_task_spec(data) is not None


def special_ids(model, tokenizer, run_config: dict) -> dict:
    """bos/eos/pad ids: those the checkpoint's config recorded (``slmlab train`` writes them), else
    the tokenizer's (checkpoints saved before they were recorded); never for a synthetic task, whose
    ids are its own, and never an id outside the vocabulary."""
    recorded = {name: getattr(model.config, name, None) for name in SPECIAL_IDS}
    if any(v is not None for v in recorded.values()):
        ids = recorded
    elif tokenizer is None or _is_synthetic(run_config):
        ids = dict.fromkeys(SPECIAL_IDS)
    else:
        ids = {name: getattr(tokenizer, name, None) for name in SPECIAL_IDS}
    vocab = int(model.config.vocab_size)
    return {k: (int(v) if isinstance(v, int) and 0 <= v < vocab else None) for k, v in ids.items()}


def trained_context(tokenizer, run_config: dict) -> int | None:
    """The trained sequence length: the tokenizer's ``model_max_length`` (``slmlab train`` sets it),
    else a text run's ``block_size`` from ``run.yaml``; None when neither says."""
    length = getattr(tokenizer, "model_max_length", None) if tokenizer is not None else None
    if isinstance(length, int) and 0 < length < _UNSET_LENGTH:
        return length
    block = run_config.get("block_size")
    if isinstance(block, int) and block > 0 and run_config.get("data") and not _is_synthetic(run_config):
        return block
    return None


def load_source(source: str | Path) -> ExportSource:
    """Load a run, checkpoint or saved slmlab model for export (CPU, float32, finite weights checked;
    no code shipped in the folder runs). The run report's validation figures are kept only when the
    report names this very checkpoint."""
    from ..commands._common import load_for_inference
    from ..models.registry import check_saved_model_type
    from ..train.checkpoint import resolve_checkpoint
    from ..train.run import saved_run_config

    ckpt = resolve_checkpoint(source)
    family = check_saved_model_type(ckpt).name
    ckpt, model, tokenizer, _ = load_for_inference(ckpt, "cpu")
    run_config = saved_run_config(ckpt)
    run_dir = ckpt.parent.parent if ckpt.parent.name == "checkpoints" else None
    state = _read_json(ckpt / "trainer" / "state.json")
    evaluation = None
    if run_dir is not None:
        report = _read_json(run_dir / "report.json")
        named = report.get("checkpoint")
        if named and Path(named).name == ckpt.name and isinstance(report.get("final_eval"), dict):
            evaluation = report["final_eval"]
    return ExportSource(
        checkpoint=ckpt, run_dir=run_dir, family=family, model=model, tokenizer=tokenizer, run_config=run_config,
        special_ids=special_ids(model, tokenizer, run_config), trained_context=trained_context(tokenizer, run_config),
        evaluation=evaluation, step=state.get("step"), tokens_seen=state.get("tokens_seen"),
    )


def check_output_folder(out: Path, *, force: bool, source: Path | None = None) -> None:
    """Refuse an output that is a file, an existing non-empty folder (unless ``force``), or, even
    with ``force``, a folder that holds the source itself (replacing it would delete the model)."""
    out = Path(out)
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
    error it replaces ``out`` (an interrupted export leaves ``out`` as it was and no temporary)."""
    out = Path(out)
    check_output_folder(out, force=force, source=source)
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = out.parent / f".tmp-{out.name}-{os.getpid()}"
    if tmp.exists():
        shutil.rmtree(tmp)
    tmp.mkdir()
    try:
        yield tmp
        if out.exists():
            shutil.rmtree(out)
        os.replace(tmp, out)
    finally:
        if tmp.exists():
            shutil.rmtree(tmp, ignore_errors=True)
