"""Documents read one at a time: local ``.txt``/``.jsonl``/``.parquet`` files and Hugging Face datasets.

A *document reader* yields ``(name, text)`` pairs in a fixed order and holds at most one document
(one ``.txt`` file, one jsonl line, one Parquet record batch) in memory, so a corpus of any size is
read in bounded memory. Names are what the train/validation split hashes
(:mod:`slmlab.data.corpora`): the file's path relative to the corpus folder for a ``.txt`` file,
``<file>:<line>`` (1-based, counting blank lines) for a jsonl line, ``<file>:<row>`` (0-based) for a
Parquet row, ``<split>:<row>`` for a dataset row. Readers yield empty documents too; the corpus drops
them.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

ERRORS = ("strict", "replace")
PARQUET_BATCH_ROWS = 1024
DATASET_BATCH_ROWS = 1000


def decode_utf8(data: bytes, origin: str, errors: str = "strict", offset: int = 0) -> str:
    """Decode UTF-8 (a leading BOM is dropped); a clear ``ValueError`` names the file and byte offset
    (``offset``: where ``data`` starts in that file)."""
    if errors not in ERRORS:
        raise ValueError(f"errors must be one of {ERRORS}, got {errors!r}")
    try:
        text = data.decode("utf-8", errors=errors)
    except UnicodeDecodeError as exc:
        raise ValueError(
            f"{origin} is not valid UTF-8 (byte offset {offset + exc.start}: {data[exc.start:exc.start + 4]!r}); re-encode"
            " it as UTF-8, or substitute U+FFFD for bad bytes: data_errors=replace (slmlab train / eval run config),"
            " --errors replace (slmlab tokenizer train), errors='replace' (Python)"
        ) from None
    return text[1:] if text.startswith("\ufeff") else text


@dataclass(frozen=True)
class LocalFile:
    """A local file of a corpus: its ``path``, its name in the corpus (``label``), how to decode it."""

    path: Path
    label: str
    errors: str = "strict"

    @property
    def size(self) -> int:
        return self.path.stat().st_size


@dataclass(frozen=True)
class TextFile(LocalFile):
    """A ``.txt`` file: one document, named ``label``."""

    def documents(self) -> Iterator[tuple[str, str]]:
        yield self.label, decode_utf8(self.path.read_bytes(), str(self.path), self.errors)


@dataclass(frozen=True)
class JsonlFile(LocalFile):
    """A ``.jsonl`` file: one document per line (the string field ``field``), read line by line."""

    field: str = "text"

    def documents(self) -> Iterator[tuple[str, str]]:
        offset = 0
        with open(self.path, "rb") as f:
            for lineno, raw in enumerate(f, 1):
                line = decode_utf8(raw, str(self.path), self.errors, offset)
                offset += len(raw)
                if not line.strip():
                    continue
                try:
                    record = json.loads(line)
                except json.JSONDecodeError as exc:
                    raise ValueError(f"{self.path}:{lineno}: not valid JSON ({exc.msg})") from None
                if not isinstance(record, dict) or not isinstance(record.get(self.field), str):
                    keys = sorted(record) if isinstance(record, dict) else type(record).__name__
                    raise ValueError(f"{self.path}:{lineno}: expected an object with a string field {self.field!r},"
                                     f" got {keys}")
                yield f"{self.label}:{lineno}", record[self.field]


@dataclass(frozen=True)
class ParquetFile(LocalFile):
    """A ``.parquet`` file: one document per row of the string column ``field``, read a record batch
    at a time (null rows are skipped)."""

    field: str = "text"

    def documents(self) -> Iterator[tuple[str, str]]:
        try:
            import pyarrow.parquet as pq
        except ImportError:
            raise ValueError(f"reading {self.path} needs pyarrow (pip install pyarrow)") from None
        table = pq.ParquetFile(str(self.path))
        columns = table.schema_arrow.names
        if self.field not in columns:
            raise ValueError(f"{self.path}: no column {self.field!r}; columns: {columns}")
        row = 0
        for batch in table.iter_batches(batch_size=PARQUET_BATCH_ROWS, columns=[self.field]):
            for value in batch.column(0).to_pylist():
                if value is not None and not isinstance(value, str):
                    raise ValueError(f"{self.path}: column {self.field!r} must hold strings, row {row} holds"
                                     f" {type(value).__name__} ({value!r:.40}); convert the column to text")
                if value is not None:
                    yield f"{self.label}:{row}", value
                row += 1


READERS = {".txt": TextFile, ".jsonl": JsonlFile, ".parquet": ParquetFile}


def file_reader(path: Path, label: str, errors: str = "strict"):
    """The reader of one local file, chosen by its suffix (``.txt``, ``.jsonl``, ``.parquet``)."""
    return READERS.get(path.suffix.lower(), TextFile)(path, label, errors)


@dataclass(frozen=True)
class DatasetSplit:
    """One split of a ``datasets`` dataset (Arrow, memory-mapped from its cache: rows are read a batch
    at a time, never the whole column); a row's document is its string field ``field``."""

    dataset: object
    split: str
    origin: str
    field: str = "text"

    @property
    def size(self) -> int:
        return int(getattr(self.dataset, "dataset_size", None) or 0)

    def documents(self) -> Iterator[tuple[str, str]]:
        if self.field not in self.dataset.column_names:
            raise ValueError(f"{self.origin} split {self.split!r} has no column {self.field!r};"
                             f" columns: {self.dataset.column_names}")
        row = 0
        for batch in self.dataset.iter(batch_size=DATASET_BATCH_ROWS):
            for value in batch[self.field]:
                if isinstance(value, str):
                    yield f"{self.split}:{row}", value
                row += 1
