"""Tokenise a corpus once into memory-mapped token streams, and cut them into fixed-length blocks.

Every document becomes ``<bos> ids <eos>``; the documents of a split are concatenated into one
stream stored as ``uint16`` (``uint32`` for vocabularies over 65,536) in
``<cache>/tokens/<corpus-hash>-<tokenizer-hash>/<split>.bin`` with a ``meta.json`` beside it.

Tokenising streams the corpus (:meth:`~slmlab.data.corpora.Corpus.iter_documents`) in batches of
about :data:`BATCH_BYTES` of text through the ``tokenizers`` library's parallel ``encode_batch``,
so memory stays bounded whatever the corpus size. The work is cut into shards of about
:data:`SHARD_BYTES` of text, written under ``<cache>/tokens/.partial-<key>/``: a shard's ``.bin`` is
written under a temporary name and renamed, then its ``.json`` records its token, byte and document
counts, so a killed run resumes at the first shard without a ``.json`` (a finished shard is never
redone, a half-written one never read). When every shard is done they are joined into the split
files in a temporary folder, renamed to the final one: a second run (or a second rank) maps the
finished arrays at once, and a crash never leaves a half-written cache behind.
"""

from __future__ import annotations

import contextlib
import fcntl
import functools
import json
import os
import shutil
import tempfile
import time
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from pathlib import Path

import numpy as np
from transformers import PreTrainedTokenizerFast

from ..outputs import publish_modes
from .corpora import SPLITS, Corpus
from .paths import resolve_cache_dir
from .tokenizers import byte_tokenizer, tokenizer_fingerprint

CACHE_VERSION = 1
BATCH_BYTES = 1 << 22  # text per encode_batch call (4 MiB): enough documents for every core, bounded memory
SHARD_BYTES = 1 << 26  # text per resumable shard (64 MiB)
PROGRESS_MIN_BYTES = 1 << 23  # show a progress bar from 8 MiB of text


@dataclass
class TokenStream:
    """One split as a flat token array.

    Args:
        tokens: 1-D ``uint16``/``uint32`` memmap, all documents framed and concatenated.
        n_bytes: UTF-8 bytes of the split's text (specials count 0 bytes).
        n_docs: documents in the split.
    """

    tokens: np.ndarray
    n_bytes: int
    n_docs: int

    @property
    def bytes_per_token(self) -> float:
        return self.n_bytes / max(1, len(self.tokens))


def _token_dtype(vocab_size: int) -> np.dtype:
    return np.dtype(np.uint16) if vocab_size <= 1 << 16 else np.dtype(np.uint32)


def encode_batch(tokenizer: PreTrainedTokenizerFast, texts: list[str]) -> tuple[np.ndarray, np.ndarray]:
    """``(ids, lengths)``: the documents ``texts`` framed ``<bos> ids <eos>`` and concatenated (int64), and
    each one's length, from one parallel ``encode_batch`` call of the Rust tokenizer. The byte-level
    tokenizer (id == byte) takes a shortcut through ``str.encode`` with identical ids."""
    bos, eos = tokenizer.bos_token_id, tokenizer.eos_token_id
    if bos is None or eos is None:
        raise ValueError("the tokenizer must define bos_token and eos_token (use slmlab.data.get_tokenizer)")
    if tokenizer_fingerprint(tokenizer) == _byte_fingerprint():
        pieces = [np.frombuffer(t.encode("utf-8", "replace"), dtype=np.uint8) for t in texts]
    else:
        pieces = [e.ids for e in tokenizer.backend_tokenizer.encode_batch(texts, add_special_tokens=False)]
    lengths = np.fromiter((len(x) + 2 for x in pieces), dtype=np.int64, count=len(pieces))
    flat = np.empty(int(lengths.sum()), dtype=np.int64)
    ends = np.cumsum(lengths)
    starts = ends - lengths
    flat[starts], flat[ends - 1] = bos, eos
    inner = np.ones(len(flat), dtype=bool)
    inner[starts], inner[ends - 1] = False, False
    flat[inner] = np.concatenate([np.asarray(x, dtype=np.int64) for x in pieces]) if pieces else []
    return flat, lengths


def encode_documents(tokenizer: PreTrainedTokenizerFast, texts: Iterable[str],
                     batch_bytes: int = BATCH_BYTES) -> Iterator[np.ndarray]:
    """Yield int64 arrays ``<bos> ids <eos>`` per document (:func:`encode_batch` on ``batch_bytes`` of text
    at a time; ``texts`` is consumed lazily)."""
    for chunk in _text_batches(texts, batch_bytes):
        flat, lengths = encode_batch(tokenizer, chunk)
        yield from np.split(flat, np.cumsum(lengths)[:-1])


@functools.lru_cache(maxsize=1)
def _byte_fingerprint() -> str:
    return tokenizer_fingerprint(byte_tokenizer())


