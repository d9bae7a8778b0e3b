"""One run, one folder: an exclusive lock on ``out_dir`` for the whole of ``slmlab train``.

The lock is ``fcntl.flock`` on ``out_dir/.lock``; the operating system releases it when the
process exits, however it exits (``kill -9`` included), so a stale lock never blocks a later run.
The holder writes its pid into the file so that a refused second run can name it.
"""

from __future__ import annotations

import os
from pathlib import Path

LOCK_NAME = ".lock"


class RunLocked(ValueError):
    """Another process holds the run folder (the message names its pid)."""


def prepare_run_dir(run_dir: Path) -> Path:
    """Create ``run_dir`` (and parents); a path that exists as a file is an error saying so."""
    run_dir = Path(run_dir)
    for parent in (run_dir, *run_dir.parents):
        if parent.exists() and not parent.is_dir():
            raise ValueError(f"out_dir {run_dir} cannot be created: {parent} is a file; choose another out_dir")
    run_dir.mkdir(parents=True, exist_ok=True)
    return run_dir


class RunLock:
    """Hold ``run_dir/.lock`` exclusively while the ``with`` block runs.

    Args:
        run_dir: the run folder (created if missing).
        enabled: False makes the lock a no-op (non-main ranks of a torchrun job: rank 0 holds it).

    The lock is re-entrant per instance: ``acquire`` (or ``with``) on a lock this instance already holds
    counts one more hold, and the folder is released when the last hold is released. Another instance
    (or process) on the same folder is refused.

    Raises:
        RunLocked: another live process holds the folder.
    """

    def __init__(self, run_dir: str | Path, enabled: bool = True) -> None:
        self.run_dir = Path(run_dir)
        self.enabled = enabled
        self._fd: int | None = None
        self._holds = 0  # acquire calls not yet released (re-entry by the holder)
        self._created = False  # whether acquire created the folder (removed again if the run wrote nothing)

    def acquire(self) -> RunLock:
        if not self.enabled:
            return self
        if self._fd is not None:
            self._holds += 1
            return self
        import fcntl

        self._created = not self.run_dir.exists()
        path = prepare_run_dir(self.run_dir) / LOCK_NAME
        fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o644)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            holder = os.pread(fd, 64, 0).decode("ascii", "replace").strip() or "unknown"
            os.close(fd)
            raise RunLocked(
                f"out_dir {self.run_dir} is in use by another slmlab train (pid {holder}); wait for it to finish,"
                " stop it, or choose another out_dir"
            ) from None
        os.ftruncate(fd, 0)
        os.pwrite(fd, f"{os.getpid()}\n".encode(), 0)
        os.fsync(fd)
        self._fd = fd
        self._holds = 1
        return self

    def release(self) -> None:
        """Release the lock; a folder it created that holds nothing but the lock (a run refused before it
        wrote anything) is removed, so the refusal leaves no trace to trip the next command."""
        if self._fd is None:
            return
        self._holds -= 1
        if self._holds > 0:
            return
        if self._created and [p.name for p in self.run_dir.iterdir()] == [LOCK_NAME]:
            (self.run_dir / LOCK_NAME).unlink()
            self.run_dir.rmdir()
        os.close(self._fd)  # closing the descriptor releases the flock
        self._fd = None

    def __enter__(self) -> RunLock:
        return self.acquire()

    def __exit__(self, *exc) -> None:
        self.release()
