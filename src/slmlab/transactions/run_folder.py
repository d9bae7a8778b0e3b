"""What ``slmlab train`` guarantees of its run folder, for ``slmlab transactions``; the checks of output
paths and of the kind of checkpoint a subcommand is given, all made before any work starts.

A training run (``pretrain``, ``finetune``) is a :class:`slmlab.train.session.RunSession` of the kind
:data:`TRANSACTIONS`: ``--out`` checked, ``out/.lock`` held for its whole length, a fresh run refusing a
non-empty folder, ``--resume`` refusing a change of what the run computes (the checkpoint's ``run.yaml``:
the seed, the bank's content in ``data``, the model and head settings in ``model_config``), saying which
step it resumes from and dropping the ``metrics.jsonl`` records past it; SIGTERM saves a checkpoint.
"""

from __future__ import annotations

import hashlib
import json
import os
import struct
from pathlib import Path

from ..train.checkpoint import resolve_checkpoint
from ..train.session import RunKind

# -- output paths ------------------------------------------------------------------------------------------


def _creatable(path: Path, what: str, option: str) -> None:
    """``path`` (missing) can be created: its nearest existing ancestor is a writable folder."""
    for parent in path.parents:
        if parent.exists():
            if not parent.is_dir():
                raise ValueError(f"{option} {path} cannot be created: {parent} is a file; choose another {what}")
            if not os.access(parent, os.W_OK | os.X_OK):
                raise ValueError(f"{option} {path} cannot be created: {parent} is not writable; choose another {what}")
            return


def check_out_file(path: str | Path, option: str = "--out") -> Path:
    """An output file path that can be written: not a folder, its folder exists (or can be created) and
    is writable. Nothing is created."""
    path = Path(path)
    if path.is_dir():
        raise ValueError(f"{option} {path} is a folder; pass a file path (e.g. {path / 'scores.csv'})")
    if path.exists():
        if not os.access(path, os.W_OK):
            raise ValueError(f"{option} {path} is not writable; check its permissions or choose another file")
        return path
    _creatable(path, "file", option)
    return path


def check_out_dir(path: str | Path, option: str = "--out") -> Path:
    """An output folder that can be written: not a file, exists (writable) or can be created. Nothing is
    created."""
    path = Path(path)
    if path.exists():
        if not path.is_dir():
            raise ValueError(f"{option} {path} is a file; choose a folder")
        if not os.access(path, os.W_OK | os.X_OK):
            raise ValueError(f"{option} {path} is not writable; check its permissions or choose another folder")
        return path
    _creatable(path, "folder", option)
    return path


def is_non_empty(folder: str | Path, ignore: tuple[str, ...] = ()) -> bool:
    folder = Path(folder)
    return folder.is_dir() and any(p.name not in ignore for p in folder.iterdir())


# -- the run folder of a training stage ------------------------------------------------------------------
TRANSACTIONS = RunKind(
    "transactions", "run folder", "--out", fresh_needs_empty=True, announce_fresh=False, torchrun=False,
    locked="run folder {run_dir} is locked ({lock}, held by pid {pid}): another run is writing into it; wait for it to"
           " finish, stop it, or choose another --out",
    check=check_out_dir)


def bank_fingerprint(bank) -> str:
    """The ``data`` of a transactions run config: what the bank holds (rows, labels, split), hashed."""
    import pandas as pd

    h = hashlib.sha256()
    h.update(pd.util.hash_pandas_object(bank.df.drop(columns=["row"], errors="ignore"), index=False).to_numpy()
             .tobytes())
    h.update(bank.ids.tobytes())
    h.update(json.dumps({k: str(v) for k, v in sorted(bank.cuts.items())}).encode())
    h.update(json.dumps(sorted(map(str, bank.holdout))).encode())
    return f"transactions bank sha256:{h.hexdigest()[:16]} ({len(bank.df)} rows)"


# -- the kind of checkpoint ----------------------------------------------------------------------------------
_HEAD_PREFIXES = {"fraud_head.": "transaction", "sequence_head.": "sequence", "forecast_head.": "forecast",
                  "customer_head.": "customer"}


def _weight_names(ckpt: Path) -> set[str]:
    index = ckpt / "model.safetensors.index.json"
    if index.is_file():
        return set(json.loads(index.read_text()).get("weight_map", {}))
    path = ckpt / "model.safetensors"
    if not path.is_file():
        return set()
    with path.open("rb") as f:
        (n,) = struct.unpack("<Q", f.read(8))
        header = json.loads(f.read(n))
    return {k for k in header if k != "__metadata__"}


def checkpoint_kind(path: str | Path) -> tuple[str, str]:
    """``("encoder", "")``, ``("head", HEAD_NAME)`` or ``("other", model_type)`` of a run or checkpoint
    folder (its newest checkpoint), from ``config.json`` and the weight names."""
    from .heads import HEADS

    ckpt = resolve_checkpoint(path)
    try:
        model_type = str(json.loads((ckpt / "config.json").read_text()).get("model_type", ""))
    except (OSError, ValueError) as err:
        raise ValueError(f"{ckpt / 'config.json'} is unreadable ({err}); pass a transactions run folder") from None
    if not model_type.startswith("slmlab_txn"):
        return "other", model_type or "none"
    by_type = {spec.model_class.config_class.model_type: name for name, spec in HEADS.items()}
    if model_type in by_type:
        return "head", by_type[model_type]
    names = _weight_names(ckpt)
    if any(n.startswith("encoder.") for n in names):  # a fine-tuned model saved before heads had own configs
        head = next((h for p, h in _HEAD_PREFIXES.items() if any(n.startswith(p) for n in names)), "transaction")
        return "head", head
    return "encoder", ""


def require_fraud_model(path: str | Path, option: str = "--model") -> None:
    """Refuse anything but a fine-tuned transaction fraud model (a pretraining run would score with a
    randomly initialised head)."""
    kind, what = checkpoint_kind(path)
    if kind == "encoder":
        raise ValueError(
            f"{option} {path} is an encoder from `slmlab transactions pretrain`, not a fine-tuned fraud model (its"
            f" fraud head would be random); fine-tune it first: slmlab transactions finetune --encoder {path}"
            " --data BANK --out RUN, then pass RUN")
    if kind == "head" and what != "transaction":
        raise ValueError(
            f"{option} {path} is a fine-tuned {what} head, not the transaction fraud head this command scores with;"
            " pass a run of `slmlab transactions finetune --head transaction`")
    if kind == "other":
        raise ValueError(
            f"{option} {path} is not a transactions checkpoint (model_type {what!r}: a `slmlab train` model?); pass"
            " a run folder of `slmlab transactions finetune`")


def require_encoder(path: str | Path, option: str = "--encoder") -> None:
    """Refuse anything but a pretrained transaction encoder."""
    kind, what = checkpoint_kind(path)
    if kind == "head":
        raise ValueError(
            f"{option} {path} is a fine-tuned transactions model ({what} head), not a pretrained encoder; pass a run"
            " folder of `slmlab transactions pretrain` (or omit --encoder to fine-tune from scratch)")
    if kind == "other":
        raise ValueError(
            f"{option} {path} is not a transactions checkpoint (model_type {what!r}: a `slmlab train` model?); pass"
            " a run folder of `slmlab transactions pretrain` (or omit --encoder to fine-tune from scratch)")
