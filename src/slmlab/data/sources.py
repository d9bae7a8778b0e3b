"""Data sources: one interface for text corpora and synthetic tasks (the data <-> trainer contract).

``get_source(spec, tokenizer, block_size)`` returns a :class:`DataSource` whose ``batches`` is an
infinite, exactly resumable, rank-sharded stream of ``{"input_ids", "labels", ...}`` dicts with
``labels`` aligned with ``input_ids`` (models shift inside, transformers convention).
"""

from __future__ import annotations

import abc
import itertools
import warnings
from collections.abc import Iterable, Iterator
from functools import cached_property
from pathlib import Path

import numpy as np
import torch
from transformers import PreTrainedTokenizerFast

from .corpora import BUILTIN_CORPORA, ERRORS, Corpus, CorpusTexts, load_corpus
from .packing import TokenStream, gather_blocks, token_cache
from .sampler import EpochSampler, check_shard
from .tasks import IGNORE_INDEX, SPLIT_IDS, Task, parse_task_spec, to_hf_labels

LEAKAGE_WARN_FRACTION = 0.001
EVAL_SAMPLE_SEED = 0  # the fixed sample of a large validation split (eval_batches(sample=...))
TRAIN_ON = ("scored", "all")


class DataSource(abc.ABC):
    """Base of text corpora and synthetic tasks.

    Attributes:
        name: the spec it was built from.
        is_synthetic: True for synthetic tasks.
        min_vocab_size: the smallest model vocabulary that can embed every id it yields.
        seq_len: the length ``T`` of every row it yields.
    """

    name: str
    is_synthetic: bool
    min_vocab_size: int
    seq_len: int
    splits: tuple[str, ...]

    def train_texts(self) -> Iterable[str]:
        """Training documents (for BPE training), re-iterable; empty for synthetic tasks."""
        return ()

    def bytes_per_token(self, split: str) -> float | None:
        """UTF-8 bytes per token of ``split`` (for bits per byte); None for synthetic tasks."""
        return None

    def batches(
        self, split: str, batch_size: int, *, seed: int, step: int = 0, rank: int = 0, world_size: int = 1
    ) -> Iterator[dict[str, torch.Tensor]]:
        """Infinite shuffled stream of ``split``, deterministic in ``(seed, step)``.

        Args:
            split: usually ``"train"``.
            batch_size: rows per rank per step.
            seed: shuffle seed.
            step: first step to yield (exact resume: equals the uninterrupted stream from that step).
            rank / world_size: this rank receives rows ``[rank*B, (rank+1)*B)`` of the global batch of
                ``B*world_size`` rows of each step.
        Yields:
            ``input_ids`` int64 ``[B, T]``, ``labels`` int64 ``[B, T]`` (-100 = not scored), plus
            ``retrieval_positions`` for synthetic tasks.
        """
        check_shard(batch_size, rank, world_size)
        if int(step) < 0:
            raise ValueError(f"step must be >= 0, got {step!r}")
        self._check_split(split)
        sampler = EpochSampler(self._num_rows(split, shuffled=True), seed)
        global_batch = batch_size * world_size
        for s in itertools.count(int(step)):
            epochs, rows = sampler.take(s * global_batch + rank * batch_size, batch_size)
            yield self._rows(split, epochs, rows, sampler, shuffled=True)

    def eval_batches(
        self, split: str, batch_size: int, max_batches: int | None = None, sample: int | None = None
    ) -> Iterator[dict[str, torch.Tensor]]:
        """A finite, deterministic pass over ``split`` in order (the last batch may be smaller).

        Args:
            split: ``"validation"`` (synthetic tasks also ``"test"``; any split the source has).
            batch_size: rows per batch.
            max_batches: stop after this many batches (None = the whole split).
            sample: read only this many rows, drawn without replacement with seed
                :data:`EVAL_SAMPLE_SEED` and visited in order: a fixed subset spread over the whole
                split (None, or at least the split's size = every row).
        """
        check_shard(batch_size, 0, 1)
        if max_batches is not None and int(max_batches) < 0:
            raise ValueError(f"max_batches must be >= 0 or None, got {max_batches!r}")
        if sample is not None and int(sample) < 1:
            raise ValueError(f"sample must be >= 1 or None, got {sample!r}")
        self._check_split(split)
        n = self._num_rows(split, shuffled=False)
        order = np.arange(n, dtype=np.int64)
        if sample is not None and int(sample) < n:
            order = np.sort(np.random.default_rng(EVAL_SAMPLE_SEED).choice(n, int(sample), replace=False))
        limit = len(order) if max_batches is None else min(len(order), int(max_batches) * batch_size)
        for start in range(0, limit, batch_size):
            rows = order[start : min(start + batch_size, limit)]
            yield self._rows(split, np.zeros_like(rows), rows, None, shuffled=False)

    def n_eval_rows(self, split: str) -> int:
        """Rows of one in-order pass over ``split`` (what :meth:`eval_batches` reads without a limit)."""
        self._check_split(split)
        return self._num_rows(split, shuffled=False)

    def _check_split(self, split: str) -> None:
        if split not in self.splits:
            raise ValueError(f"{self.name}: unknown split {split!r}; splits: {list(self.splits)}")

    @abc.abstractmethod
    def _num_rows(self, split: str, shuffled: bool) -> int:
        """Rows of ``split`` (per epoch when ``shuffled``)."""

    @abc.abstractmethod
    def _rows(self, split, epochs, rows, sampler, shuffled) -> dict[str, torch.Tensor]:
        """The batch dict of ``rows`` (visited in ``epochs`` of ``sampler`` when ``shuffled``)."""