def _text_batches(texts: Iterable[str], batch_bytes: int) -> Iterator[list[str]]:
    chunk, size = [], 0
    for text in texts:
        chunk.append(text)
        size += len(text)
        if size >= batch_bytes:
            yield chunk
            chunk, size = [], 0
    if chunk:
        yield chunk


class _Progress:
    """A tqdm bar over bytes of text, with tokens per second beside it (silent for small corpora)."""

    def __init__(self, total_bytes: int, desc: str, enabled: bool) -> None:
        self.bar = None
        self.tokens, self.t0 = 0, time.perf_counter()
        if enabled and total_bytes >= PROGRESS_MIN_BYTES:
            from tqdm.auto import tqdm

            self.bar = tqdm(total=total_bytes, desc=desc, unit="B", unit_scale=True, unit_divisor=1024,
                            dynamic_ncols=True, mininterval=1.0)

    def update(self, n_bytes: int, n_tokens: int) -> None:
        self.tokens += n_tokens
        if self.bar is not None:
            self.bar.update(n_bytes)
            rate = self.tokens / max(1e-9, time.perf_counter() - self.t0)
            self.bar.set_postfix_str(f"{self.tokens:,} tokens, {rate:,.0f} tok/s", refresh=False)

    def close(self) -> None:
        if self.bar is not None:
            self.bar.close()


class _SplitShards:
    """The shards of one split, fed its documents in order: consecutive groups of about
    ``shard_bytes`` of text (a group closes after the document that reaches it), so the groups are the
    same on every run and a finished shard (its ``.json`` written) is skipped, not redone."""

    def __init__(self, partial: Path, split: str, tokenizer: PreTrainedTokenizerFast, dtype: np.dtype,
                 shard_bytes: int, progress: _Progress) -> None:
        self.partial, self.split, self.tokenizer, self.dtype = partial, split, tokenizer, dtype
        self.shard_bytes, self.progress = shard_bytes, progress
        self.shards: list[tuple[Path, dict]] = []
        self._open()

    def _open(self) -> None:
        self.path = self.partial / f"{self.split}-{len(self.shards):05d}.bin"
        self.done = _finished_shard(self.path, self.dtype.itemsize)
        self.n_docs = self.n_chars = self.n_bytes = self.n_tokens = 0
        self.batch, self.batch_chars, self.file = [], 0, None

    def add(self, text: str) -> None:
        self.n_docs += 1
        self.n_chars += len(text)
        if self.done is None:
            self.batch.append(text)
            self.batch_chars += len(text)
            if self.batch_chars >= BATCH_BYTES:
                self._encode()
        if self.n_chars >= self.shard_bytes:
            self._close()
            self._open()

    def _encode(self) -> None:
        if self.file is None:
            self.file = open(self.path.with_suffix(".bin.tmp"), "wb")
        flat, _ = encode_batch(self.tokenizer, self.batch)
        self.file.write(flat.astype(self.dtype).tobytes())
        n_bytes = sum(len(t) if t.isascii() else len(t.encode("utf-8", "replace")) for t in self.batch)
        self.n_tokens, self.n_bytes = self.n_tokens + len(flat), self.n_bytes + n_bytes
        self.progress.update(n_bytes, len(flat))
        self.batch, self.batch_chars = [], 0

    def _close(self) -> None:
        if self.done is not None:
            if self.done["n_docs"] != self.n_docs:
                raise ValueError(f"token cache shard {self.path} holds {self.done['n_docs']} documents, the corpus"
                                 f" gives {self.n_docs}; delete {self.partial} to start its tokenisation again")
            self.progress.update(self.done["n_bytes"], self.done["n_tokens"])
            self.shards.append((self.path, self.done))
            return
        self._encode()
        self.file.flush()
        os.fsync(self.file.fileno())
        self.file.close()
        os.replace(self.path.with_suffix(".bin.tmp"), self.path)
        info = {"n_tokens": self.n_tokens, "n_bytes": self.n_bytes, "n_docs": self.n_docs}
        _write_json(self.path.with_suffix(".json"), info)
        self.shards.append((self.path, info))

    def finish(self) -> list[tuple[Path, dict]]:
        """Close the last shard (if it holds any document); the split's shards with their counts."""
        if self.n_docs:
            self._close()
        return self.shards


def _write_json(path: Path, data: dict) -> None:
    tmp = path.with_suffix(path.suffix + ".tmp")
    tmp.write_text(json.dumps(data, indent=1))
    os.replace(tmp, path)


def _finished_shard(path: Path, itemsize: int) -> dict | None:
    """A shard's counts if it was finished (its ``.json`` exists and its ``.bin`` has that many tokens)."""
    info_path = path.with_suffix(".json")
    if not info_path.is_file() or not path.is_file():
        return None
    info = json.loads(info_path.read_text())
    return info if path.stat().st_size == info["n_tokens"] * itemsize else None


