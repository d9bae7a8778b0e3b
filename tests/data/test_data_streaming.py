"""Corpora larger than memory (issue 28): streamed documents, a split in O(n log k), a sharded token
cache that resumes after a kill byte for byte, and the same tokens and batches as the in-memory path."""

from __future__ import annotations

import hashlib
import json
import os
import signal
import subprocess
import sys
import textwrap

import numpy as np

from slmlab.data import get_source, get_tokenizer, load_corpus
from slmlab.data import packing as packing_module
from slmlab.data.corpora import Corpus, StreamedCorpus
from slmlab.data.packing import token_cache


def reference_split(docs):
    """The split as first specified, recomputed by brute force: drop blank documents, sort every
    name's sha256 hex digest, hold out the max(1, round(10%)) smallest."""
    docs = [(n, t) for n, t in docs if t.strip()]
    n_val = max(1, round(len(docs) * 0.1))
    held = {n for _, n in sorted((hashlib.sha256(n.encode()).hexdigest(), n) for n, _ in docs)[:n_val]}
    return {"train": [d for d in docs if d[0] not in held], "validation": [d for d in docs if d[0] in held]}


def reference_fingerprint(documents):
    h = hashlib.sha256()
    for split in ("train", "validation"):
        h.update(split.encode())
        for name, text in documents[split]:
            for part in (name, text):
                data = part.encode("utf-8", "surrogatepass")
                h.update(len(data).to_bytes(8, "little"))
                h.update(data)
    return h.hexdigest()[:16]


def mixed_folder(root, n_txt=30, n_lines=60):
    """Text files in nested folders, a jsonl with blank and whitespace-only records, a parquet file."""
    rng = np.random.default_rng(0)
    words = ["thou", "art", "the", "king", "ünïcödé", "queen", "😀", "doth", "fox"]
    docs = []
    for i in range(n_txt):
        sub = root / f"part{i % 3}"
        sub.mkdir(parents=True, exist_ok=True)
        text = " ".join(rng.choice(words, 40 + i)) + "\n"
        (sub / f"d{i:03d}.txt").write_text(text, encoding="utf-8")
        docs.append((f"part{i % 3}/d{i:03d}.txt", text))
    lines = []
    for j in range(n_lines):
        text = "" if j % 17 == 5 else ("   \n" if j % 19 == 7 else " ".join(rng.choice(words, 10 + j % 7)))
        lines.append(json.dumps({"text": text}))
        docs.append((f"z.jsonl:{j + 1}", text))
    (root / "z.jsonl").write_text("\n".join(lines) + "\n", encoding="utf-8")
    return root, sorted(docs, key=lambda d: (d[0].split(":")[0], int(d[0].split(":")[1]) if ":" in d[0] else 0))


def test_a_streamed_folder_splits_and_fingerprints_as_specified(tmp_path):
    root, docs = mixed_folder(tmp_path / "c")
    corpus = load_corpus(str(root))
    assert isinstance(corpus, StreamedCorpus)
    expected = reference_split(docs)
    assert corpus.documents == expected
    assert corpus.fingerprint() == reference_fingerprint(expected)
    assert [corpus.n_documents(s) for s in ("train", "validation")] == [len(expected["train"]), len(expected["validation"])]
    assert corpus.text_bytes("validation") == sum(len(t.encode()) for _, t in expected["validation"])


def test_streamed_and_in_memory_corpora_give_the_same_tokens_and_batches(tmp_path):
    root, docs = mixed_folder(tmp_path / "c")
    streamed = load_corpus(str(root))
    in_memory = Corpus(str(root), reference_split(docs))
    for spec in ("byte", "bpe"):
        tok = get_tokenizer(spec, texts=[t for _, t in in_memory.documents["train"]], vocab_size=300,
                            cache_dir=tmp_path / "tk")
        a = get_source(str(root), tok, 16, cache_dir=tmp_path / "a", corpus=streamed)
        b = get_source(str(root), tok, 16, cache_dir=tmp_path / "b", corpus=in_memory)
        for split in ("train", "validation"):
            expect = np.concatenate([[tok.bos_token_id, *tok(t, add_special_tokens=False)["input_ids"], tok.eos_token_id]
                                     for _, t in in_memory.documents[split]])
            assert np.array_equal(np.asarray(a.streams[split].tokens), expect)
            assert np.array_equal(np.asarray(b.streams[split].tokens), expect)
        for x, y in zip(a.batches("train", 4, seed=3, step=5), b.batches("train", 4, seed=3, step=5)):
            assert np.array_equal(x["input_ids"].numpy(), y["input_ids"].numpy())
            break


def test_twenty_thousand_documents_and_a_hundred_thousand_lines_prepare_in_seconds(tmp_path):
    """The old split re-sorted every name per held-out document: minutes at these sizes."""
    folder = tmp_path / "many"
    folder.mkdir()
    for i in range(20_000):
        (folder / f"{i:05d}.txt").write_text(f"doc {i}\n")
    corpus = load_corpus(str(folder))
    assert (corpus.n_documents("train"), corpus.n_documents("validation")) == (18_000, 2_000)
    streams = token_cache(corpus, get_tokenizer("byte"), tmp_path / "cache")
    assert streams["train"].n_docs == 18_000
    path = tmp_path / "lines.jsonl"
    path.write_text("".join(json.dumps({"text": f"line {i}"}) + "\n" for i in range(100_000)))
    corpus = load_corpus(str(path))
    streams = token_cache(corpus, get_tokenizer("byte"), tmp_path / "cache")
    assert streams["validation"].n_docs == 10_000 and len(streams["train"].tokens) > 90_000 * 8


