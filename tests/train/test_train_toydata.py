"""A tiny in-memory DataSource honouring the slmlab.data contract, for trainer tests that must not
depend on a corpus; plus tests that it keeps the contract (exact resume, rank sharding)."""

from __future__ import annotations

import torch


class ToySource:
    """Learnable generated token streams: ``x[t+1] = (a * x[t] + c) % V`` with a per-row start and
    per-row ``c`` (so the model must infer it), plus 10% random tokens.

    ``synthetic=True`` scores only the second half of each row (like a task) and supplies ``group``
    (row parity) and ``retrieval_positions`` in its batches.
    """

    def __init__(self, vocab: int = 61, seq_len: int = 32, synthetic: bool = False, n_eval: int = 24) -> None:
        self.name = "toy"
        self.vocab, self.seq_len, self.is_synthetic = vocab, seq_len, synthetic
        self.min_vocab_size = vocab
        self.n_eval = n_eval

    def train_texts(self):
        return iter(())

    def _rows(self, n: int, gen: torch.Generator) -> dict:
        start = torch.randint(0, self.vocab, (n, 1), generator=gen)
        c = torch.randint(1, 7, (n, 1), generator=gen)
        t = torch.arange(self.seq_len)
        ids = (start + c * t) % self.vocab
        noise = torch.rand(n, self.seq_len, generator=gen) < 0.1
        ids = torch.where(noise, torch.randint(0, self.vocab, (n, self.seq_len), generator=gen), ids)
        labels = ids.clone()
        batch = {"input_ids": ids, "labels": labels}
        if self.is_synthetic:
            labels[:, : self.seq_len // 2] = -100
            batch["retrieval_positions"] = torch.full((n,), self.seq_len - 2)
        return batch

    def batches(self, split: str, batch_size: int, *, seed: int, step: int = 0, rank: int = 0, world_size: int = 1):
        while True:
            gen = torch.Generator().manual_seed(seed * 1_000_003 + step)
            full = self._rows(batch_size * world_size, gen)
            yield {k: v[rank * batch_size : (rank + 1) * batch_size] for k, v in full.items()}
            step += 1

    def eval_batches(self, split: str, batch_size: int, max_batches: int | None = None):
        gen = torch.Generator().manual_seed(12345 if split == "validation" else 54321)
        rows = self._rows(self.n_eval, gen)
        if self.is_synthetic:
            rows["group"] = torch.arange(self.n_eval) % 2
        for i, lo in enumerate(range(0, self.n_eval, batch_size)):
            if max_batches is not None and i >= max_batches:
                return
            yield {k: v[lo : lo + batch_size] for k, v in rows.items()}

    def bytes_per_token(self, split: str):
        return None if self.is_synthetic else 1.5


def test_toy_source_resumes_exactly_and_shards_by_rank():
    src = ToySource()
    full = src.batches("train", 4, seed=3)
    first = [next(full) for _ in range(5)]
    resumed = next(src.batches("train", 4, seed=3, step=3))
    assert torch.equal(resumed["input_ids"], first[3]["input_ids"])
    r0 = next(src.batches("train", 2, seed=3, rank=0, world_size=2))
    r1 = next(src.batches("train", 2, seed=3, rank=1, world_size=2))
    assert torch.equal(torch.cat([r0["input_ids"], r1["input_ids"]]), first[0]["input_ids"])


def test_toy_source_eval_is_deterministic_and_finite():
    src = ToySource(synthetic=True)
    a = list(src.eval_batches("validation", 8))
    b = list(src.eval_batches("validation", 8, max_batches=2))
    assert len(a) == 3 and len(b) == 2
    assert torch.equal(a[0]["input_ids"], b[0]["input_ids"])
    assert (a[0]["labels"][:, : src.seq_len // 2] == -100).all()
