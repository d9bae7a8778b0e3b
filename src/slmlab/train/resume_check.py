"""Resume means the same run: compare the requested config with the checkpoint's ``run.yaml``.

Fields that decide what the resumed steps compute (the model, the data and its order, the
tokenizer, the sequence length, the batch layout) must match, or the resumed run would silently be
a different run wearing the old one's history; a change is refused with a diff unless the user
names the field with ``--allow-change FIELD``. Every other field (``max_steps``, evaluation and
checkpoint cadence, logging, sampling) may change and each change is reported.
"""

from __future__ import annotations

from typing import Any

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


def compare_for_resume(saved: dict, requested: dict, allow: tuple[str, ...] = ()) -> list[str]:
    """Check ``requested`` (``RunConfig.to_dict()``) against the checkpoint's ``saved`` run config.

    Args:
        saved: the checkpoint's ``run.yaml``.
        requested: the config of the run being started.
        allow: protected fields the user explicitly allows to change.
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
    for key in sorted(set(old) | set(new)):
        if key in ("out_dir",) or old.get(key) == new.get(key) or key not in new:
            continue
        line = f"{key}: {old.get(key)!r} -> {new.get(key)!r}"
        (refused if key.split(".")[0] in PROTECTED and key.split(".")[0] not in allow else changes).append(line)
    if refused:
        fields = sorted({line.split(":")[0].split(".")[0] for line in refused})
        raise ValueError(
            "resuming would change what this run computes:\n  " + "\n  ".join(refused)
            + "\nkeep the saved values (the checkpoint's run.yaml), start a new out_dir, or pass"
            + "".join(f" --allow-change {f}" for f in fields) + " if the change is intended"
        )
    return changes