def test_tokenising_reads_the_corpus_a_batch_at_a_time(tmp_path, monkeypatch):
    calls = []
    real = packing_module.encode_batch

    def spy(tokenizer, texts):
        calls.append(sum(len(t) for t in texts))
        return real(tokenizer, texts)

    monkeypatch.setattr(packing_module, "encode_batch", spy)
    monkeypatch.setattr(packing_module, "BATCH_BYTES", 200)
    root, _ = mixed_folder(tmp_path / "c")
    streams = token_cache(load_corpus(str(root)), get_tokenizer("byte"), tmp_path / "cache", shard_bytes=500)
    assert len(calls) > 10 and max(calls) < 200 + 450  # batches of ~200 characters (a document may overshoot)
    meta = json.loads(next((tmp_path / "cache" / "tokens").glob("*/meta.json")).read_text())
    assert meta["splits"]["train"]["n_tokens"] == len(streams["train"].tokens)
    assert not list((tmp_path / "cache" / "tokens").glob(".partial-*"))  # nothing left half-done


KILLER = """
import os, signal, sys
from slmlab.data import packing, load_corpus, get_tokenizer
real, calls = packing.encode_batch, [0]
def killing(tokenizer, texts):
    calls[0] += 1
    if calls[0] == int(sys.argv[3]):
        os.kill(os.getpid(), signal.SIGKILL)  # no finally, no cleanup: as a power cut or the OOM killer
    return real(tokenizer, texts)
packing.encode_batch = killing
packing.BATCH_BYTES = 64
packing.token_cache(load_corpus(sys.argv[1]), get_tokenizer("byte"), sys.argv[2], shard_bytes=400)
"""


def test_a_killed_tokenisation_resumes_to_a_byte_identical_cache(tmp_path, monkeypatch):
    root, _ = mixed_folder(tmp_path / "c")
    clean = token_cache(load_corpus(str(root)), get_tokenizer("byte"), tmp_path / "clean", shard_bytes=400)
    killed = tmp_path / "killed"
    script = tmp_path / "killer.py"
    script.write_text(textwrap.dedent(KILLER))
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)}
    run = subprocess.run([sys.executable, str(script), str(root), str(killed), "37"], env=env, capture_output=True)
    assert run.returncode == -signal.SIGKILL, run.stderr.decode()
    partial = next((killed / "tokens").glob(".partial-*"))
    done = sorted(p.name for p in partial.glob("*.json"))
    assert done and list(partial.glob("*.bin.tmp"))  # killed mid-shard, after some shards finished
    redone = []
    real = packing_module._SplitShards._encode

    def counting(self):
        redone.append(self.path.name)
        return real(self)

    monkeypatch.setattr(packing_module._SplitShards, "_encode", counting)
    resumed = token_cache(load_corpus(str(root)), get_tokenizer("byte"), killed, shard_bytes=400)
    assert redone and not {name.replace(".json", ".bin") for name in done} & set(redone)  # finished shards kept
    for split in ("train", "validation"):
        assert resumed[split].tokens.tobytes() == clean[split].tokens.tobytes()
        assert (resumed[split].n_bytes, resumed[split].n_docs) == (clean[split].n_bytes, clean[split].n_docs)


def test_bpe_trains_from_a_stream_without_a_list(tmp_path, monkeypatch):
    root, docs = mixed_folder(tmp_path / "c")
    texts = get_source(str(root), None, 16).train_texts()
    seen = []

    def no_list(*a, **k):
        raise AssertionError("the texts were put in a list")

    from slmlab.data import tokenizers as tokenizers_module

    real = tokenizers_module.train_bpe

    def spy(texts_arg, vocab_size, length=None):
        assert not isinstance(texts_arg, list)
        seen.append(length)
        return real(texts_arg, vocab_size, length)

    monkeypatch.setattr(tokenizers_module, "train_bpe", spy)
    streamed = get_tokenizer("bpe", texts=texts, vocab_size=300, cache_dir=tmp_path / "a")
    listed = get_tokenizer("bpe", texts=list(texts), vocab_size=300, cache_dir=tmp_path / "b")
    assert seen == [len(texts), len(texts)] and streamed.get_vocab() == listed.get_vocab()


def test_the_scale_benchmark_runs_at_toy_size(tmp_path):
    """benchmarks/bench_data_scale.py at 0.3 MB: both children run and tokenise the same text."""
    from pathlib import Path

    bench = Path(__file__).resolve().parents[2] / "benchmarks" / "bench_data_scale.py"
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)}
    run = subprocess.run([sys.executable, str(bench), "--sizes", "0.3", "--out", str(tmp_path)], env=env,
                         capture_output=True, text=True, timeout=600)
    assert run.returncode == 0, run.stderr
    (row,) = json.loads((tmp_path / "results.json").read_text())
    assert row["same_tokens"] and row["documents"] > 20 and row["peak_rss_MB"] > 0 and row["ratio"] > 0
    assert "| text | documents |" in run.stdout
