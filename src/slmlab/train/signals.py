"""SIGTERM is Ctrl-C: schedulers, ``timeout`` and container stops end a run the same way a user does.

:func:`sigterm_as_interrupt` turns the first SIGTERM into :class:`Terminated`, a
``KeyboardInterrupt``, so the trainer's Ctrl-C path runs unchanged: it saves a checkpoint of the
current step and the command writes the report, then exits 143 (128 + SIGTERM). Further SIGTERMs
while that checkpoint is written are ignored, so a second signal cannot cut the save short.
"""

from __future__ import annotations

import contextlib
import signal

EXIT_INTERRUPTED = 130  # 128 + SIGINT
EXIT_TERMINATED = 143  # 128 + SIGTERM


class Terminated(KeyboardInterrupt):
    """A SIGTERM arrived; handled like Ctrl-C (``stop_reason`` says which)."""

    stop_reason = "terminated (SIGTERM)"


@contextlib.contextmanager
def sigterm_as_interrupt():
    """Within the block, the first SIGTERM raises :class:`Terminated`; later ones are ignored.
    Outside the main thread (where handlers cannot be installed) this is a no-op."""
    fired = False

    def handler(signum, frame):
        nonlocal fired
        if fired:
            return
        fired = True
        raise Terminated()

    try:
        previous = signal.signal(signal.SIGTERM, handler)
    except ValueError:  # not the main thread
        yield
        return
    try:
        yield
    finally:
        signal.signal(signal.SIGTERM, previous)


def exit_status(stop_reason: str) -> int:
    """The exit status of a run that stopped for ``stop_reason``: 143 after SIGTERM, 130 after
    Ctrl-C, 0 otherwise (a diverged run exits 1 elsewhere)."""
    if stop_reason.startswith("terminated"):
        return EXIT_TERMINATED
    if stop_reason.startswith("interrupted"):
        return EXIT_INTERRUPTED
    return 0
