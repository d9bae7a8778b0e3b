"""The synthetic-task interface and the one label conversion (``docs/data.md``, Synthetic tasks).

A task is a small frozen dataclass config plus a numpy generator
``make(n, seed, split) -> TaskBatch``. Generators follow Zoology's convention (arXiv:2312.04927):
``labels[p]`` is the token the model must output *at* position ``p``. slmlab models follow the
transformers convention (position ``p`` is trained on ``labels[p + 1]``), so
:func:`to_hf_labels` shifts exactly once, at the boundary between task and model; nothing else
in the library shifts task labels.

Adding a task: a new module in this package with a frozen dataclass subclassing :class:`Task` (``name``,
a unique ``task_id``, ``settings``, ``vocab_size``, a field ``T`` (the row length), ``_generate``) and a call to
:func:`register_task`; the package imports every module in it, so nothing else needs editing.
"""

from __future__ import annotations

import abc
import dataclasses
from dataclasses import dataclass
from typing import ClassVar

import numpy as np

IGNORE_INDEX = -100
SPLIT_IDS = {"train": 0, "validation": 1, "test": 2}


@dataclass
class TaskBatch:
    """Generated examples, in the task (Zoology) convention.

    Args:
        inputs: int64 ``[n, T]`` token ids.
        labels: int64 ``[n, T]``; ``labels[i, p]`` is the target for the prediction made *at* ``p``
            (already shifted, Zoology style); ``-100`` = not scored.
        retrieval_positions: int64 ``[n, Q]``, the scored positions of each row, sorted.
        meta: per-example arrays (``[n]``), e.g. ``distance``; ``group`` is the eval bucket.
    """

    inputs: np.ndarray
    labels: np.ndarray
    retrieval_positions: np.ndarray
    meta: dict[str, np.ndarray]

    @property
    def scored(self) -> np.ndarray:
        """bool ``[n, T]``: positions whose prediction is scored."""
        return self.labels != IGNORE_INDEX


def to_hf_labels(labels: np.ndarray) -> np.ndarray:
    """Task labels (target of the prediction at ``p``) -> transformers labels (shifted inside the model).

    ``hf[:, 1:] = labels[:, :-1]`` and ``hf[:, 0] = -100``. A label at the last position has no slot
    after the shift; the generators never score it, and this raises if one does.

    Args:
        labels: int ``[n, T]`` in the task (Zoology) convention.
    Returns:
        int64 ``[n, T]`` in the transformers convention.
    """
    if labels.ndim != 2:
        raise ValueError(f"labels must be [n, T], got shape {labels.shape}")
    if np.any(labels[:, -1] != IGNORE_INDEX):
        raise ValueError("a task scored the last position; its target cannot be expressed as a shifted label")
    hf = np.full(labels.shape, IGNORE_INDEX, dtype=np.int64)
    hf[:, 1:] = labels[:, :-1]
    return hf


def task_rng(seed: int, task_id: int, split: str) -> np.random.Generator:
    """``default_rng(SeedSequence([seed, TASK_ID, SPLIT_ID]))``: one independent stream per task and split."""
    if split not in SPLIT_IDS:
        raise ValueError(f"split must be one of {sorted(SPLIT_IDS)}, got {split!r}")
    return np.random.default_rng(np.random.SeedSequence([int(seed), int(task_id), SPLIT_IDS[split]]))


@dataclass(frozen=True)
class Task(abc.ABC):
    """Base of every synthetic task config.

    Every concrete task defines ``vocab_size`` (a field or property), its row length as the field ``T`` and the
    class attributes below; ``n_train``/``n_test`` are the fixed set sizes of the setting.
    """

    name: ClassVar[str] = ""
    task_id: ClassVar[int] = -1
    settings: ClassVar[dict[str, dict]] = {}
    default_setting: ClassVar[str] = "gpu"
    n_train: int = 0
    n_test: int = 0

    @property
    @abc.abstractmethod
    def vocab_size(self) -> int:
        """Ids are in ``[0, vocab_size)``."""

    @property
    def seq_len(self) -> int:
        """``T``, the length of every row (every task names it by its field ``T``)."""
        return self.T

    def validate(self) -> None:
        """Raise ``ValueError`` naming the field for an impossible config (override and call super)."""
        for f in ("n_train", "n_test"):
            if int(getattr(self, f)) <= 0:
                raise ValueError(f"{self.name}: {f} must be a positive integer, got {getattr(self, f)!r}")

    def __post_init__(self) -> None:
        self.validate()

    def make(self, n: int, seed: int, split: str, chunk_rows: int = 2048) -> TaskBatch:
        """Generate ``n`` examples of ``split``; the same call always gives byte-identical arrays.

        Rows are generated ``chunk_rows`` at a time from one random stream (bounded memory at
        paper-scale vocabularies).
        """
        if int(n) <= 0:
            raise ValueError(f"n must be a positive integer, got {n!r}")
        rng = task_rng(seed, self.task_id, split)
        parts = [self._generate(min(chunk_rows, n - start), rng) for start in range(0, int(n), chunk_rows)]
        return TaskBatch(
            inputs=np.concatenate([p.inputs for p in parts]),
            labels=np.concatenate([p.labels for p in parts]),
            retrieval_positions=np.concatenate([p.retrieval_positions for p in parts]),
            meta={k: np.concatenate([p.meta[k] for p in parts]) for k in parts[0].meta},
        )

    @abc.abstractmethod
    def _generate(self, n: int, rng: np.random.Generator) -> TaskBatch:
        """``n`` examples drawn from ``rng`` (vectorised numpy)."""

    @classmethod
    def from_spec(cls, options: str) -> Task:
        """``"cpu"``, ``"gpu"``, ``"cpu,T=128,N=8"`` or ``"T=128"`` (default setting plus overrides)."""
        setting, overrides = cls.default_setting, {}
        fields = {f.name: f for f in dataclasses.fields(cls)}
        for item in filter(None, (s.strip() for s in options.split(","))):
            if "=" not in item:
                if item not in cls.settings:
                    raise ValueError(f"unknown setting {item!r} for task {cls.name!r}; known: {sorted(cls.settings)}")
                setting = item
                continue
            key, value = (s.strip() for s in item.split("=", 1))
            if key not in fields:
                raise ValueError(f"task {cls.name!r} has no field {key!r}; fields: {sorted(fields)}")
            overrides[key] = _parse_value(key, value, fields[key].type)
        return cls(**{**cls.settings[setting], **overrides})


