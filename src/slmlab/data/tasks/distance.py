"""T7: associative retrieval at a controlled distance (the PGSM "distance 768 in block 1024" task).

A reconstruction of the experiment behind PGSM's retrieval head (``docs/data.md``, Synthetic tasks):
``STORE k* v*`` is written so that the key sits ``distance`` tokens before the queried key,
``QUERY k*`` ends at the query position ``q``, and the prediction at ``q`` must be ``v*``. ``D``
distractor triples ``STORE k_j v_j`` with other keys sit at random free places before the query.
Filler ids are disjoint from keys, values and markers, so a needle never appears by chance.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

import numpy as np

from .base import IGNORE_INDEX, Task, TaskBatch, distinct_uniform, register_task

PAD, STORE, QUERY = 0, 1, 2
KEYS = (4, 68)  # 64 keys, [lo, hi)
VALUES = (68, 132)  # 64 values
FILLER = (132, 256)  # 124 filler tokens
LAYOUTS = ("marker_then_key", "key_then_marker")


@dataclass(frozen=True)
class DistanceRetrieval(Task):
    """Distance-controlled retrieval config (T7); vocabulary 256.

    Args:
        T: sequence length.
        distance: ``q - kpos``, from the stored key to the queried key (>= 3).
        max_distance: if set, the distance of each example is uniform in ``[distance, max_distance]``.
        D: distractor triples (distinct keys != k*); D >= 2 is the headline setting.
        query_layout: ``"marker_then_key"`` writes ``QUERY k*`` at ``(q-1, q)``; ``"key_then_marker"``
            writes ``k* QUERY`` (for PGSM's ``auto_retrieve_on_query_token`` mode). Scored position: ``q``.
        n_train / n_test: fixed set sizes.
    """

    name: ClassVar[str] = "t7"
    task_id: ClassVar[int] = 7
    settings: ClassVar[dict[str, dict]] = {
        "cpu": dict(T=128, distance=96, D=2, n_train=8_000, n_test=500),
        "gpu": dict(T=1024, distance=768, D=8, n_train=100_000, n_test=3_000),
    }
    T: int = 1024
    distance: int = 768
    max_distance: int | None = None
    D: int = 8
    query_layout: str = "marker_then_key"

    @property
    def vocab_size(self) -> int:
        return FILLER[1]

    def validate(self) -> None:
        super().validate()
        top = self.distance if self.max_distance is None else self.max_distance
        if self.distance < 3:
            raise ValueError(f"t7: distance must be >= 3 (STORE triple and QUERY pair must not overlap), got {self.distance}")
        if self.max_distance is not None and self.max_distance < self.distance:
            raise ValueError(f"t7: max_distance={self.max_distance} must be >= distance={self.distance}")
        if top > self.T - 4:
            raise ValueError(f"t7: distance {top} does not fit in T={self.T} (need distance <= T - 4)")
        if not 0 <= self.D <= KEYS[1] - KEYS[0] - 1:
            raise ValueError(f"t7: D must be in [0, {KEYS[1] - KEYS[0] - 1}], got {self.D}")
        if 3 * (self.D + 1) > self.distance - 1:
            raise ValueError(f"t7: D={self.D} distractor triples do not fit before a query at distance {self.distance}")
        if self.query_layout not in LAYOUTS:
            raise ValueError(f"t7: query_layout must be one of {LAYOUTS}, got {self.query_layout!r}")

    def _generate(self, n: int, rng: np.random.Generator) -> TaskBatch:
        T, D = self.T, self.D
        inputs = rng.integers(FILLER[0], FILLER[1], size=(n, T))
        hi = self.distance if self.max_distance is None else self.max_distance
        dist = rng.integers(self.distance, hi + 1, size=n)
        # q in [dist + 2, T - 2]: the prediction at T - 1 has no slot once labels are shifted.
        q = rng.integers(dist + 2, T - 1)
        kpos = q - dist
        keys = distinct_uniform(rng, KEYS[0], KEYS[1], n, D + 1)
        values = rng.integers(VALUES[0], VALUES[1], size=(n, D + 1))
        rows = np.arange(n)
        inputs[rows, kpos - 1], inputs[rows, kpos], inputs[rows, kpos + 1] = STORE, keys[:, 0], values[:, 0]
        first, second = (QUERY, keys[:, 0]) if self.query_layout == "marker_then_key" else (keys[:, 0], QUERY)
        inputs[rows, q - 1], inputs[rows, q] = first, second
        for i in range(n):
            self._place_distractors(rng, inputs[i], int(q[i]), int(kpos[i]), keys[i, 1:], values[i, 1:])
        labels = np.full((n, T), IGNORE_INDEX, dtype=np.int64)
        labels[rows, q] = values[:, 0]
        return TaskBatch(
            inputs=inputs.astype(np.int64),
            labels=labels,
            retrieval_positions=q[:, None].astype(np.int64),
            meta={"group": dist.astype(np.int64), "distance": dist.astype(np.int64)},
        )

    @staticmethod
    def _place_distractors(rng, row: np.ndarray, q: int, kpos: int, keys: np.ndarray, values: np.ndarray) -> None:
        """Write ``STORE k v`` triples at random free starts ``s`` with ``s + 2 < q - 1``."""
        free = np.ones(q - 1, dtype=bool)  # positions 0 .. q-2 may hold a distractor
        free[kpos - 1 : kpos + 2] = False
        for k, v in zip(keys, values):
            ok = free[:-2] & free[1:-1] & free[2:]
            starts = np.flatnonzero(ok)
            if starts.size == 0:
                raise ValueError("t7: no room left for a distractor triple; lower D or raise distance")
            s = int(starts[rng.integers(starts.size)])
            row[s], row[s + 1], row[s + 2] = STORE, k, v
            free[s : s + 3] = False


register_task(DistanceRetrieval, "distance_retrieval")
