"""T6: byte-level passkey retrieval (the text version of T5).

Mohtashami & Jaggi, "Landmark Attention: Random-Access Infinite Context Length for Transformers",
arXiv:2305.16300. An instruction, then a filler paragraph repeated (truncated to fit ``T`` bytes)
with ``"The pass key is N. Remember it. N is the pass key. "`` inserted at the sentence boundary
nearest to depth ``δ`` of the filler, ending with
``"What is the pass key? The pass key is N"``. Token ids are bytes (vocabulary 256). Scored: the
byte positions whose next byte is a digit of the final ``N`` (the space before it and the digits
but the last), so the last scored position is ``T - 2``.

Decision: ``N`` is drawn from ``10000 … 50000`` (always five digits) rather than ``1 … 50000``, so
every row has the same number of scored positions (``Q = 5``). ``group`` is the depth bucket in
tenths (0 … 10).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

import numpy as np

from .base import IGNORE_INDEX, Task, TaskBatch, register_task

INSTRUCTION = (
    b"There is an important piece of information hidden inside a lot of irrelevant text. "
    b"Find it and memorize it. I will quiz you about it at the end. "
)
FILLER = b"The grass is green. The sky is blue. The sun is yellow. Here we go. There and back again. "
QUESTION = b"What is the pass key? The pass key is "
KEY_RANGE = (10_000, 50_001)
DIGITS = 5


def needle(key: int) -> bytes:
    return f"The pass key is {key}. Remember it. {key} is the pass key. ".encode()


@dataclass(frozen=True)
class Passkey(Task):
    """Passkey config (T6); byte vocabulary 256.

    Args:
        T: sequence length in bytes (>= 512: instruction, needle and question take ~250 bytes).
        depth: fixed depth bucket in tenths (0 … 10), or -1 for a uniform bucket per example.
        n_train / n_test: fixed set sizes.
    """

    name: ClassVar[str] = "passkey"
    task_id: ClassVar[int] = 6
    settings: ClassVar[dict[str, dict]] = {
        "cpu": dict(T=512, n_train=5_000, n_test=500),
        "gpu": dict(T=2048, n_train=50_000, n_test=1_000),
    }
    T: int = 2048
    depth: int = -1

    @property
    def vocab_size(self) -> int:
        return 256

    @property
    def filler_len(self) -> int:
        """Bytes of filler (the needle goes inside it)."""
        return self.T - len(INSTRUCTION) - len(needle(KEY_RANGE[0])) - len(QUESTION) - DIGITS

    def validate(self) -> None:
        super().validate()
        if self.filler_len < 0:
            raise ValueError(f"passkey: T must be >= {self.T - self.filler_len} bytes, got {self.T}")
        if not -1 <= self.depth <= 10:
            raise ValueError(f"passkey: depth must be a bucket in 0 … 10 (tenths) or -1 (random), got {self.depth}")

    def _generate(self, n: int, rng: np.random.Generator) -> TaskBatch:
        T, F = self.T, self.filler_len
        keys = rng.integers(*KEY_RANGE, size=n)
        depth = rng.integers(0, 11, size=n) if self.depth < 0 else np.full(n, self.depth)
        filler = np.frombuffer(FILLER * (F // len(FILLER) + 1), dtype=np.uint8)[:F]
        head = np.frombuffer(INSTRUCTION, dtype=np.uint8)
        question = np.frombuffer(QUESTION, dtype=np.uint8)
        inputs = np.empty((n, T), dtype=np.int64)
        # the needle goes at the sentence boundary nearest to depth * F (never inside a word)
        bounds = np.concatenate([[0], np.flatnonzero((filler[:-1] == ord(".")) & (filler[1:] == ord(" "))) + 2, [F]])
        bounds = bounds[bounds <= F]
        for i in range(n):
            cut = int(bounds[np.argmin(np.abs(bounds - int(depth[i]) / 10 * F))])
            key = int(keys[i])
            inputs[i] = np.concatenate([
                head, filler[:cut], np.frombuffer(needle(key), dtype=np.uint8), filler[cut:], question,
                np.frombuffer(str(key).encode(), dtype=np.uint8),
            ])
        positions = np.tile(np.arange(T - DIGITS - 1, T - 1), (n, 1))
        labels = np.full((n, T), IGNORE_INDEX, dtype=np.int64)
        np.put_along_axis(labels, positions, inputs[:, T - DIGITS :], axis=1)
        return TaskBatch(
            inputs=inputs,
            labels=labels,
            retrieval_positions=positions.astype(np.int64),
            meta={"group": depth.astype(np.int64), "depth": depth.astype(np.int64), "passkey": keys.astype(np.int64)},
        )


register_task(Passkey, "t6")
