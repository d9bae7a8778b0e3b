"""Progress for people (training steps, ``slmlab eval`` batches): tqdm's live bar on a terminal,
plain lines everywhere else.

A bar redirected to a file or a pipe writes every refresh after a ``\\r`` on one endless line; so
when the output is not a terminal, :class:`Progress` prints one ordinary line instead every
``every_steps`` steps, or sooner when ``every_s`` seconds have passed since the last one, and at the
last step::

    step 250/1500  loss 4.1234  lr 2.85e-03  tok/s 12,345  eta 6m12s
    eval batch 12/130  tok/s 12,345  eta 1m02s

Messages (evaluations, Ctrl-C) go through :meth:`Progress.write` in both modes, so they never
tear the bar. Training draws on stdout (the bar on stderr, where tqdm draws); ``slmlab eval`` passes
``stream=sys.stderr`` so its stdout holds only the result.
"""

from __future__ import annotations

import sys
import time
from typing import TextIO


def stdout_is_terminal() -> bool:
    """True when both stdout and stderr (where tqdm draws) are terminals."""
    return all(getattr(s, "isatty", lambda: False)() for s in (sys.stdout, sys.stderr))


def format_duration(seconds: float) -> str:
    """``372`` -> ``6m12s``; ``4000`` -> ``1h06m``; ``12`` -> ``12s``."""
    s = max(0, int(round(seconds)))
    if s < 60:
        return f"{s}s"
    if s < 3600:
        return f"{s // 60}m{s % 60:02d}s"
    return f"{s // 3600}h{s % 3600 // 60:02d}m"


class Progress:
    """The main rank's progress display of one training run or evaluation.

    Args:
        total: the count the work ends at (``max_steps``; the number of evaluation batches).
        initial: the count it starts from (non-zero when resuming).
        enabled: False = show nothing (``progress=false``, non-main ranks).
        every_steps: plain mode: a line every this many steps (the run's ``log_every``); also the
            window over which tokens/s is measured in both modes.
        every_s: plain mode: also a line when this many seconds passed since the last one.
        live: draw tqdm's bar (default: when the output is a terminal: stdout and stderr, or
            ``stream``).
        stream: where plain lines, messages and the bar go (default: plain lines and messages on
            stdout, the bar on stderr).
        desc / unit: the bar's label and unit (``train`` / ``step``).
        label: what a plain line counts (``step``, ``eval batch``).
    """

    def __init__(self, total: int, initial: int = 0, enabled: bool = True, every_steps: int = 10,
                 every_s: float = 30.0, live: bool | None = None, stream: TextIO | None = None,
                 desc: str = "train", unit: str = "step", label: str = "step") -> None:
        self.total, self.enabled = total, enabled
        self.every_steps, self.every_s = max(1, every_steps), every_s
        self.stream, self.label = stream, label
        if live is None:
            live = stdout_is_terminal() if stream is None else bool(getattr(stream, "isatty", lambda: False)())
        self.live = live
        self._bar = None
        self._start_step, self._start_time = initial, time.perf_counter()
        self._last_line = self._start_time
        self._window_tokens, self._window_time = 0, 0.0
        if enabled and self.live:
            from tqdm.auto import tqdm

            self._bar = tqdm(total=total, initial=initial, desc=desc, unit=unit, dynamic_ncols=True, file=stream)

    def update(self, step: int, loss: float, lr: float, tokens: int, seconds: float) -> None:
        """Step ``step`` finished with this loss and learning rate, ``tokens`` tokens in ``seconds``."""
        self.advance(step, tokens, seconds, loss=f"{loss:.4f}", lr=f"{lr:.2e}")

    def advance(self, done: int, tokens: int, seconds: float, **fields: str) -> None:
        """``done`` units (steps, batches) finished, the last one with ``tokens`` tokens in ``seconds``;
        ``fields`` (already formatted, e.g. ``loss="4.1234"``) are shown before tokens/s."""
        if not self.enabled:
            return
        self._window_tokens += tokens
        self._window_time += seconds
        tok_s = self._window_tokens / max(self._window_time, 1e-9)
        if self._bar is not None:
            self._bar.update(done - self._bar.n)
            self._bar.set_postfix(**fields, tok_s=f"{tok_s:,.0f}")
        elif self._line_due(done):
            self._print(self._line(done, fields, tok_s))
            self._last_line = time.perf_counter()
        if done % self.every_steps == 0:
            self._window_tokens, self._window_time = 0, 0.0

    def _line_due(self, step: int) -> bool:
        return (step % self.every_steps == 0 or step >= self.total
                or time.perf_counter() - self._last_line >= self.every_s)

    def line(self, step: int, loss: float, lr: float, tok_s: float) -> str:
        """One plain progress line of a training step."""
        return self._line(step, {"loss": f"{loss:.4f}", "lr": f"{lr:.2e}"}, tok_s)

    def _line(self, done: int, fields: dict[str, str], tok_s: float) -> str:
        """One plain line; the eta extrapolates this session's mean time per unit."""
        per_unit = (time.perf_counter() - self._start_time) / max(done - self._start_step, 1)
        eta = format_duration(per_unit * max(self.total - done, 0))
        shown = "".join(f"  {name} {value}" for name, value in fields.items())
        return f"{self.label} {done}/{self.total}{shown}  tok/s {tok_s:,.0f}  eta {eta}"

    def _print(self, text: str) -> None:
        print(text, file=self.stream or sys.stdout, flush=True)

    def write(self, text: str) -> None:
        """A message line (above the bar on a terminal)."""
        if not self.enabled:
            return
        if self._bar is not None:
            self._bar.write(text, file=self.stream)
        else:
            self._print(text)

    def close(self) -> None:
        if self._bar is not None:
            self._bar.close()
            self._bar = None
