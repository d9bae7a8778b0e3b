"""Exact-resume, rank-sharded row order shared by every data source.

The train stream is a concatenation of epochs; epoch ``e`` visits the ``n`` rows in the order of a
permutation drawn from ``default_rng([seed, e])``. Global row ``i`` of the stream is therefore a pure
function of ``(seed, i)``: step ``s`` of a run with per-rank batch ``B`` on ``W`` ranks covers global
rows ``[s*B*W, (s+1)*B*W)`` and rank ``r`` takes ``[s*B*W + r*B, s*B*W + (r+1)*B)``. Starting at any
step reproduces the uninterrupted stream, and ``W`` ranks together read exactly the global batch a
single process with batch ``B*W`` reads.
"""

from __future__ import annotations

import numpy as np


class EpochSampler:
    """Maps global stream positions to ``(epoch, row)`` pairs.

    Args:
        n_rows: rows per epoch (> 0).
        seed: shuffle seed.
    """

    def __init__(self, n_rows: int, seed: int) -> None:
        if n_rows <= 0:
            raise ValueError(f"n_rows must be positive, got {n_rows}")
        self.n_rows = int(n_rows)
        self.seed = int(seed)
        self._epoch = -1
        self._perm = np.empty(0, dtype=np.int64)

    def epoch_rng(self, epoch: int, stream: int = 0) -> np.random.Generator:
        """The generator of epoch ``epoch`` (``stream`` separates independent draws of one epoch)."""
        return np.random.default_rng([self.seed, int(epoch), int(stream)])

    def permutation(self, epoch: int) -> np.ndarray:
        if epoch != self._epoch:
            self._perm = self.epoch_rng(epoch).permutation(self.n_rows)
            self._epoch = epoch
        return self._perm

    def take(self, start: int, count: int) -> tuple[np.ndarray, np.ndarray]:
        """Global positions ``[start, start + count)`` -> ``(epochs [count], rows [count])``."""
        pos = np.arange(start, start + count, dtype=np.int64)
        epochs, offsets = pos // self.n_rows, pos % self.n_rows
        rows = np.empty(count, dtype=np.int64)
        for epoch in np.unique(epochs):
            sel = epochs == epoch
            rows[sel] = self.permutation(int(epoch))[offsets[sel]]
        return epochs, rows


def check_shard(batch_size: int, rank: int, world_size: int) -> None:
    """Validate the per-rank batch size and the rank layout."""
    if int(batch_size) <= 0:
        raise ValueError(f"batch_size must be a positive integer, got {batch_size!r}")
    if int(world_size) <= 0:
        raise ValueError(f"world_size must be a positive integer, got {world_size!r}")
    if not 0 <= int(rank) < int(world_size):
        raise ValueError(f"rank must be in [0, world_size={world_size}), got {rank!r}")