@contextlib.contextmanager
def _build_lock(path: Path):
    """An exclusive lock on ``path`` (one process builds a cache; the others wait, then map it)."""
    with open(path, "a+") as f:
        fcntl.flock(f, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(f, fcntl.LOCK_UN)


def _build(folder: Path, corpus: Corpus, tokenizer: PreTrainedTokenizerFast, dtype: np.dtype, shard_bytes: int,
           progress: bool) -> None:
    root = folder.parent
    partial = root / f".partial-{folder.name}"
    partial.mkdir(parents=True, exist_ok=True)
    for stale in partial.glob("*.tmp"):  # a shard being written when a run was killed
        stale.unlink()
    total = sum(corpus.text_bytes(split) for split in SPLITS)
    bar = _Progress(total, f"tokenising {corpus.name}", progress)
    try:  # one pass over the corpus feeds both splits' shards
        writers = {split: _SplitShards(partial, split, tokenizer, dtype, shard_bytes, bar) for split in SPLITS}
        for split, _, text in corpus.iter_all():
            writers[split].add(text)
        shards = {split: writers[split].finish() for split in SPLITS}
    finally:
        bar.close()
    tmp = Path(tempfile.mkdtemp(prefix=".tmp-", dir=root))
    try:
        meta = {"corpus": corpus.name, "dtype": dtype.name, "vocab_size": len(tokenizer), "splits": {}}
        for split in SPLITS:
            with open(tmp / f"{split}.bin", "wb") as out:
                for path, _ in shards[split]:
                    with open(path, "rb") as f:
                        shutil.copyfileobj(f, out, 1 << 24)
            meta["splits"][split] = {key: sum(info[key] for _, info in shards[split])
                                     for key in ("n_tokens", "n_bytes", "n_docs")}
        (tmp / "meta.json").write_text(json.dumps(meta, indent=1))
        publish_modes(tmp)  # a shared cache: 0755 / 0644 (the umask's), not mkdtemp's 0700
        try:
            os.replace(tmp, folder)
        except OSError:
            if not (folder / "meta.json").is_file():  # not a lost race with another process: a real error
                raise
    finally:
        if tmp.exists():
            shutil.rmtree(tmp, ignore_errors=True)
    shutil.rmtree(partial, ignore_errors=True)


def token_cache(corpus: Corpus, tokenizer: PreTrainedTokenizerFast, cache_dir: Path | None = None, *,
                shard_bytes: int = SHARD_BYTES, progress: bool = True) -> dict[str, TokenStream]:
    """Memory-mapped token streams of every split of ``corpus``, tokenising only on a cache miss.

    Args:
        corpus: the documents (streamed: a corpus larger than memory works).
        tokenizer: decides the ids; its fingerprint is part of the cache key.
        cache_dir: cache root (default ``$SLMLAB_CACHE`` or ``~/.cache/slmlab``).
        shard_bytes: text per resumable shard (the shards never change the tokens, only how much a
            killed run redoes).
        progress: a progress bar (bytes, tokens per second, ETA) on stderr for corpora of 8 MiB or more.
    Returns:
        ``{"train": TokenStream, "validation": TokenStream}``.
    """
    key = f"{corpus.fingerprint()}-{tokenizer_fingerprint(tokenizer)}-v{CACHE_VERSION}"
    root = resolve_cache_dir(cache_dir) / "tokens"
    folder = root / key
    dtype = _token_dtype(len(tokenizer))
    if not (folder / "meta.json").is_file():
        root.mkdir(parents=True, exist_ok=True)
        with _build_lock(root / f".lock-{key}"):
            if not (folder / "meta.json").is_file():  # another process may have built it while we waited
                _build(folder, corpus, tokenizer, dtype, int(shard_bytes), progress)
    meta = json.loads((folder / "meta.json").read_text())
    streams = {}
    for split in SPLITS:
        info = meta["splits"][split]
        path = folder / f"{split}.bin"
        if path.stat().st_size != info["n_tokens"] * np.dtype(meta["dtype"]).itemsize:
            raise ValueError(f"token cache {path} is truncated or corrupt; delete {folder} to rebuild it")
        tokens = np.memmap(path, dtype=meta["dtype"], mode="r", shape=(info["n_tokens"],))
        streams[split] = TokenStream(tokens=tokens, n_bytes=info["n_bytes"], n_docs=info["n_docs"])
    return streams


def gather_blocks(tokens: np.ndarray, starts: np.ndarray, block_size: int) -> np.ndarray:
    """Rows ``tokens[s : s + block_size]`` for each start ``s``; returns int64 ``[len(starts), block_size]``."""
    index = starts[:, None] + np.arange(block_size)[None, :]
    return np.asarray(tokens[index], dtype=np.int64)
