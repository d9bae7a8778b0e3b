"""Where a run computes and what it was measured on: the device a spec names
(:func:`resolve_device`), and library versions, the slmlab source commit, device, dtype, threads, date.

:func:`run_environment` is recorded in ``report.json`` so a number can be traced to the code and
machine that produced it. The git commit is that of the slmlab source tree (when slmlab runs from a
git checkout; an installed wheel has none), with ``git_dirty`` when tracked files differ from it.
"""

from __future__ import annotations

import datetime
import os
import platform
import subprocess
from pathlib import Path

import torch

from .distributed import DistInfo


def resolve_device(spec: str, dist_info: DistInfo | None = None) -> torch.device:
    """``auto`` -> ``cuda:<local_rank>`` when CUDA is present, else ``cpu``; an explicit device must
    exist here (``device=cuda`` on a CPU build is a ``ValueError`` saying what to use instead)."""
    if spec == "auto":
        if torch.cuda.is_available():
            return torch.device("cuda", dist_info.local_rank if dist_info else 0)
        return torch.device("cpu")
    try:
        device = torch.device(spec)
    except (RuntimeError, TypeError):
        raise ValueError(f"device={spec!r} is not a torch device; use auto, cpu, cuda or cuda:<index>") from None
    if device.type == "cuda" and not torch.cuda.is_available():
        raise ValueError(f"device={spec!r} but this machine or torch build has no CUDA; use device=auto or device=cpu")
    if device.type == "cuda" and device.index is not None and device.index >= torch.cuda.device_count():
        raise ValueError(f"device={spec!r} but only {torch.cuda.device_count()} CUDA device(s) exist; use cuda:0..")
    if device.type not in ("cpu", "cuda") and not _backend_available(device.type):
        raise ValueError(f"device={spec!r} is not available on this machine; use device=auto or device=cpu")
    return device


def _backend_available(kind: str) -> bool:
    module = getattr(torch, kind, None) or getattr(torch.backends, kind, None)
    probe = getattr(module, "is_available", None)
    return bool(probe()) if callable(probe) else False


def _version(package: str) -> str | None:
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version(package)
    except PackageNotFoundError:
        return None


def _git(args: list[str], cwd: Path) -> str | None:
    try:
        done = subprocess.run(["git", *args], cwd=cwd, capture_output=True, text=True, timeout=10,
                              env={**os.environ, "GIT_OPTIONAL_LOCKS": "0"})
    except (OSError, subprocess.SubprocessError):
        return None
    return done.stdout.strip() if done.returncode == 0 else None


def source_commit(path: Path | None = None) -> tuple[str | None, bool | None]:
    """``(commit, dirty)`` of the git work tree holding ``path`` (default: the slmlab package), or
    ``(None, None)`` when it is not in one or git is unavailable."""
    where = Path(path) if path is not None else Path(__file__).resolve().parents[1]
    commit = _git(["rev-parse", "HEAD"], where)
    if not commit:
        return None, None
    status = _git(["status", "--porcelain", "--untracked-files=no"], where)
    return commit, (bool(status) if status is not None else None)


def device_name(device: torch.device) -> str:
    """A human name for ``device``: the GPU's model, or the CPU's."""
    if device.type == "cuda" and torch.cuda.is_available():
        return torch.cuda.get_device_name(device)
    return platform.processor() or platform.machine() or "cpu"


def run_environment(device: torch.device | str, dtype: torch.dtype, precision: str, world_size: int = 1) -> dict:
    """The environment record of ``report.json``.

    Args:
        device: where the run computed.
        dtype: the weights' dtype.
        precision: the forward's arithmetic (``fp32`` or ``bf16 autocast``).
        world_size: processes (torchrun ranks).
    """
    device = torch.device(device)
    commit, dirty = source_commit()
    from .. import __version__

    return {
        "slmlab": _version("slmlab") or __version__,  # a source tree on PYTHONPATH has no installed metadata
        "torch": torch.__version__,
        "transformers": _version("transformers"),
        "python": platform.python_version(),
        "platform": platform.platform(),
        "git_commit": commit,
        "git_dirty": dirty,
        "device": str(device),
        "device_name": device_name(device),
        "dtype": str(dtype).removeprefix("torch."),
        "precision": precision,
        "threads": torch.get_num_threads(),
        "world_size": world_size,
        "date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
    }
