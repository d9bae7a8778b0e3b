"""Training progress for people: tqdm's live bar on a terminal, plain lines everywhere else.

A bar redirected to a file or a pipe writes every refresh after a ``\\r`` on one endless line; so
when stdout or stderr is not a terminal, :class:`Progress` prints one ordinary line instead every
``every_steps`` steps, or sooner when ``every_s`` seconds have passed since the last one, and at the
last step::

    step 250/1500  loss 4.1234  lr 2.85e-03  tok/s 12,345  eta 6m12s

Messages (evaluations, Ctrl-C) go through :meth:`Progress.write` in both modes, so they never
tear the bar.
"""

from __future__ import annotations

import sys
import time


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
    """The main rank's progress display of one training run.

    Args:
        total: the step count the run ends at (``max_steps``).
        initial: the step the run starts from (non-zero when resuming).
        enabled: False = show nothing (``progress=false``, non-main ranks).
        every_steps: plain mode: a line every this many steps (the run's ``log_every``); also the
            window over which tokens/s is measured in both modes.
        every_s: plain mode: also a line when this many seconds passed since the last one.
        live: draw tqdm's bar (default: when stdout and stderr are terminals).
    """

    def __init__(self, total: int, initial: int = 0, enabled: bool = True, every_steps: int = 10,
                 every_s: float = 30.0, live: bool | None = None) -> None:
        self.total, self.enabled = total, enabled
        self.every_steps, self.every_s = max(1, every_steps), every_s
        self.live = stdout_is_terminal() if live is None else live
        self._bar = None
        self._start_step, self._start_time = initial, time.perf_counter()
        self._last_line = self._start_time
        self._window_tokens, self._window_time = 0, 0.0
        if enabled and self.live:
            from tqdm.auto import tqdm

            self._bar = tqdm(total=total, initial=initial, desc="train", unit="step", dynamic_ncols=True)

    def update(self, step: int, loss: float, lr: float, tokens: int, seconds: float) -> None:
        """Step ``step`` finished with this loss and learning rate, ``tokens`` tokens in ``seconds``."""
        if not self.enabled:
            return
        self._window_tokens += tokens
        self._window_time += seconds
        tok_s = self._window_tokens / max(self._window_time, 1e-9)
        if self._bar is not None:
            self._bar.update(1)
            self._bar.set_postfix(loss=f"{loss:.4f}", lr=f"{lr:.2e}", tok_s=f"{tok_s:,.0f}")
        elif self._line_due(step):
            print(self.line(step, loss, lr, tok_s), flush=True)
            self._last_line = time.perf_counter()
        if step % self.every_steps == 0:
            self._window_tokens, self._window_time = 0, 0.0

    def _line_due(self, step: int) -> bool:
        return (step % self.every_steps == 0 or step >= self.total
                or time.perf_counter() - self._last_line >= self.every_s)

    def line(self, step: int, loss: float, lr: float, tok_s: float) -> str:
        """One plain progress line; the eta extrapolates this session's mean time per step."""
        done = step - self._start_step
        per_step = (time.perf_counter() - self._start_time) / max(done, 1)
        eta = format_duration(per_step * max(self.total - step, 0))
        return f"step {step}/{self.total}  loss {loss:.4f}  lr {lr:.2e}  tok/s {tok_s:,.0f}  eta {eta}"

    def write(self, text: str) -> None:
        """A message line (above the bar on a terminal)."""
        if not self.enabled:
            return
        if self._bar is not None:
            self._bar.write(text)
        else:
            print(text, flush=True)

    def close(self) -> None:
        if self._bar is not None:
            self._bar.close()
            self._bar = None
