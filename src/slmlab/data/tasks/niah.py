"""T5: needle in a haystack at the token level (the retrieval and tracing tasks of RULER).

Hsieh et al., "RULER: What's the Real Context Size of Your Long-Context Language Models?",
arXiv:2404.06654. A needle ``NEEDLE k d1 … dm SEP`` (key ``k``, ``m`` digits) sits at depth
``δ = start / (H - needle length)`` in a haystack of ``H`` tokens; the row ends with the query
``QUERY k`` and the answer digits (teacher forced). Scored: the key position of the query (predicts
``d1``) and ``d1 … d(m-1)`` (predict ``d2 … dm``).

Variants: ``single``; ``multikey`` (``D`` distractor needles with other keys); ``multivalue`` (the
queried key in ``count`` needles with different values; the answer is every value in order of
appearance, ``Q = m·count``); ``multiquery`` (``count`` keys queried one after another); ``vartrack``
(``VAR x1 EQ d1 … dm``, then ``hops`` assignments ``VAR x(i+1) EQ x(i)`` at increasing positions,
query ``QUERY x(hops+1)``: one more read per hop). Haystack ``noise`` (i.i.d. haystack tokens) or
``essay`` (one fixed random 24-token sentence repeated, so only the needle is surprising). Haystack
ids are disjoint from needle ids, so a needle never appears by chance. ``group`` is the depth
bucket in tenths (0 … 10); ``meta["length"]`` is ``T``.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

import numpy as np

from .base import IGNORE_INDEX, Task, TaskBatch, distinct_uniform, register_task

PAD, NEEDLE, QUERY, SEP, VAR, EQ = 0, 1, 2, 3, 4, 5
DIGITS = (6, 16)
KEYS = (16, 80)  # 64 keys / variable names
HAYSTACK = (80, 208)  # 128 haystack tokens
VOCAB = 256
VARIANTS = ("single", "multikey", "multivalue", "multiquery", "vartrack")
HAYSTACKS = ("noise", "essay")
ESSAY_LEN = 24


@dataclass(frozen=True)
class NeedleInHaystack(Task):
    """NIAH config (T5); vocabulary 256 (the PGSM presets' byte vocabulary).

    Args:
        T: sequence length.
        variant: one of ``single``, ``multikey``, ``multivalue``, ``multiquery``, ``vartrack``.
        haystack: ``noise`` or ``essay``.
        m: digits per value (``10^m`` answers).
        D: distractor needles (``multikey``).
        count: needles of the queried key (``multivalue``) or keys queried (``multiquery``), 2 … 4.
        hops: assignments in the ``vartrack`` chain.
        depth: fixed depth bucket in tenths (0 … 10), or -1 for a uniform bucket per example.
        n_train / n_test: fixed set sizes.
    """

    name: ClassVar[str] = "niah"
    task_id: ClassVar[int] = 5
    settings: ClassVar[dict[str, dict]] = {
        "cpu": dict(T=256, variant="single", n_train=10_000, n_test=1_000),
        "gpu": dict(T=1024, variant="single", n_train=100_000, n_test=3_000),
    }
    T: int = 1024
    variant: str = "single"
    haystack: str = "noise"
    m: int = 4
    D: int = 3
    count: int = 2
    hops: int = 1
    depth: int = -1

    @property
    def vocab_size(self) -> int:
        return VOCAB

    @property
    def queries(self) -> int:
        return self.count if self.variant == "multiquery" else 1

    @property
    def answer_digits(self) -> int:
        """Digits after each ``QUERY k``."""
        return self.m * (self.count if self.variant == "multivalue" else 1)

    @property
    def needle_len(self) -> int:
        return self.m + 3

    @property
    def haystack_len(self) -> int:
        """``H``: tokens before the query block."""
        return self.T - self.queries * (2 + self.answer_digits)

    def _items(self) -> int:
        """Needles (and hop assignments) placed in the haystack."""
        return {"single": 1, "multikey": 1 + self.D, "multivalue": self.count, "multiquery": self.count,
                "vartrack": 1}[self.variant]

    def validate(self) -> None:
        super().validate()
        if self.variant not in VARIANTS:
            raise ValueError(f"niah: variant must be one of {VARIANTS}, got {self.variant!r}")
        if self.haystack not in HAYSTACKS:
            raise ValueError(f"niah: haystack must be one of {HAYSTACKS}, got {self.haystack!r}")
        if not 1 <= self.m <= 8:
            raise ValueError(f"niah: m must be in [1, 8], got {self.m}")
        if not 0 <= self.D < KEYS[1] - KEYS[0]:
            raise ValueError(f"niah: D must be in [0, {KEYS[1] - KEYS[0] - 1}], got {self.D}")
        if not 2 <= self.count <= 4:
            raise ValueError(f"niah: count must be in [2, 4], got {self.count}")
        if not 1 <= self.hops < KEYS[1] - KEYS[0]:
            raise ValueError(f"niah: hops must be in [1, {KEYS[1] - KEYS[0] - 1}], got {self.hops}")
        if not -1 <= self.depth <= 10:
            raise ValueError(f"niah: depth must be a bucket in 0 … 10 (tenths) or -1 (random), got {self.depth}")
        used = self._items() * self.needle_len + (4 * self.hops if self.variant == "vartrack" else 0)
        if 2 * used > self.haystack_len:
            raise ValueError(
                f"niah: T={self.T} leaves a haystack of {self.haystack_len} tokens, too short for {used} needle tokens"
                " (they may fill at most half of it); raise T or lower D / count / hops / m"
            )

    def _generate(self, n: int, rng: np.random.Generator) -> TaskBatch:
        T, H, m = self.T, self.haystack_len, self.m
        if self.haystack == "noise":
            inputs = rng.integers(HAYSTACK[0], HAYSTACK[1], size=(n, T))
        else:
            sentence = np.random.default_rng(np.random.SeedSequence([self.task_id, 24])).integers(*HAYSTACK, ESSAY_LEN)
            phase = rng.integers(0, ESSAY_LEN, size=n)
            inputs = sentence[(phase[:, None] + np.arange(T)) % ESSAY_LEN]
        inputs = inputs.astype(np.int64)
        depth = rng.integers(0, 11, size=n) if self.depth < 0 else np.full(n, self.depth)
        labels = np.full((n, T), IGNORE_INDEX, dtype=np.int64)
        n_keys = max(self._items(), self.hops + 1)
        keys = distinct_uniform(rng, KEYS[0], KEYS[1], n, n_keys)
        values = rng.integers(DIGITS[0], DIGITS[1], size=(n, max(self._items(), 1), m))
        q_per = 2 + self.answer_digits
        positions = []
        for i in range(n):
            answers = self._fill_row(rng, inputs[i], int(depth[i]), keys[i], values[i])
            for j, (key, digits) in enumerate(answers):
                q = H + j * q_per
                inputs[i, q], inputs[i, q + 1] = QUERY, key
                inputs[i, q + 2 : q + 2 + len(digits)] = digits
                scored = np.arange(q + 1, q + 1 + len(digits))
                labels[i, scored] = digits
            positions.append(np.flatnonzero(labels[i] != IGNORE_INDEX))
        return TaskBatch(
            inputs=inputs,
            labels=labels,
            retrieval_positions=np.stack(positions).astype(np.int64),
            meta={"group": depth.astype(np.int64), "depth": depth.astype(np.int64),
                  "length": np.full(n, T, dtype=np.int64)},
        )

    def _fill_row(self, rng, row: np.ndarray, depth: int, keys: np.ndarray, values: np.ndarray) -> list:
        """Write the needles of one row; return ``[(queried key, answer digits), ...]`` in query order."""
        H, nl = self.haystack_len, self.needle_len
        free = np.ones(H, dtype=bool)

        def needle(key, digits):
            return np.concatenate([[NEEDLE, key], digits, [SEP]])

        if self.variant == "vartrack":
            hop_room = 4 * self.hops
            start = round(depth / 10 * (H - nl - hop_room))
            row[start : start + nl] = np.concatenate([[VAR, keys[0], EQ], values[0]])
            # hop starts at increasing positions in [start + nl, H - 4]: sorted gaps over the free tokens
            spare = H - start - nl - hop_room
            gaps = np.sort(rng.integers(0, spare + 1, size=self.hops))
            for h in range(self.hops):
                s = start + nl + gaps[h] + 4 * h
                row[s : s + 4] = (VAR, keys[h + 1], EQ, keys[h])
            return [(keys[self.hops], values[0])]
        start = round(depth / 10 * (H - nl))
        placed = [(start, keys[0], values[0])]
        row[start : start + nl] = needle(keys[0], values[0])
        free[start : start + nl] = False
        if self.variant == "multivalue":
            others = [(keys[0], values[j]) for j in range(1, self.count)]
        else:  # multikey distractors and multiquery keys: other keys, their own values
            others = [(keys[j], values[j]) for j in range(1, self._items())]
        for key, digits in others:
            ok = np.lib.stride_tricks.sliding_window_view(free, nl).all(axis=1)
            starts = np.flatnonzero(ok)
            s = int(starts[rng.integers(starts.size)])
            row[s : s + nl] = needle(key, digits)
            free[s : s + nl] = False
            placed.append((s, key, digits))
        if self.variant == "multivalue":
            ordered = sorted(placed, key=lambda t: t[0])
            return [(keys[0], np.concatenate([d for _, _, d in ordered]))]
        if self.variant == "multiquery":
            order = rng.permutation(len(placed))
            return [(placed[j][1], placed[j][2]) for j in order]
        return [(keys[0], values[0])]


register_task(NeedleInHaystack, "t5", "needle")
