"""Resume means the same run: compare the requested config with the checkpoint's ``run.yaml``.

Fields that decide what the resumed steps compute (the model, the data and its order, the
tokenizer, the sequence length, the batch layout) must match, or the resumed run would silently be
a different run wearing the old one's history; a change is refused with a diff unless the user
names the field with ``--allow-change FIELD``. Every other field (``max_steps``, evaluation and
checkpoint cadence, logging, sampling) may change and each change is reported.

The data is compared by what it is, not by the text of ``data``: every checkpoint records the
identity of its data (``data_identity.json``: :func:`slmlab.data.sources.data_identity`, a local
folder's resolved path and content fingerprint, a named corpus's or task's spec), so another
spelling of the same folder resumes and the same words naming another folder, or edited files, are
refused. A checkpoint without that file (written before it existed) is compared by the text.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

DATA_IDENTITY_FILE = "data_identity.json"

PROTECTED = ("model", "model_config", "data", "data_errors", "seed", "tokenizer", "vocab_size", "block_size",
             "batch_size", "grad_accum")


def _flatten(tree: dict, prefix: str = "") -> dict[str, Any]:
    out: dict[str, Any] = {}
    for key, value in tree.items():
        if isinstance(value, dict) and key != "model_config":
            out.update(_flatten(value, f"{prefix}{key}."))
        else:
            out[f"{prefix}{key}"] = list(value) if isinstance(value, tuple) else value
    return out


def read_data_identity(ckpt: Path) -> dict | None:
    """The data identity a checkpoint recorded (None when it has none: an older checkpoint)."""
    path = Path(ckpt) / DATA_IDENTITY_FILE
    if not path.is_file():
        return None
    try:
        identity = json.loads(path.read_text())
    except (OSError, ValueError) as exc:
        raise ValueError(f"{path} is unreadable ({exc}); delete it to compare the data by its --data text") from None
    if not isinstance(identity, dict) or "kind" not in identity:
        raise ValueError(f"{path} is not a data identity; delete it to compare the data by its --data text")
    return identity


def describe_data(identity: dict) -> str:
    """``identity`` in words: ``folder /abs/data (content 0123abcd...)`` or ``corpus shakespeare``."""
    if identity.get("kind") == "local":
        return f"{identity.get('path')} (content {identity.get('fingerprint')})"
    return f"{identity.get('kind')} {identity.get('spec')}"


def compare_for_resume(saved: dict, requested: dict, allow: tuple[str, ...] = (), saved_data: dict | None = None,
                       requested_data: dict | None = None) -> list[str]:
    """Check ``requested`` (``RunConfig.to_dict()``) against the checkpoint's ``saved`` run config.

    Args:
        saved: the checkpoint's ``run.yaml``.
        requested: the config of the run being started.
        allow: protected fields the user explicitly allows to change.
        saved_data / requested_data: the checkpoint's recorded data identity and the requested
            data's (:func:`slmlab.data.sources.data_identity`); when both are given, ``data`` is
            compared by them instead of by its text. None (an older checkpoint) = by the text.
    Returns:
        the allowed changes, one ``"field: old -> new"`` line each (for the log).
    Raises:
        ValueError: a protected field differs and is not in ``allow`` (the message is the diff).
    """
    unknown = sorted(set(allow) - set(PROTECTED))
    if unknown:
        raise ValueError(f"--allow-change {unknown}: not a resume-protected field; protected: {list(PROTECTED)}")
    old, new = _flatten(saved), _flatten(requested)
    changes, refused = [], []
    by_identity = saved_data is not None and requested_data is not None
    hints = []
    for key in sorted(set(old) | set(new)):
        if key == "data" and by_identity and key in new:
            if saved_data == requested_data:
                if old.get(key) != new.get(key):  # another spelling of the same data
                    changes.append(f"data: {old.get(key)!r} -> {new.get(key)!r} (the same data: {describe_data(saved_data)})")
                continue
            line = f"data: {old.get(key)!r} = {describe_data(saved_data)} -> {new.get(key)!r} = {describe_data(requested_data)}"
            (changes if "data" in allow else refused).append(line)
            if "data" not in allow:
                hints.append(f"this run trained on {describe_data(saved_data)}; to continue it, give that data"
                             " (unchanged) as --data")
            continue
        if key in ("out_dir",) or old.get(key) == new.get(key) or key not in new:
            continue
        line = f"{key}: {old.get(key)!r} -> {new.get(key)!r}"
        (refused if key.split(".")[0] in PROTECTED and key.split(".")[0] not in allow else changes).append(line)
    if refused:
        fields = sorted({line.split(":")[0].split(".")[0] for line in refused})
        raise ValueError(
            "resuming would change what this run computes:\n  " + "\n  ".join(refused)
            + "".join(f"\n{h}" for h in hints)
            + "\nkeep the saved values (the checkpoint's run.yaml), start a new out_dir, or pass"
            + "".join(f" --allow-change {f}" for f in fields) + " if the change is intended"
        )
    return changes
