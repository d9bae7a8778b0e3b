"""T3: selective copying (Gu & Dao, "Mamba", arXiv:2312.00752, Table 1; the S4 copying task).

``M`` data tokens from ``1 … A-2`` sit at sorted random positions among ``L + M`` slots of blank
noise (id 0); then ``M`` marker tokens (id ``A-1``); marker ``i`` must output data token ``i``.
``variable=False`` puts the data tokens contiguously at the start: the non-selective control that
time-invariant models solve by counting.

Layout (``T`` tokens): ``[L + M slots] [M markers] [one trailing blank]`` with ``L = T - 2M - 1``:
the trailing token makes the last scored position ``T - 2`` (a shifted label cannot express the
last one), so Mamba's ``T = 4096, L = 4064`` becomes ``L = 4063`` here.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

import numpy as np

from .base import IGNORE_INDEX, Task, TaskBatch, register_task

BLANK = 0


@dataclass(frozen=True)
class SelectiveCopy(Task):
    """Selective copying config (T3).

    Args:
        T: sequence length (``L = T - 2M - 1`` noise slots).
        A: alphabet: 0 blank, ``1 … A-2`` data, ``A-1`` marker (>= 3).
        M: data tokens to copy (= scored positions).
        variable: data at random sorted positions (True, Mamba) or contiguous at the start (False).
        n_train / n_test: fixed set sizes (``TaskSource(fresh=True)`` draws training rows per step).
    """

    name: ClassVar[str] = "selective_copy"
    task_id: ClassVar[int] = 3
    settings: ClassVar[dict[str, dict]] = {
        "cpu": dict(T=256, A=16, M=16, n_train=20_000, n_test=1_000),
        "gpu": dict(T=4096, A=16, M=16, n_train=100_000, n_test=1_000),
    }
    T: int = 4096
    A: int = 16
    M: int = 16
    variable: bool = True

    @property
    def vocab_size(self) -> int:
        return self.A

    @property
    def noise_slots(self) -> int:
        """``L``."""
        return self.T - 2 * self.M - 1

    def validate(self) -> None:
        super().validate()
        if self.A < 3:
            raise ValueError(f"selective_copy: A must be >= 3 (blank, data, marker), got {self.A}")
        if self.M < 1:
            raise ValueError(f"selective_copy: M must be >= 1, got {self.M}")
        if self.noise_slots < 0:
            raise ValueError(f"selective_copy: T={self.T} is too short for M={self.M} (need T >= 2M + 1)")

    def _generate(self, n: int, rng: np.random.Generator) -> TaskBatch:
        T, M, slots = self.T, self.M, self.noise_slots + self.M
        data = rng.integers(1, self.A - 1, size=(n, M))
        if self.variable:
            pos = np.sort(np.argsort(rng.random((n, slots)), axis=1)[:, :M], axis=1)
        else:
            pos = np.tile(np.arange(M), (n, 1))
        inputs = np.full((n, T), BLANK, dtype=np.int64)
        np.put_along_axis(inputs, pos, data, axis=1)
        markers = np.arange(slots, slots + M)
        inputs[:, markers] = self.A - 1
        labels = np.full((n, T), IGNORE_INDEX, dtype=np.int64)
        labels[:, markers] = data
        return TaskBatch(
            inputs=inputs,
            labels=labels,
            retrieval_positions=np.tile(markers, (n, 1)).astype(np.int64),
            meta={"group": np.full(n, T, dtype=np.int64)},
        )


register_task(SelectiveCopy, "t3", "copying")
