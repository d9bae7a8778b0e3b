"""One run session: the lifecycle every training entry point shares, written once.

``slmlab train``, ``slmlab finetune`` and ``slmlab transactions pretrain`` / ``finetune`` each run inside a
:class:`RunSession` on their run folder. Entering it, in this order:

1. the kind's own check of the folder's path (:attr:`RunKind.check`: transactions' ``--out`` check);
2. the run lock ``run_dir/.lock`` (:class:`~slmlab.train.lock.RunLock`; under torchrun rank 0 holds it for
   every rank), refused in the kind's words when another live process holds it;
3. SIGTERM becomes Ctrl-C (:func:`~slmlab.train.signals.sigterm_as_interrupt`): the trainer saves a
   checkpoint of the current step and the run ends with exit status 143;
4. the stale temporaries of a killed save are removed, and :func:`start_point` decides, once, whether the
   run starts fresh or from which checkpoint (checked whole: :func:`~slmlab.train.checkpoint.check_checkpoint`).

Inside it the builder of the trainer calls :meth:`RunSession.check_resume` (a change of what the run
computes is refused with a diff: :mod:`slmlab.train.resume_check`) and, once the trainer exists,
:meth:`RunSession.start` (the trainer resumed, ``metrics.jsonl`` trimmed to the checkpoint, the
announcement lines). :meth:`RunKind.exit_status` ends the run: 0 done, 130 Ctrl-C, 143 SIGTERM (a
diverged run exits 1 where it is caught). What differs between the commands (how messages name the
folder, whether a fresh run needs an empty folder) is one :class:`RunKind` row each.
"""

from __future__ import annotations

import contextlib
import os
import sys
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path

from .checkpoint import check_checkpoint, list_checkpoints, remove_stale_temporaries, resolve_checkpoint
from .lock import LOCK_NAME, RunLock, RunLocked
from .signals import exit_status, sigterm_as_interrupt
from .trainer import TIME_CAP_ADVICE, stopped_by_time_cap


def no_check(run_dir: Path) -> None:
    """The default :attr:`RunKind.check`: the lock's own checks of the folder are enough."""


@dataclass(frozen=True)
class RunKind:
    """How one command's training runs treat and name their folder (one row per command).

    Args:
        command: the ``slmlab <command>:`` prefix of the session's lines.
        folder / option: how messages name the run folder and the option that sets it.
        fresh_needs_empty: a fresh run refuses a folder holding any file but the lock (else only one
            holding checkpoints).
        announce_fresh: say ``no checkpoint in ...; starting fresh`` on every fresh start (else only when
            ``--resume`` found nothing to resume).
        torchrun: the command runs under torchrun: only rank 0 (``RANK``) locks and speaks.
        locked: the refusal when another process holds the lock, formatted with ``run_dir``, ``lock``
            and ``pid``; None: the lock's own words (:class:`~slmlab.train.lock.RunLocked`).
        check: called with the run folder before the lock is taken (an output-path check).
    """

    command: str
    folder: str = "out_dir"
    option: str = "out_dir"
    fresh_needs_empty: bool = False
    announce_fresh: bool = True
    torchrun: bool = True
    locked: str | None = None
    check: Callable[[Path], object] = no_check

    def exit_status(self, stop_reason: str) -> int:
        """The exit status of a run that stopped for ``stop_reason`` (:func:`slmlab.train.signals.exit_status`),
        after a line on stderr saying how to finish an interrupted or time-capped run."""
        status = exit_status(stop_reason)
        if status:
            print(f"slmlab {self.command}: {stop_reason}; resume with --resume", file=sys.stderr)
        elif stopped_by_time_cap(stop_reason):
            print(f"slmlab {self.command}: {stop_reason}; {TIME_CAP_ADVICE}", file=sys.stderr)
        return status


TRAIN = RunKind("train")
FINETUNE = RunKind("finetune")


def start_point(run_dir: str | Path, resume: str | Path | bool | None, kind: RunKind) -> Path | None:
    """Fresh or resume, decided here for every training run: the checkpoint the run starts from, or None
    for a fresh start.

    Args:
        run_dir: the run folder.
        resume: True = its newest checkpoint (None when it has none yet: a fresh start); a path = that
            run's newest checkpoint or that checkpoint; None / False = fresh.
        kind: the command's row.
    Raises:
        ValueError: a fresh run into a folder that already holds checkpoints (or, for a kind whose fresh
            run needs an empty folder, any file but the lock); the message says to pass ``--resume``.
    """
    run_dir = Path(run_dir)
    existing = list_checkpoints(run_dir / "checkpoints")
    if resume is True:
        return existing[-1] if existing else None
    if resume:
        return resolve_checkpoint(resume)
    stray = kind.fresh_needs_empty and run_dir.is_dir() and any(p.name != LOCK_NAME for p in run_dir.iterdir())
    if existing or stray:
        what = f"checkpoints (newest: {existing[-1].name})" if existing else "files of an earlier run"
        raise ValueError(f"{kind.folder} {run_dir} already holds {what}; pass --resume to continue that run, or"
                         f" choose another {kind.option}")
    return None


