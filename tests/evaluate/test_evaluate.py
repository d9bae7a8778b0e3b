"""Evaluation metrics on hand-built examples: which prediction is scored against which label."""

from __future__ import annotations

import math
from types import SimpleNamespace

import pytest
import torch

from slmlab.evaluate import bits_per_byte, evaluate_batches


class Oracle(torch.nn.Module):
    """Predicts ``table[input_id]`` at every position with probability ~1 (logit 30)."""

    def __init__(self, table: dict[int, int], vocab: int = 10) -> None:
        super().__init__()
        self.table, self.vocab = table, vocab
        self.seen_kwargs: list[set] = []

    def forward(self, input_ids, attention_mask=None, use_cache=False, **kw):
        self.seen_kwargs.append(set(kw))
        logits = torch.zeros(*input_ids.shape, self.vocab)
        for (b, t), tok in zip(torch.cartesian_prod(torch.arange(input_ids.shape[0]), torch.arange(input_ids.shape[1])).tolist(),
                               input_ids.flatten().tolist()):
            logits[b, t, self.table.get(tok, 0)] = 30.0
        return SimpleNamespace(logits=logits)


def test_prediction_at_p_is_scored_against_label_at_p_plus_1():
    # row 0: after token 3 the answer is 7; labels are aligned (transformers convention), so the
    # label 7 sits at the position AFTER the 3 and the prediction made at the 3 is the one scored.
    ids = torch.tensor([[1, 3, 7, 0], [1, 3, 5, 0]])
    labels = torch.tensor([[-100, -100, 7, -100], [-100, -100, 7, -100]])
    model = Oracle({3: 7})
    out = evaluate_batches(model, [{"input_ids": ids, "labels": labels, "group": torch.tensor([64, 128])}])
    assert out["tokens"] == 2 and out["token_acc"] == 1.0 and out["acc"] == 1.0 and out["exact"] == 1.0
    assert out["loss"] < 1e-6 and out["acc_by_group"] == {64: 1.0, 128: 1.0}
    # a model that answers one position late is wrong everywhere
    late = evaluate_batches(Oracle({7: 7}), [{"input_ids": ids, "labels": labels}])
    assert late["acc"] == 0.0 and late["loss"] > 10


def test_example_accuracy_is_zoology_mean_of_means():
    ids = torch.tensor([[2, 2, 2, 2], [2, 2, 2, 2]])
    labels = torch.tensor([[-100, 4, 4, 4], [-100, 4, 9, -100]])  # row 0: 3/3 right, row 1: 1/2 right
    out = evaluate_batches(Oracle({2: 4}), [{"input_ids": ids, "labels": labels}])
    assert out["acc"] == pytest.approx((1.0 + 0.5) / 2)
    assert out["token_acc"] == pytest.approx(4 / 5)
    assert out["exact"] == pytest.approx(0.5)
    assert out["ppl"] == pytest.approx(math.exp(out["loss"]))


def test_family_inputs_are_passed_only_when_listed():
    ids, labels = torch.tensor([[1, 3]]), torch.tensor([[-100, 7]])
    batch = {"input_ids": ids, "labels": labels, "retrieval_positions": torch.tensor([1])}
    model = Oracle({3: 7})
    evaluate_batches(model, [batch])
    evaluate_batches(model, [batch], forward_inputs=("retrieval_positions",))
    assert model.seen_kwargs == [set(), {"retrieval_positions"}]


def test_bits_per_byte_and_empty_evaluation():
    assert bits_per_byte(math.log(2) * 3.0, 1.5) == pytest.approx(2.0)
    assert bits_per_byte(1.0, None) is None
    with pytest.raises(ValueError, match="no scored positions"):
        evaluate_batches(Oracle({}), [{"input_ids": torch.tensor([[1, 2]]), "labels": torch.tensor([[-100, -100]])}])


def test_progress_hears_every_batch_with_its_tokens():
    """``slmlab eval`` draws its progress from this callback: batches done, the batch's tokens and seconds."""
    from slmlab.evaluate.lm import count_eval_batches, evaluate_source

    ids = torch.tensor([[1, 3, 7, 0]] * 5)
    heard = []

    class Source:
        def eval_batches(self, split, batch_size, max_batches=None):
            rows = range(0, 5, batch_size)
            for i, start in enumerate(rows):
                if max_batches is not None and i >= max_batches:
                    return
                part = ids[start:start + batch_size]
                yield {"input_ids": part, "labels": part.clone()}

        def bytes_per_token(self, split):
            return 2.0

    assert count_eval_batches(Source(), "validation", 2) == 3
    assert count_eval_batches(Source(), "validation", 2, max_batches=2) == 2
    out = evaluate_source(Oracle({3: 7}), Source(), "validation", 2, progress=lambda *a: heard.append(a))
    assert [(done, tokens) for done, tokens, _ in heard] == [(1, 8), (2, 8), (3, 4)]
    assert all(seconds >= 0 for *_, seconds in heard) and out["bits_per_byte"] > 0
