"""T4: induction heads, in the published ``trigger`` form and a CPU-trainable ``segment`` form.

``trigger`` (Gu & Dao, "Mamba", arXiv:2312.00752, Table 11; the H3 / Hyena synthetic): content
tokens uniform in ``1 … V-1``, a trigger ``S`` (id 0) at one random position ``p`` followed by a
random token ``x``, and ``S`` again near the end; the prediction at the second ``S`` must be ``x``.
Layout: the second ``S`` sits at ``T - 2`` and the answer ``x`` follows it (a shifted label cannot
express the last position; the prediction at ``T - 2`` cannot see ``T - 1``), so the scored position
is ``T - 2`` and ``p <= T - 5``.

``segment`` (many supervised positions per row): a segment of ``L = T // 4`` content tokens starting
at ``s1`` is copied to a later start ``s2`` in ``[T/2, T - L]`` with ``s1 + L <= s2``; positions
``s2 … s2 + L - 2`` each predict the next token of the copy (``Q = L - 1``). The offset ``s2 - s1``
varies per example: with a fixed offset a model learns a positional head instead of induction.

Both forms are trained on fresh rows every step (``TaskSource`` with ``fresh=True``; the default for
this task) and evaluated on fixed sets; ``group`` is the sequence length, so evaluating the same
model on configs with other ``T`` (``with_length``) gives accuracy by test length.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import ClassVar

import numpy as np

from .base import IGNORE_INDEX, Task, TaskBatch, register_task

TRIGGER = 0
VARIANTS = ("trigger", "segment")


@dataclass(frozen=True)
class Induction(Task):
    """Induction-head config (T4).

    Args:
        T: sequence length of this config (train at ``T``; test lengths are configs with another ``T``).
        V: vocabulary (``trigger``: id 0 is the trigger; ``segment``: content ``1 … V-1``).
        variant: ``"trigger"`` (one scored position) or ``"segment"`` (``T // 4 - 1`` scored positions).
        test_lengths: the lengths to evaluate a trained model at, ``"/"``-separated (``"64/128/256"``).
        n_train / n_test: set sizes (training rows are drawn fresh per step by default).
    """

    name: ClassVar[str] = "induction"
    task_id: ClassVar[int] = 4
    fresh_per_step: ClassVar[bool] = True
    settings: ClassVar[dict[str, dict]] = {
        "cpu": dict(T=64, V=512, variant="segment", test_lengths="64/128/256", n_train=20_000, n_test=1_000),
        "gpu": dict(T=256, V=16, variant="trigger", test_lengths="64/128/256/512/1024/2048/4096/16384",
                    n_train=65_536, n_test=1_000),
    }
    T: int = 256
    V: int = 16
    variant: str = "trigger"
    test_lengths: str = ""

    @property
    def vocab_size(self) -> int:
        return self.V

    @property
    def segment_len(self) -> int:
        return self.T // 4

    @property
    def lengths(self) -> tuple[int, ...]:
        """The test lengths, as integers (``T`` alone when none are given)."""
        return tuple(int(x) for x in self.test_lengths.split("/") if x) or (self.T,)

    def with_length(self, T: int) -> Induction:
        """The same task at another sequence length (for evaluation by test length)."""
        return dataclasses.replace(self, T=int(T))

    def validate(self) -> None:
        super().validate()
        if self.variant not in VARIANTS:
            raise ValueError(f"induction: variant must be one of {VARIANTS}, got {self.variant!r}")
        if self.V < 3:
            raise ValueError(f"induction: V must be >= 3, got {self.V}")
        if self.variant == "trigger" and self.T < 6:
            raise ValueError(f"induction: T must be >= 6 for the trigger variant, got {self.T}")
        if self.variant == "segment" and (self.T < 16 or self.T % 4):
            raise ValueError(f"induction: T must be a multiple of 4 and >= 16 for the segment variant, got {self.T}")
        try:
            bad = [x for x in self.lengths if x < 6]
        except ValueError:
            raise ValueError(f"induction: test_lengths must be integers separated by '/', got {self.test_lengths!r}") from None
        if bad:
            raise ValueError(f"induction: test_lengths must all be >= 6, got {bad}")

    def _generate(self, n: int, rng: np.random.Generator) -> TaskBatch:
        make = self._trigger if self.variant == "trigger" else self._segment
        inputs, labels, positions, offset = make(n, rng)
        return TaskBatch(
            inputs=inputs,
            labels=labels,
            retrieval_positions=positions,
            meta={"group": np.full(n, self.T, dtype=np.int64), "offset": offset},
        )

    def _trigger(self, n: int, rng: np.random.Generator):
        T = self.T
        inputs = rng.integers(1, self.V, size=(n, T))
        p = rng.integers(0, T - 4, size=n)  # the second S is at T - 2, so p + 1 < T - 2
        rows = np.arange(n)
        inputs[rows, p] = TRIGGER
        inputs[:, T - 2] = TRIGGER
        labels = np.full((n, T), IGNORE_INDEX, dtype=np.int64)
        labels[:, T - 2] = inputs[rows, p + 1]
        inputs[:, T - 1] = labels[:, T - 2]
        return inputs.astype(np.int64), labels, np.full((n, 1), T - 2, dtype=np.int64), (T - 2 - p).astype(np.int64)

    def _segment(self, n: int, rng: np.random.Generator):
        T, L = self.T, self.segment_len
        inputs = rng.integers(1, self.V, size=(n, T))
        s2 = rng.integers(T // 2, T - L + 1, size=n)
        s1 = (rng.random(n) * (s2 - L + 1)).astype(np.int64)  # uniform in [0, s2 - L]
        j = np.arange(L)
        rows = np.arange(n)[:, None]
        inputs[rows, s2[:, None] + j] = inputs[rows, s1[:, None] + j]
        positions = s2[:, None] + np.arange(L - 1)
        labels = np.full((n, T), IGNORE_INDEX, dtype=np.int64)
        labels[rows, positions] = inputs[rows, positions + 1]
        return inputs.astype(np.int64), labels, positions.astype(np.int64), (s2 - s1).astype(np.int64)


register_task(Induction, "t4", "induction_heads")
