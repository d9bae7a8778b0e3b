"""Data sources: the data <-> trainer contract (batches, exact resume, rank sharding, eval, caching)."""

from __future__ import annotations

import itertools
import random

import numpy as np
import pytest
import torch

import slmlab
from slmlab.data import get_source, get_tokenizer
from slmlab.data import packing as packing_module
from slmlab.models import get_family


def write_corpus(folder, n_docs=10, lines=40):
    """Documents of random words (no two 32-byte blocks alike)."""
    folder.mkdir(parents=True, exist_ok=True)
    rng = random.Random(0)
    words = ["thou", "art", "the", "king", "ünïcödé", "queen", "😀", "doth", "fox", "dog", "lazy", "brown"]
    for i in range(n_docs):
        body = "".join(f"doc {i} line {j}: " + " ".join(rng.choices(words, k=10)) + "\n" for j in range(lines))
        (folder / f"d{i:02d}.txt").write_text(body)
    return folder


@pytest.fixture()
def corpus(tmp_path):
    return str(write_corpus(tmp_path / "corpus"))


@pytest.fixture()
def text_source(corpus, tmp_path):
    return get_source(corpus, get_tokenizer("byte"), 32, cache_dir=tmp_path / "cache")


def task_source():
    return get_source("mqar:cpu,V=128,T=32,N=4,n_train=50,n_test=20", None, 32)


def take(stream, n):
    return list(itertools.islice(stream, n))


def assert_same_batches(a, b):
    assert len(a) == len(b)
    for x, y in zip(a, b):
        assert x.keys() == y.keys()
        for key in x:
            assert torch.equal(x[key], y[key]), key


def test_text_batches_follow_the_contract(text_source):
    batch = next(text_source.batches("train", 4, seed=0))
    assert set(batch) == {"input_ids", "labels"}
    assert batch["input_ids"].shape == (4, 32) and batch["input_ids"].dtype == torch.int64
    assert torch.equal(batch["labels"], batch["input_ids"])  # aligned; the model shifts inside
    assert batch["labels"] is not batch["input_ids"]
    assert text_source.min_vocab_size == 259 and int(batch["input_ids"].max()) < 259
    assert not text_source.is_synthetic and text_source.seq_len == 32


@pytest.mark.parametrize("make", ["text", "task"])
def test_exact_resume_across_epochs(make, text_source):
    src = text_source if make == "text" else task_source()
    full = take(src.batches("train", 8, seed=5), 40)  # several epochs of the small train sets
    assert_same_batches(take(src.batches("train", 8, seed=5, step=23), 17), full[23:])
    other = take(src.batches("train", 8, seed=6), 1)[0]
    assert not torch.equal(other["input_ids"], full[0]["input_ids"])


@pytest.mark.parametrize("make", ["text", "task"])
def test_ranks_split_the_global_batch(make, text_source):
    src = text_source if make == "text" else task_source()
    single = take(src.batches("train", 6, seed=1, step=3), 5)
    ranks = [take(src.batches("train", 2, seed=1, step=3, rank=r, world_size=3), 5) for r in range(3)]
    for s in range(5):
        for key in single[s]:
            assert torch.equal(torch.cat([ranks[r][s][key] for r in range(3)]), single[s][key])


def test_an_epoch_visits_every_block_once(text_source):
    n = text_source._num_rows("train", shuffled=True)
    rows = torch.cat([b["input_ids"] for b in take(text_source.batches("train", 1, seed=0), n)])
    assert len({tuple(r.tolist()) for r in rows}) == n


def test_stream_is_bos_text_eos_per_document(corpus, tmp_path):
    tok = get_tokenizer("byte")
    src = get_source(corpus, tok, 32, cache_dir=tmp_path / "c")
    docs = src.corpus.documents["validation"]
    expected = np.concatenate([[tok.bos_token_id, *t.encode(), tok.eos_token_id] for _, t in docs])
    assert np.array_equal(np.asarray(src.streams["validation"].tokens), expected)
    n_bytes = sum(len(t.encode()) for _, t in docs)
    assert src.bytes_per_token("validation") == pytest.approx(n_bytes / len(expected))