class RunSession:
    """One training run on ``run_dir``, from its lock to its exit status (see the module docstring).

    Args:
        run_dir: the run folder (created by the lock if missing; removed again if the run wrote nothing).
        kind: the command's :class:`RunKind`.
        resume: as :func:`start_point`.
        allow_change: resume-protected fields the user allows to differ (``--allow-change``).

    Attributes (once entered):
        checkpoint: where the run starts (None: fresh), checked whole.
        changes: the allowed changes :meth:`check_resume` found, one ``"field: old -> new"`` each.
        main: whether this process locks and speaks (rank 0 of a torchrun job, or the only process).
    """

    def __init__(self, run_dir: str | Path, kind: RunKind, resume: str | Path | bool | None = False,
                 allow_change: tuple[str, ...] = ()) -> None:
        self.run_dir = Path(run_dir)
        self.kind = kind
        self.resume = resume
        self.allow_change = tuple(allow_change)
        self.main = not kind.torchrun or int(os.environ.get("RANK", "0")) == 0
        self.checkpoint: Path | None = None
        self.changes: list[str] = []
        self._held = contextlib.ExitStack()

    def __enter__(self) -> RunSession:
        self.kind.check(self.run_dir)
        with contextlib.ExitStack() as stack:
            try:
                stack.enter_context(RunLock(self.run_dir, enabled=self.main))
            except RunLocked as err:
                raise self._refusal(err) from None
            stack.enter_context(sigterm_as_interrupt())
            if self.run_dir.exists() and not self.run_dir.is_dir():  # what the lock checks, on every rank
                raise ValueError(f"{self.kind.folder} {self.run_dir} is a file; choose a folder for the run")
            if self.main:
                remove_stale_temporaries(self.run_dir / "checkpoints")
            self.checkpoint = start_point(self.run_dir, self.resume, self.kind)
            if self.checkpoint is not None:
                check_checkpoint(self.checkpoint)
            self._held = stack.pop_all()
        return self

    def __exit__(self, *exc) -> None:
        self._held.close()

    def _refusal(self, err: RunLocked) -> ValueError:
        """The refusal of a folder another process holds, in the kind's words (:attr:`RunKind.locked`)."""
        if self.kind.locked is None:
            return err
        lock = self.run_dir / LOCK_NAME
        pid = lock.read_text(encoding="ascii", errors="replace").strip() if lock.is_file() else ""
        return ValueError(self.kind.locked.format(run_dir=self.run_dir, lock=lock, pid=pid or "unknown"))

    def check_resume(self, cfg, requested_data: dict | None = None, saved: dict | None = None,
                     changes: Sequence[str] = ()) -> None:
        """Refuse resuming :attr:`checkpoint` with another run than it belongs to (nothing to check when
        fresh): ``cfg`` against the checkpoint's ``run.yaml`` (or ``saved``, the caller's reading of it),
        and ``requested_data`` against the data identity it recorded
        (:func:`slmlab.train.resume_check.compare_for_resume`). The allowed changes, after ``changes``
        (the caller's own), are kept for :meth:`start`'s announcement.

        Raises:
            ValueError: a protected field differs and ``allow_change`` does not name it (the diff).
        """
        from .resume_check import compare_for_resume, read_data_identity
        from .saved import saved_run_config

        if self.checkpoint is None:
            return
        saved = saved_run_config(self.checkpoint) if saved is None else saved
        self.changes = [*changes, *compare_for_resume(saved, cfg.to_dict(), self.allow_change,
                                                      read_data_identity(self.checkpoint), requested_data)]

    def start(self, trainer, fresh: str = "starting fresh") -> None:
        """Resume ``trainer`` from :attr:`checkpoint` (if any); then, on the main rank, drop the
        ``metrics.jsonl`` records past its step and say where the run starts: ``resuming from step N``
        and what changed, or ``no checkpoint in ...; <fresh>``."""
        from .metrics import trim_metrics

        if self.checkpoint is not None:
            trainer.resume(self.checkpoint)
        if not self.main:
            return
        say = f"slmlab {self.kind.command}:"
        dropped = trim_metrics(self.run_dir / "metrics.jsonl", trainer.state.step)
        if self.checkpoint is not None:
            print(f"{say} resuming from step {trainer.state.step} (checkpoint {self.checkpoint})")
            for line in self.changes:
                print(f"{say} changed on resume: {line}")
        elif self.kind.announce_fresh or self.resume:
            print(f"{say} no checkpoint in {self.run_dir / 'checkpoints'}; {fresh}")
        if dropped:
            print(f"{say} dropped {dropped} metrics.jsonl records past step {trainer.state.step}")

    def exit_status(self, trainer) -> int:
        """The run's exit status (:meth:`RunKind.exit_status` of its ``stop_reason``)."""
        return self.kind.exit_status(trainer.state.stop_reason)


@contextlib.contextmanager
def held(session: RunSession | None, run_dir: str | Path, kind: RunKind, resume: str | Path | bool | None = False,
         allow_change: tuple[str, ...] = ()) -> Iterator[RunSession]:
    """``session`` when the caller holds one open (a command's, for the whole run); else a session of
    ``run_dir`` opened for the block (a library caller building one trainer)."""
    if session is not None:
        yield session
        return
    with RunSession(run_dir, kind, resume, allow_change) as opened:
        yield opened


def interruption(stop_reason: str) -> KeyboardInterrupt:
    """What to raise when one run of several ended on Ctrl-C or SIGTERM (``stop_reason``), so the others
    do not start: the command exits as that run would have (130 or 143, read from ``stop_reason``)."""
    interrupt = KeyboardInterrupt(stop_reason)
    interrupt.stop_reason = stop_reason
    return interrupt
