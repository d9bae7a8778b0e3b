"""Tokenise a corpus once into memory-mapped token streams, and cut them into fixed-length blocks.

Every document becomes ``<bos> ids <eos>``; the documents of a split are concatenated into one
stream stored as ``uint16`` (``uint32`` for vocabularies over 65,536) in
``<cache>/tokens/<corpus-hash>-<tokenizer-hash>/<split>.bin`` with a ``meta.json`` beside it,
written under a temporary name and renamed, so a second run (or a second rank) maps the finished
arrays at once and a crash never leaves a half-written cache behind.
"""

from __future__ import annotations

import json
import os
import shutil
import tempfile
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import numpy as np
from transformers import PreTrainedTokenizerFast

from .corpora import SPLITS, Corpus
from .paths import resolve_cache_dir
from .tokenizers import byte_tokenizer, tokenizer_fingerprint

CACHE_VERSION = 1
_DOCS_PER_CALL = 64


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


def encode_documents(tokenizer: PreTrainedTokenizerFast, texts: list[str]) -> Iterator[np.ndarray]:
    """Yield int64 arrays ``<bos> ids <eos>`` per document, batched through the Rust tokenizer.

    The byte-level tokenizer (id == byte) takes a shortcut through ``str.encode`` with identical ids.
    """
    bos, eos = tokenizer.bos_token_id, tokenizer.eos_token_id
    if bos is None or eos is None:
        raise ValueError("the tokenizer must define bos_token and eos_token (use slmlab.data.get_tokenizer)")
    is_bytes = tokenizer_fingerprint(tokenizer) == tokenizer_fingerprint(byte_tokenizer())
    for start in range(0, len(texts), _DOCS_PER_CALL):
        chunk = texts[start : start + _DOCS_PER_CALL]
        if is_bytes:
            encoded = [np.frombuffer(t.encode("utf-8", "replace"), dtype=np.uint8) for t in chunk]
        else:
            encoded = [np.asarray(e.ids) for e in tokenizer.backend_tokenizer.encode_batch(chunk, add_special_tokens=False)]
        for ids in encoded:
            out = np.empty(len(ids) + 2, dtype=np.int64)
            out[0], out[1:-1], out[-1] = bos, ids, eos
            yield out


def _write_split(path: Path, tokenizer: PreTrainedTokenizerFast, docs: list[tuple[str, str]], dtype: np.dtype) -> dict:
    n_tokens = n_bytes = 0
    with open(path, "wb") as f:
        for ids in encode_documents(tokenizer, [t for _, t in docs]):
            f.write(ids.astype(dtype).tobytes())
            n_tokens += len(ids)
    n_bytes = sum(len(t.encode("utf-8", "replace")) for _, t in docs)
    return {"n_tokens": n_tokens, "n_bytes": n_bytes, "n_docs": len(docs)}


def token_cache(corpus: Corpus, tokenizer: PreTrainedTokenizerFast, cache_dir: Path | None = None) -> dict[str, TokenStream]:
    """Memory-mapped token streams of every split of ``corpus``, tokenising only on a cache miss.

    Args:
        corpus: the documents.
        tokenizer: decides the ids; its fingerprint is part of the cache key.
        cache_dir: cache root (default ``$SLMLAB_CACHE`` or ``~/.cache/slmlab``).
    Returns:
        ``{"train": TokenStream, "validation": TokenStream}``.
    """
    key = f"{corpus.fingerprint()}-{tokenizer_fingerprint(tokenizer)}-v{CACHE_VERSION}"
    root = resolve_cache_dir(cache_dir) / "tokens"
    folder = root / key
    dtype = _token_dtype(len(tokenizer))
    if not (folder / "meta.json").is_file():
        root.mkdir(parents=True, exist_ok=True)
        tmp = Path(tempfile.mkdtemp(prefix=".tmp-", dir=root))
        try:
            meta = {"corpus": corpus.name, "dtype": dtype.name, "vocab_size": len(tokenizer), "splits": {}}
            for split in SPLITS:
                meta["splits"][split] = _write_split(tmp / f"{split}.bin", tokenizer, corpus.documents[split], dtype)
            (tmp / "meta.json").write_text(json.dumps(meta, indent=1))
            try:
                os.replace(tmp, folder)
            except OSError:
                if not (folder / "meta.json").is_file():  # not a lost race with another rank: a real error
                    raise
        finally:
            if tmp.exists():
                shutil.rmtree(tmp, ignore_errors=True)
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