def test_eval_batches_are_finite_ordered_and_deterministic(text_source):
    n_tokens = len(text_source.streams["validation"].tokens)
    batches = list(text_source.eval_batches("validation", 3))
    assert sum(len(b["input_ids"]) for b in batches) == n_tokens // 32
    flat = torch.cat([b["input_ids"] for b in batches]).flatten()
    assert np.array_equal(flat.numpy(), np.asarray(text_source.streams["validation"].tokens[: len(flat)]))
    assert_same_batches(batches, list(text_source.eval_batches("validation", 3)))
    assert len(list(text_source.eval_batches("validation", 3, max_batches=2))) == 2


def test_token_cache_is_reused_and_keyed_by_tokenizer(corpus, tmp_path, monkeypatch):
    cache = tmp_path / "cache"
    first = get_source(corpus, get_tokenizer("byte"), 32, cache_dir=cache)
    _ = first.streams  # tokenise once, into the cache
    assert isinstance(first.streams["train"].tokens, np.memmap)

    def refuse(*args, **kwargs):
        raise AssertionError("tokenised again despite the cache")

    monkeypatch.setattr(packing_module, "encode_batch", refuse)
    again = get_source(corpus, get_tokenizer("byte"), 16, cache_dir=cache)
    assert np.array_equal(again.streams["train"].tokens, first.streams["train"].tokens)
    monkeypatch.undo()
    bpe = get_tokenizer("bpe", texts=first.train_texts(), vocab_size=300, cache_dir=cache)
    _ = get_source(corpus, bpe, 32, cache_dir=cache).streams
    assert len([p for p in (cache / "tokens").iterdir() if not p.name.startswith(".")]) == 2


def test_truncated_cache_is_detected(corpus, tmp_path):
    src = get_source(corpus, get_tokenizer("byte"), 32, cache_dir=tmp_path / "c")
    path = src.streams["train"].tokens.filename
    with open(path, "r+b") as f:
        f.truncate(100)
    with pytest.raises(ValueError, match="truncated or corrupt"):
        _ = get_source(corpus, get_tokenizer("byte"), 32, cache_dir=tmp_path / "c").streams


def test_train_texts_work_before_a_tokenizer_exists(corpus, tmp_path):
    src = get_source(corpus, None, 32, cache_dir=tmp_path)
    texts = list(src.train_texts())
    assert len(texts) == 9 and all(t.startswith("doc ") for t in texts)
    with pytest.raises(ValueError, match="built without a tokenizer"):
        next(src.batches("train", 2, seed=0))


def test_bpe_source_end_to_end(corpus, tmp_path):
    texts = get_source(corpus, None, 32, cache_dir=tmp_path).train_texts()
    tok = get_tokenizer("bpe", texts=texts, vocab_size=300, cache_dir=tmp_path)
    src = get_source(corpus, tok, 32, cache_dir=tmp_path)
    batch = next(src.batches("train", 2, seed=0))
    assert int(batch["input_ids"].max()) < src.min_vocab_size == len(tok)
    assert src.bytes_per_token("train") > 1.5  # merges compress


def test_task_batches_carry_labels_positions_and_groups():
    src = get_source("mqar:cpu", None, 64)
    assert src.is_synthetic and src.min_vocab_size == 1024 and src.seq_len == 64
    assert list(src.train_texts()) == [] and src.bytes_per_token("validation") is None
    batch = next(src.batches("train", 16, seed=0))
    assert set(batch) == {"input_ids", "labels", "retrieval_positions"}
    pos = batch["retrieval_positions"]
    assert pos.shape == (16, 4)
    scored = batch["labels"] != -100
    assert torch.equal(scored.nonzero()[:, 1].view(16, 4) - 1, pos)  # target of the prediction at p sits at p+1
    keys = batch["input_ids"].gather(1, pos)
    values = batch["labels"].gather(1, pos + 1)
    for row, k, v in zip(batch["input_ids"], keys, values):
        pairs = dict(zip(row[0:8:2].tolist(), row[1:8:2].tolist()))
        assert [pairs[int(x)] for x in k] == v.tolist()
    ev = next(src.eval_batches("test", 8))
    assert ev["group"].tolist() == [64] * 8
    assert src.leakage["test"] <= 0.001