class TextSource(DataSource):
    """A text corpus packed into fixed blocks of ``block_size`` tokens.

    The training stream cuts each epoch's blocks at a random offset in ``[0, block_size)`` (drawn per
    epoch from the shuffle seed), so successive epochs see different block boundaries; evaluation uses
    offset 0. Tokenisation happens on first use, so ``train_texts()`` works before a tokenizer exists
    (``tokenizer=None``) for BPE training.
    """

    is_synthetic = False
    splits = ("train", "validation")

    def __init__(
        self, corpus: Corpus, tokenizer: PreTrainedTokenizerFast | None, block_size: int, cache_dir: Path | None = None
    ) -> None:
        if not isinstance(block_size, int) or block_size < 2:
            raise ValueError(f"block_size must be an integer >= 2, got {block_size!r}")
        self.corpus = corpus
        self.name = corpus.name
        self.tokenizer = tokenizer
        self.seq_len = block_size
        self.cache_dir = cache_dir

    @property
    def min_vocab_size(self) -> int:
        return len(self._require_tokenizer())

    def train_texts(self) -> CorpusTexts:
        """The training documents, streamed again on each iteration (never held in memory)."""
        return CorpusTexts(self.corpus, "train")

    def bytes_per_token(self, split: str) -> float | None:
        self._check_split(split)
        return self.streams[split].bytes_per_token

    def _require_tokenizer(self) -> PreTrainedTokenizerFast:
        if self.tokenizer is None:
            raise ValueError(f"{self.name}: this source was built without a tokenizer; pass one to get_source()")
        return self.tokenizer

    @cached_property
    def streams(self) -> dict[str, TokenStream]:
        """The memory-mapped token streams (tokenised on first access, then cached on disk)."""
        streams = token_cache(self.corpus, self._require_tokenizer(), self.cache_dir)
        for split, stream in streams.items():
            need = 2 * self.seq_len if split == "train" else self.seq_len
            if len(stream.tokens) < need:
                raise ValueError(
                    f"{self.name}: the {split} split has {len(stream.tokens)} tokens, fewer than the {need} needed for"
                    f" block_size={self.seq_len}; use a smaller block_size or more text"
                )
        return streams

    def _num_rows(self, split: str, shuffled: bool) -> int:
        n_tokens = len(self.streams[split].tokens)
        # a random per-epoch offset < T must leave every block inside the stream
        return n_tokens // self.seq_len - (1 if shuffled else 0)

    def _rows(self, split, epochs, rows, sampler, shuffled) -> dict[str, torch.Tensor]:
        starts = rows * self.seq_len
        if shuffled:
            for epoch in np.unique(epochs):
                offset = int(sampler.epoch_rng(int(epoch), stream=1).integers(self.seq_len))
                starts[epochs == epoch] += offset
        ids = torch.from_numpy(gather_blocks(self.streams[split].tokens, starts, self.seq_len))
        return {"input_ids": ids, "labels": ids.clone()}


