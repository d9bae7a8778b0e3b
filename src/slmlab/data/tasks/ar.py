"""T2: associative recall in the H3 / safari vocabulary, multi-query by default.

Each row has its own random map from ``K`` keys to ``K`` values (ids: ``0`` PAD, ``1`` COPY, keys
``2 … K+1``, values ``K+2 … 2K+1``; ``K = 19`` is the published vocabulary of 40). Two layouts:

* ``layout="multi"`` (the suite's T2): the multi-query associative recall of Arora et al., "Zoology:
  Measuring and Improving Recall in Efficient Language Models" (arXiv:2312.04927), written in the
  vocabulary of the H3 synthetics (Fu et al., "Hungry Hungry Hippos: Towards Language Modeling with
  State Space Models", arXiv:2212.14052). ``N`` pairs with distinct keys, PAD up to ``COPY``, then every
  key of the row queried once in a random order, each query in a two-token slot (the key, then PAD: the
  answer is not written, as in MQAR)::

      k1 v1 … kN vN [PAD × gap] COPY q1 PAD q2 PAD … qN PAD        (gap = T − 4N − 1)

  The prediction at each query key ``q_j`` must be its value (``N`` scored positions; train on them,
  ``train_on: scored``). Every query sits at least ``gap + 3`` tokens after the last pair, so a model whose
  only memory is a window of ``gap + 2`` tokens sees no pair and cannot do better than
  :meth:`AssociativeRecall.no_read_accuracy`; attention reads the pair wherever it is. By default ``N`` is
  as large as a gap of :data:`MIN_GAP` allows: the 9-token receptive field of four kernel-3 convolutions
  (``shortconv4``) then holds no pair at any query. Single-query AR is solved by gated convolutions and does
  not separate models (Zoology's motivation for MQAR); one supervised query per row also leaves attention
  on a plateau at CPU budgets (``docs/results/bench.md``, the T2 diagnosis). Measured while choosing the
  layout (``attn2-z``, lr 3e-3, docs/results/claim-t2-separation): with the pairs after leading PAD the
  model stayed on the 1/N plateau through 1,500 steps where the same rows with the pairs first were solved
  by step 500; with each answer written after its query, one seed of three stayed on the plateau of
  "a value of the row not yet answered" (0.34 after 2,000 steps).
* ``layout="single"`` (the published H3 / safari task): ``(k, map[k])`` pairs with keys drawn uniformly
  (repeats allowed, always the same value), then ``COPY`` and a key that occurred, then its value:
  ``[PAD if T is even] k1 v1 … kP vP COPY k* v*``, one scored position ``T − 2``.

The last scored position is ``T − 2`` in both (a shifted label has no slot for the last one).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

import numpy as np

from .base import IGNORE_INDEX, Task, TaskBatch, register_task

PAD, COPY = 0, 1
FIRST_KEY = 2
LAYOUTS = ("multi", "single")
MIN_GAP = 7  # default N leaves >= 7 PAD: no pair within 9 tokens (gap + 2) of a query


@dataclass(frozen=True)
class AssociativeRecall(Task):
    """T2 config; vocabulary ``2 + 2K`` (40 at the published ``K`` 19).

    Args:
        T: sequence length.
        layout: ``"multi"`` (every key queried, the suite's T2) or ``"single"`` (the published single-query
            layout).
        N: ``multi``: key-value pairs = queries per row (``None``: as many as leave a gap of :data:`MIN_GAP`, at
            most ``K``).
        K: keys (= values) in the vocabulary.
        n_train / n_test: fixed set sizes.
    """

    name: ClassVar[str] = "ar"
    task_id: ClassVar[int] = 2
    settings: ClassVar[dict[str, dict]] = {
        "cpu": dict(T=32, n_train=10_000, n_test=1_000),
        "gpu": dict(T=256, K=64, n_train=100_000, n_test=3_000),
    }
    T: int = 256
    layout: str = "multi"
    N: int | None = None
    K: int = 19

    @property
    def vocab_size(self) -> int:
        return FIRST_KEY + 2 * self.K

    @property
    def num_pairs(self) -> int:
        """``multi``: the ``N`` pairs (and queries) of a row; ``single``: the ``(T − 3) // 2`` context pairs."""
        if self.layout == "single":
            return (self.T - 3) // 2
        return self.N if self.N is not None else min(self.K, (self.T - 1 - MIN_GAP) // 4)

    @property
    def gap(self) -> int:
        """``multi``: PAD tokens between the last pair and ``COPY`` (``T − 4N − 1``)."""
        return self.T - 4 * self.num_pairs - 1

    @property
    def query_start(self) -> int:
        """``multi``: the position of the first query key (the ``COPY`` token is just before it)."""
        return self.T - 2 * self.num_pairs

    def validate(self) -> None:
        super().validate()
        if self.layout not in LAYOUTS:
            raise ValueError(f"ar: layout must be one of {LAYOUTS}, got {self.layout!r}")
        if self.K < 2:
            raise ValueError(f"ar: K must be >= 2 keys, got {self.K}")
        if self.layout == "single":
            if self.T < 7:
                raise ValueError(f"ar: T must be >= 7 (two pairs, COPY, key, trailing token), got {self.T}")
            return
        if self.N is not None and not 1 <= self.N <= self.K:
            raise ValueError(f"ar: N must be in [1, K={self.K}] (distinct keys), got {self.N}")
        if self.num_pairs < 1 or 4 * self.num_pairs + 1 > self.T:
            raise ValueError(f"ar: T={self.T} cannot hold {max(self.num_pairs, 1)} pairs, COPY and their queries (need"
                             f" T >= 4N + 1{'' if self.N is not None else f' + {MIN_GAP} for the default N'})")

    def no_read_accuracy(self, window: int) -> float:
        """The expected accuracy of the best predictor that sees only the last ``window`` tokens (itself
        included) when no pair is inside them: ``1 / K`` (the value of a key the window shows is uniform over the
        ``K`` values; no answer is written). A model with such a receptive field cannot beat it on ``multi`` rows
        without reading a pair; above it, the generator leaks."""
        if self.layout != "multi":
            raise ValueError("ar: no_read_accuracy is defined for layout='multi'")
        if window < 1 or window > self.gap + 2:
            raise ValueError(f"ar: a window of {window} tokens reaches a pair (gap {self.gap}): use 1 <= window <= gap + 2")
        return 1.0 / self.K

    def _generate(self, n: int, rng: np.random.Generator) -> TaskBatch:
        # one random key -> value map per row: a permutation of the value range
        mapping = np.argsort(rng.random((n, self.K)), axis=1) + FIRST_KEY + self.K
        return self._single(n, rng, mapping) if self.layout == "single" else self._multi(n, rng, mapping)

    def _multi(self, n: int, rng: np.random.Generator, mapping: np.ndarray) -> TaskBatch:
        T, N = self.T, self.num_pairs
        rows = np.arange(n)[:, None]
        keys = np.argsort(rng.random((n, self.K)), axis=1)[:, :N]  # N distinct key indices, in random order
        order = np.argsort(rng.random((n, N)), axis=1)  # every key queried once, in a random order
        queried = np.take_along_axis(keys, order, axis=1)
        inputs = np.full((n, T), PAD, dtype=np.int64)
        inputs[:, 0 : 2 * N : 2] = keys + FIRST_KEY
        inputs[:, 1 : 2 * N : 2] = mapping[rows, keys]
        q0 = self.query_start
        inputs[:, q0 - 1] = COPY
        inputs[:, q0::2] = queried + FIRST_KEY
        labels = np.full((n, T), IGNORE_INDEX, dtype=np.int64)
        labels[:, q0::2] = mapping[rows, queried]
        positions = np.broadcast_to(np.arange(q0, T, 2), (n, N)).astype(np.int64)
        return TaskBatch(inputs=inputs, labels=labels, retrieval_positions=positions.copy(),
                         meta={"group": np.full(n, T, dtype=np.int64), "num_pairs": np.full(n, N, dtype=np.int64)})

    def _single(self, n: int, rng: np.random.Generator, mapping: np.ndarray) -> TaskBatch:
        T, P = self.T, self.num_pairs
        key_idx = rng.integers(0, self.K, size=(n, P))
        rows = np.arange(n)[:, None]
        inputs = np.full((n, T), PAD, dtype=np.int64)
        start = T - 3 - 2 * P  # 0 or 1 leading PAD
        inputs[:, start : start + 2 * P : 2] = key_idx + FIRST_KEY
        inputs[:, start + 1 : start + 2 * P : 2] = mapping[rows, key_idx]
        pick = rng.integers(0, P, size=n)
        queried = key_idx[np.arange(n), pick]
        q = T - 2
        inputs[:, q - 1] = COPY
        inputs[:, q] = queried + FIRST_KEY
        labels = np.full((n, T), IGNORE_INDEX, dtype=np.int64)
        labels[:, q] = mapping[np.arange(n), queried]
        inputs[:, q + 1] = labels[:, q]
        return TaskBatch(
            inputs=inputs,
            labels=labels,
            retrieval_positions=np.full((n, 1), q, dtype=np.int64),
            meta={"group": np.full(n, T, dtype=np.int64)},
        )


register_task(AssociativeRecall, "t2")
