"""T1: multi-query associative recall (MQAR), Zoology-exact format.

Arora et al., "Zoology: Measuring and Improving Recall in Efficient Language Models",
arXiv:2312.04927. The first ``2N`` tokens are ``k1 v1 ... kN vN`` (keys distinct from
``[1, V/2)``, values distinct from ``[V/2, V)``); each key is queried once in the remaining
``T - 2N`` tokens at position ``2N + 2 g_i``, gaps ``g_i`` distinct with ``p(g) ∝ a (g+1)^(a-1)``;
the prediction at a query position must be the key's value. ``num_passes > 1`` writes the kv block
that many times before the queries (Arora et al., "Just read twice: closing the recall gap for
recurrent language models", arXiv:2407.05483): the queries then start at ``2N·num_passes``.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

import numpy as np

from .base import IGNORE_INDEX, Task, TaskBatch, distinct_uniform, register_task, weighted_sample_without_replacement

FILLERS = ("zero", "random")


@dataclass(frozen=True)
class MQAR(Task):
    """MQAR config (T1).

    Args:
        V: vocabulary size (even, > T).
        T: sequence length (even).
        N: key-value pairs = queries per example (4N <= T).
        power_a: gap distribution exponent ``a`` (0.01 clusters queries early; 1 is uniform).
        filler: ``"zero"`` (non-query positions are 0, the paper figure) or ``"random"`` (uniform in [0, V)).
        num_passes: copies of the kv block before the queries (1 = Zoology's layout; ``2N·(num_passes+1) <= T``).
        n_train / n_test: fixed set sizes.
    """

    name: ClassVar[str] = "mqar"
    task_id: ClassVar[int] = 1
    settings: ClassVar[dict[str, dict]] = {
        "cpu": dict(V=1024, T=64, N=4, filler="zero", n_train=20_000, n_test=1_000),
        "gpu": dict(V=8192, T=64, N=4, filler="zero", n_train=100_000, n_test=3_000),
    }
    V: int = 8192
    T: int = 64
    N: int = 4
    power_a: float = 0.01
    filler: str = "zero"
    num_passes: int = 1

    @property
    def vocab_size(self) -> int:
        return self.V

    def validate(self) -> None:
        super().validate()
        if self.T <= 0 or self.T % 2:
            raise ValueError(f"mqar: T must be a positive even integer, got {self.T}")
        if self.V % 2 or self.V <= self.T:
            raise ValueError(f"mqar: V must be even and > T={self.T}, got {self.V}")
        if self.N <= 0 or 4 * self.N > self.T:
            raise ValueError(f"mqar: N must satisfy 1 <= N and 4N <= T={self.T}, got {self.N}")
        if self.num_passes < 1 or 2 * self.N * (self.num_passes + 1) > self.T:
            raise ValueError(
                f"mqar: num_passes must be >= 1 with 2N*(num_passes+1) <= T={self.T}, got {self.num_passes} (N={self.N})"
            )
        if self.N > self.V // 2 - 1:
            raise ValueError(f"mqar: N={self.N} distinct keys do not fit in [1, V/2={self.V // 2})")
        if not self.power_a > 0:
            raise ValueError(f"mqar: power_a must be > 0, got {self.power_a}")
        if self.filler not in FILLERS:
            raise ValueError(f"mqar: filler must be one of {FILLERS}, got {self.filler!r}")

    def _generate(self, n: int, rng: np.random.Generator) -> TaskBatch:
        V, T, N = self.V, self.T, self.N
        keys = distinct_uniform(rng, 1, V // 2, n, N)
        values = distinct_uniform(rng, V // 2, V, n, N)
        kv = 2 * N * self.num_passes  # length of the (repeated) kv block
        space = (T - kv) // 2
        weights = self.power_a * np.arange(1, space + 1, dtype=np.float64) ** (self.power_a - 1)
        gaps = weighted_sample_without_replacement(rng, weights / weights.sum(), n, N)
        query_pos = kv + 2 * gaps  # [n, N], position of each key's query

        inputs = np.zeros((n, T), dtype=np.int64)
        if self.filler == "random":
            inputs[:, kv:] = rng.integers(0, V, size=(n, T - kv))
        for p in range(self.num_passes):
            inputs[:, 2 * N * p : 2 * N * (p + 1) : 2] = keys
            inputs[:, 2 * N * p + 1 : 2 * N * (p + 1) : 2] = values
        np.put_along_axis(inputs, query_pos, keys, axis=1)
        labels = np.full((n, T), IGNORE_INDEX, dtype=np.int64)
        np.put_along_axis(labels, query_pos, values, axis=1)
        return TaskBatch(
            inputs=inputs,
            labels=labels,
            retrieval_positions=np.sort(query_pos, axis=1),
            meta={"group": np.full(n, T, dtype=np.int64), "num_pairs": np.full(n, N, dtype=np.int64)},
        )


register_task(MQAR, "t1")
