"""Metrics sinks: one JSON line per record (``metrics.jsonl``) and, optionally, TensorBoard.

Only the main rank writes. Records are flat dicts with a ``step`` and a ``kind`` (``train``,
``eval``); numbers only go to TensorBoard, under ``<kind>/<name>``.
"""

from __future__ import annotations

import json
import math
import os
from pathlib import Path

from ..outputs import dumps_finite


class MetricsLogger:
    """Append-only metrics for one run.

    Args:
        run_dir: the run folder; writes ``metrics.jsonl`` and ``tb/``.
        tensorboard: also write TensorBoard events (skipped with a note if tensorboard is missing).
        enabled: False on non-main ranks (every call is then a no-op).
    """

    def __init__(self, run_dir: Path, tensorboard: bool = True, enabled: bool = True) -> None:
        self.enabled = enabled
        self.path = Path(run_dir) / "metrics.jsonl"
        self._tb = None
        if not enabled:
            return
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self._file = self.path.open("a", encoding="utf-8")
        if tensorboard:
            try:
                from torch.utils.tensorboard import SummaryWriter
            except ImportError:  # the `train` extra is optional
                print("slmlab: tensorboard is not installed; metrics go to metrics.jsonl only")
            else:
                self._tb = SummaryWriter(log_dir=str(Path(run_dir) / "tb"))

    def log(self, kind: str, step: int, values: dict) -> None:
        if not self.enabled:
            return
        record = {"kind": kind, "step": step, **values}
        self._file.write(dumps_finite(record) + "\n")
        self._file.flush()
        if self._tb is not None:
            for name, value in values.items():
                if isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value):
                    self._tb.add_scalar(f"{kind}/{name}", value, step)

    def close(self) -> None:
        if not self.enabled:
            return
        self._file.close()
        if self._tb is not None:
            self._tb.close()


def read_metrics(path: Path, kind: str | None = None) -> list[dict]:
    """The records of a ``metrics.jsonl`` (optionally only one ``kind``)."""
    rows = [json.loads(line) for line in Path(path).read_text().splitlines() if line.strip()]
    return [r for r in rows if kind is None or r.get("kind") == kind]


def trim_metrics(path: Path, step: int) -> int:
    """Drop the records of ``metrics.jsonl`` past ``step`` (a resumed run rewrites them), atomically;
    returns how many were dropped. A torn last line (a kill mid-write) is dropped too."""
    path = Path(path)
    if not path.is_file():
        return 0
    kept, dropped = [], 0
    for line in path.read_text(encoding="utf-8").splitlines():
        try:
            record = json.loads(line) if line.strip() else None
        except json.JSONDecodeError:
            record = None
        if isinstance(record, dict) and int(record.get("step", 0)) <= step:
            kept.append(line)
        elif line.strip():
            dropped += 1
    if dropped:
        tmp = path.with_name(path.name + ".tmp")
        tmp.write_text("".join(f"{line}\n" for line in kept), encoding="utf-8")
        os.replace(tmp, path)
    return dropped