def _parse_value(key: str, text: str, annotation) -> object:
    """``text`` as the type of field ``key`` (annotations are strings under postponed evaluation)."""
    kind = str(annotation)
    if "None" in kind and text.lower() in ("none", ""):
        return None
    if "bool" in kind:
        if text.lower() not in ("true", "false", "1", "0"):
            raise ValueError(f"field {key!r} expects true or false, got {text!r}")
        return text.lower() in ("true", "1")
    for name, cast in (("float", float), ("int", int)):
        if name in kind:
            try:
                return cast(text)
            except ValueError:
                raise ValueError(f"field {key!r} expects {'an integer' if name == 'int' else 'a number'}, got {text!r}") from None
    return text


TASKS: dict[str, type[Task]] = {}


def register_task(cls: type[Task], *aliases: str) -> type[Task]:
    """Register a task class under its ``name`` and ``aliases`` (``register_task(MQAR, "t1")``).

    The task's module calls this at import; :mod:`slmlab.data.tasks` imports every module of the
    package, so a new task needs no other registration. ``task_id`` seeds the task's random streams
    (:func:`task_rng`), so two tasks sharing one would draw correlated data: a ``task_id`` or a name
    already held by another class raises ``ValueError`` and nothing is registered. Registering the
    same class again (a reloaded module) replaces it.
    """
    if not (isinstance(cls, type) and issubclass(cls, Task)):
        raise TypeError(f"register_task expects a Task subclass, got {cls!r}")
    key_of = _qualified_name(cls)
    if not cls.name or not isinstance(cls.task_id, int) or cls.task_id < 0:
        raise ValueError(f"task {key_of} needs a non-empty name and a task_id >= 0, got {cls.name!r} / {cls.task_id!r}")
    keys = [key.lower() for key in (cls.name, *aliases)]
    for key in keys:
        held = TASKS.get(key)
        if held is not None and _qualified_name(held) != key_of:
            raise ValueError(f"task name {key!r} of {key_of} is already registered by {_qualified_name(held)}")
    for other in set(TASKS.values()):
        if other.task_id == cls.task_id and _qualified_name(other) != key_of:
            raise ValueError(
                f"task_id {cls.task_id} of {key_of} is already used by {_qualified_name(other)} "
                f"(task ids seed the data streams and must be unique; taken: {sorted({t.task_id for t in TASKS.values()})})"
            )
    for key in keys:
        TASKS[key] = cls
    return cls


def _qualified_name(cls: type) -> str:
    return f"{cls.__module__}.{cls.__qualname__}"


def parse_task_spec(spec: str) -> Task | None:
    """``"mqar"``, ``"mqar:cpu"``, ``"t7:cpu,D=4"`` -> a task config; ``None`` if ``spec`` names no task."""
    name, _, options = spec.partition(":")
    cls = TASKS.get(name.lower())
    return None if cls is None else cls.from_spec(options)


def weighted_sample_without_replacement(
    rng: np.random.Generator, weights: np.ndarray, n_rows: int, k: int
) -> np.ndarray:
    """``k`` distinct indices per row, drawn successively with probability proportional to ``weights``.

    Gumbel-top-k (Vieira 2014; Kool et al. 2019, arXiv:1903.06059): the indices of the ``k`` largest
    ``log w + Gumbel`` keys have the law of sequential sampling without replacement.

    Returns:
        int64 ``[n_rows, k]``.
    """
    keys = np.log(weights)[None, :] + rng.gumbel(size=(n_rows, weights.shape[0]))
    return np.argsort(-keys, axis=1, kind="stable")[:, :k].astype(np.int64)


def distinct_uniform(rng: np.random.Generator, low: int, high: int, n_rows: int, k: int) -> np.ndarray:
    """``k`` distinct integers from ``[low, high)`` per row, in uniformly random order.

    Few draws from a wide range (``k^2 <= range``, e.g. MQAR keys): i.i.d. draws, rows with a repeat
    drawn again (rejection keeps the law uniform over distinct ordered tuples). Otherwise the ``k``
    smallest of ``high - low`` uniform keys, ordered by key. Returns int64 ``[n_rows, k]``.
    """
    size = high - low
    if not 0 < k <= size:
        raise ValueError(f"cannot draw {k} distinct values from [{low}, {high})")
    if k * k <= size:
        out = rng.integers(low, high, size=(n_rows, k))
        while True:
            ordered = np.sort(out, axis=1)
            redo = np.flatnonzero((ordered[:, 1:] == ordered[:, :-1]).any(axis=1))
            if redo.size == 0:
                return out.astype(np.int64)
            out[redo] = rng.integers(low, high, size=(redo.size, k))
    keys = rng.random((n_rows, size))
    chosen = np.argpartition(keys, k - 1, axis=1)[:, :k] if k < size else np.tile(np.arange(size), (n_rows, 1))
    order = np.argsort(np.take_along_axis(keys, chosen, axis=1), axis=1)
    return (np.take_along_axis(chosen, order, axis=1) + low).astype(np.int64)