class TaskSource(DataSource):
    """A synthetic task (``docs/data.md``, Synthetic tasks) with fixed train / validation / test sets.

    Labels are converted from the task's convention to the transformers one here, once
    (:func:`~slmlab.data.tasks.to_hf_labels`); ``retrieval_positions`` stay the prediction positions
    ``p`` (``[B]`` when the task scores one position per row, else ``[B, Q]``). Eval batches add
    ``group`` ``[B]`` (sequence length for MQAR, distance for T7).

    Args:
        spec / task: the spec and its parsed task.
        seed: generation seed.
        fresh: draw every training batch anew from ``SeedSequence([seed, task_id, 0, step, rank])``
            instead of shuffling the fixed train set (default: the task's ``fresh_per_step``, True for
            T4). A batch depends only on its step and rank, so resume is exact and ranks are disjoint;
            validation and test stay fixed sets, and the fixed train set is only the leakage reference.
        train_on: ``"scored"`` (training labels only at the scored positions) or ``"all"`` (training
            labels = the inputs: full next-token LM, the safari style); evaluation is always scored.
    """

    is_synthetic = True
    splits = ("train", "validation", "test")

    def __init__(self, spec: str, task: Task, seed: int = 0, fresh: bool | None = None, train_on: str = "scored") -> None:
        if train_on not in TRAIN_ON:
            raise ValueError(f"train_on must be one of {TRAIN_ON}, got {train_on!r}")
        self.name = spec
        self.task = task
        self.seed = int(seed)
        self.fresh = bool(getattr(task, "fresh_per_step", False) if fresh is None else fresh)
        self.train_on = train_on
        self.seq_len = task.seq_len
        self.min_vocab_size = task.vocab_size
        self.leakage: dict[str, float] = {}  # fraction of validation/test rows also in train, once generated

    def batches(
        self, split: str, batch_size: int, *, seed: int, step: int = 0, rank: int = 0, world_size: int = 1
    ) -> Iterator[dict[str, torch.Tensor]]:
        if not (self.fresh and split == "train"):
            yield from super().batches(split, batch_size, seed=seed, step=step, rank=rank, world_size=world_size)
            return
        check_shard(batch_size, rank, world_size)
        if int(step) < 0:
            raise ValueError(f"step must be >= 0, got {step!r}")
        for s in itertools.count(int(step)):
            rng = np.random.default_rng(np.random.SeedSequence([self.seed, self.task.task_id, SPLIT_IDS["train"], s, rank]))
            batch = self.task._generate(batch_size, rng)
            yield self._to_batch(batch.inputs, to_hf_labels(batch.labels), batch.retrieval_positions, None)

    @cached_property
    def _sets(self) -> dict[str, dict[str, np.ndarray]]:
        sizes = {"train": self.task.n_train, "validation": self.task.n_test, "test": self.task.n_test}
        sets = {}
        for split, n in sizes.items():
            batch = self.task.make(n, self.seed, split)
            positions = batch.retrieval_positions
            answers = np.take_along_axis(batch.labels, positions, axis=1)
            if (batch.scored.sum(axis=1) != positions.shape[1]).any() or (answers == IGNORE_INDEX).any():
                raise ValueError(f"{self.name}: generator broke the contract (scored positions != retrieval_positions)")
            dtype = np.uint16 if self.task.vocab_size <= 1 << 16 else np.int64
            sets[split] = {
                "inputs": batch.inputs.astype(dtype),
                "labels": to_hf_labels(batch.labels),
                "positions": positions,
                "group": batch.meta["group"],
            }
        self.leakage = {s: self._overlap(sets["train"]["inputs"], sets[s]["inputs"]) for s in ("validation", "test")}
        for split, frac in self.leakage.items():
            if frac > LEAKAGE_WARN_FRACTION:
                msg = f"{self.name}: {frac:.2%} of {split} rows also occur in train (Zoology warns above 0.1%)"
                warnings.warn(msg, stacklevel=2)
        return sets

    @staticmethod
    def _overlap(train: np.ndarray, other: np.ndarray) -> float:
        """Fraction of ``other``'s rows that also occur in ``train`` (64-bit row hashes)."""
        seen = {hash(row.tobytes()) for row in train}
        return float(np.mean([hash(row.tobytes()) in seen for row in other]))

    def _num_rows(self, split: str, shuffled: bool) -> int:
        return len(self._sets[split]["inputs"])

    def _rows(self, split, epochs, rows, sampler, shuffled) -> dict[str, torch.Tensor]:
        data = self._sets[split]
        group = None if shuffled else data["group"][rows]
        return self._to_batch(data["inputs"][rows], data["labels"][rows], data["positions"][rows], group, shuffled)

    def _to_batch(self, inputs, labels, positions, group, train: bool = True) -> dict[str, torch.Tensor]:
        ids = torch.from_numpy(inputs.astype(np.int64))
        positions = torch.from_numpy(positions)
        out = {
            "input_ids": ids,
            "labels": ids.clone() if train and self.train_on == "all" else torch.from_numpy(labels),
            "retrieval_positions": positions[:, 0].contiguous() if positions.shape[1] == 1 else positions,
        }
        if group is not None:
            out["group"] = torch.from_numpy(group)
        return out