def test_t7_retrieval_positions_are_one_per_row():
    src = get_source("t7:cpu,n_train=64,n_test=16", None, 128)
    batch = next(src.batches("train", 8, seed=0))
    pos = batch["retrieval_positions"]
    assert pos.shape == (8,)
    assert torch.equal((batch["labels"] != -100).nonzero()[:, 1], pos + 1)
    assert next(src.eval_batches("validation", 4))["group"].tolist() == [96] * 4


def test_batches_train_real_models():
    """A text batch and a task batch drive a Lumen forward/backward with a finite loss."""
    family = get_family("lumen")
    for src in (task_source(), get_source("t7:cpu,n_train=16,n_test=8", None, 128)):
        cfg = family.make_config("lumen-tiny", vocab_size=src.min_vocab_size, max_seq_len=src.seq_len)
        model = family.model_class(cfg)
        batch = next(src.batches("train", 4, seed=0))
        out = model(input_ids=batch["input_ids"], labels=batch["labels"], use_cache=False)
        assert torch.isfinite(out.loss)
        out.loss.backward()
    assert slmlab.__version__


@pytest.mark.parametrize(
    "call, match",
    [
        (lambda s: next(s.batches("train", 0, seed=0)), "batch_size must be a positive integer"),
        (lambda s: next(s.batches("train", 2, seed=0, rank=2, world_size=2)), r"rank must be in \[0, world_size=2\)"),
        (lambda s: next(s.batches("train", 2, seed=0, step=-1)), "step must be >= 0"),
        (lambda s: next(s.batches("tests", 2, seed=0)), "unknown split 'tests'"),
        (lambda s: next(s.eval_batches("validation", 2, max_batches=-1)), "max_batches must be >= 0"),
        (lambda s: s.bytes_per_token("dev"), "unknown split 'dev'"),
    ],
)
def test_bad_arguments_are_clear_errors(text_source, call, match):
    with pytest.raises(ValueError, match=match):
        call(text_source)


def test_get_source_errors(tmp_path, corpus):
    with pytest.raises(ValueError, match="nor an existing file or folder"):
        get_source(str(tmp_path / "nope"), None, 32)
    with pytest.raises(ValueError, match="errors must be one of"):
        get_source(corpus, None, 32, errors="ignore")
    with pytest.raises(ValueError, match="T=64 tokens > block_size=32"):
        get_source("mqar:cpu", None, 32)
    with pytest.raises(ValueError, match="block_size must be an integer >= 2"):
        get_source(corpus, None, 1)
    tiny = tmp_path / "tiny.txt"
    tiny.write_text("short line\n" * 20)
    with pytest.raises(ValueError, match="the validation split has .* tokens, fewer than the 64 needed"):
        _ = get_source(str(tiny), get_tokenizer("byte"), 64, cache_dir=tmp_path).streams


def test_dataloader_benchmark_runs(corpus, tmp_path):
    """The benchmark script stays runnable (tiny settings; its numbers are not asserted)."""
    import importlib.util
    from pathlib import Path

    path = Path(__file__).resolve().parents[2] / "benchmarks" / "bench_dataloader.py"
    spec = importlib.util.spec_from_file_location("bench_dataloader", path)
    bench = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(bench)
    args = ["--data", corpus, "--block-size", "32", "--batch-size", "2", "--steps", "2", "--rounds", "2", "--device", "cpu",
            "--cache", str(tmp_path / "c"), "--threads", str(torch.get_num_threads())]
    result = bench.main(args)
    assert result["train_tokens_per_s_loader"] > 0 and result["train_tokens_per_s_prebuilt"] > 0
    assert 0 <= result["loader_wait_share"] < 1


def test_leakage_counts_rows_shared_with_train():
    from slmlab.data.sources import TaskSource

    train = np.arange(12, dtype=np.uint16).reshape(4, 3)
    other = np.stack([train[1], train[3], np.array([99, 98, 97], dtype=np.uint16)])
    assert TaskSource._overlap(train, other) == pytest.approx(2 / 3)
