"""T2: single-query associative recall (the H3 / Hyena "safari" synthetic), a harness sanity check.

Each example has its own random map from 19 keys to 19 values; the row is ``(k, map[k])`` pairs
with keys drawn uniformly (repeats allowed, always the same value), then ``COPY`` and a key that
occurred; the prediction at that key must be its value. Gated convolutions solve this task; it is
the "prior synthetics are easy" control that motivated MQAR (Arora et al., "Zoology",
arXiv:2312.04927). A model that passes T1 but fails T2 points at a harness bug.

Layout (``T`` tokens): ``[PAD if T is even] k1 v1 ... kP vP COPY k* v*``: the answer is written after
the queried key (as the published task writes it; the prediction at ``k*`` cannot see it), so the
scored position is ``T - 2`` (a shifted label cannot express the last one) and a full next-token LM
(``train_on: all``) is trained on the answer too.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

import numpy as np

from .base import IGNORE_INDEX, Task, TaskBatch, register_task

PAD, COPY = 0, 1
KEYS = (2, 21)  # 19 keys, [lo, hi)
VALUES = (21, 40)  # 19 values


@dataclass(frozen=True)
class AssociativeRecall(Task):
    """Single-query AR config (T2); vocabulary 40.

    Args:
        T: sequence length (>= 7: at least two pairs, ``COPY``, the key and the trailing token).
        n_train / n_test: fixed set sizes.
    """

    name: ClassVar[str] = "ar"
    task_id: ClassVar[int] = 2
    settings: ClassVar[dict[str, dict]] = {
        "cpu": dict(T=64, n_train=10_000, n_test=1_000),
        "gpu": dict(T=256, n_train=100_000, n_test=3_000),
    }
    T: int = 256

    @property
    def vocab_size(self) -> int:
        return VALUES[1]

    @property
    def num_pairs(self) -> int:
        return (self.T - 3) // 2

    def validate(self) -> None:
        super().validate()
        if self.T < 7:
            raise ValueError(f"ar: T must be >= 7 (two pairs, COPY, key, trailing token), got {self.T}")

    def _generate(self, n: int, rng: np.random.Generator) -> TaskBatch:
        T, P = self.T, self.num_pairs
        n_keys = KEYS[1] - KEYS[0]
        # one random key -> value map per row: a permutation of the value range
        mapping = np.argsort(rng.random((n, n_keys)), axis=1) + VALUES[0]
        key_idx = rng.integers(0, n_keys, size=(n, P))
        rows = np.arange(n)[:, None]
        inputs = np.full((n, T), PAD, dtype=np.int64)
        start = T - 3 - 2 * P  # 0 or 1 leading PAD
        inputs[:, start : start + 2 * P : 2] = key_idx + KEYS[0]
        inputs[:, start + 1 : start + 2 * P : 2] = mapping[rows, key_idx]
        pick = rng.integers(0, P, size=n)
        queried = key_idx[np.arange(n), pick]
        q = T - 2
        inputs[:, q - 1] = COPY
        inputs[:, q] = queried + KEYS[0]
        labels = np.full((n, T), IGNORE_INDEX, dtype=np.int64)
        labels[:, q] = mapping[np.arange(n), queried]
        inputs[:, q + 1] = labels[:, q]
        return TaskBatch(
            inputs=inputs,
            labels=labels,
            retrieval_positions=np.full((n, 1), q, dtype=np.int64),
            meta={"group": np.full(n, T, dtype=np.int64)},
        )


register_task(AssociativeRecall, "t2", "single_ar")