def get_source(
    spec: str,
    tokenizer: PreTrainedTokenizerFast | None,
    block_size: int | None,
    *,
    cache_dir: Path | None = None,
    errors: str = "strict",
    seed: int = 0,
    train_on: str = "scored",
    corpus: Corpus | None = None,
) -> DataSource:
    """Build a data source.

    Args:
        spec: ``"shakespeare"``, ``"pystdlib"``, a local ``.txt``/``.jsonl``/``.parquet`` file or folder,
            ``"hf:<dataset>[:<config>]"``, or a synthetic task ``"mqar"``, ``"mqar:cpu"``, ``"t7"``,
            ``"t7:cpu"`` (``task[:setting][,field=value...]``, e.g. ``"mqar:cpu,T=128,N=8"``).
        tokenizer: for text corpora (may be None to only read ``train_texts()``); ignored by tasks,
            whose ids are task-local (``min_vocab_size`` says how many).
        block_size: tokens per row for text; for tasks it must be None or >= the task's ``T`` (rows
            have length ``T``).
        cache_dir: downloads and token caches (default ``$SLMLAB_CACHE`` or ``~/.cache/slmlab``).
        errors: ``"strict"`` (non-UTF-8 input is an error) or ``"replace"`` (U+FFFD).
        seed: generation seed of synthetic tasks (text corpora are fixed).
        train_on: synthetic tasks: ``scored`` or ``all`` (full next-token labels on training rows).
        corpus: the text corpus ``spec`` names, already loaded (e.g. for :func:`data_identity`), so it
            is not read again; None = load it here.
    """
    if not isinstance(spec, str) or not spec:
        raise ValueError(f"data spec must be a non-empty string, got {spec!r}")
    if errors not in ERRORS:
        raise ValueError(f"errors must be one of {ERRORS}, got {errors!r}")
    task = parse_task_spec(spec)
    if task is not None:
        if block_size is not None and block_size < task.seq_len:
            raise ValueError(f"{spec}: the task's sequences have T={task.seq_len} tokens > block_size={block_size}")
        return TaskSource(spec, task, seed, train_on=train_on)
    if block_size is None:
        raise ValueError(f"{spec}: text corpora need a block_size")
    if corpus is None:
        corpus = load_corpus(spec, cache_dir=cache_dir, errors=errors)
    return TextSource(corpus, tokenizer, block_size, cache_dir)


def spec_kind(spec: str) -> str:
    """What a data spec names: ``"task"`` (a synthetic task), ``"corpus"`` (built-in: shakespeare,
    pystdlib), ``"hf"`` (``hf:<dataset>``) or ``"local"`` (a file or folder)."""
    if parse_task_spec(spec) is not None:
        return "task"
    if spec in BUILTIN_CORPORA:
        return "corpus"
    return "hf" if spec.startswith("hf:") else "local"


def data_identity(spec: str, corpus: Corpus | None = None, *, errors: str = "strict") -> dict:
    """What ``spec`` trains on, independent of how it is spelt (recorded in each checkpoint so that
    ``--resume`` compares the data, not the text of ``--data``).

    A local file or folder is its resolved absolute ``path`` plus the ``fingerprint`` of its content,
    the same :meth:`Corpus.fingerprint` that keys the token cache (a hash of every document's name
    and text, so a spelling of the same folder matches, while an edited, added or removed file, or
    another folder, does not); a named corpus or task is its ``spec``.

    Args:
        spec: a :func:`get_source` spec.
        corpus: the loaded corpus of a local ``spec`` (None = read it here).
        errors: decoding of local files when ``corpus`` is None (``strict`` or ``replace``).
    """
    kind = spec_kind(spec)
    if kind != "local":
        return {"kind": kind, "spec": spec}
    if corpus is None:
        corpus = load_corpus(spec, errors=errors)
    return {"kind": "local", "path": str(Path(spec).expanduser().resolve()), "fingerprint": corpus.fingerprint()}
