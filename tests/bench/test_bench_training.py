"""The training-side pieces of the bench: loss at scored positions only, fresh data per step,
``train_on``, ``keep_best``."""

from __future__ import annotations

import pytest
import torch

from slmlab.data.sources import TaskSource
from slmlab.data.tasks import parse_task_spec
from slmlab.models.lumen import LumenConfig, LumenForCausalLM

TINY = dict(vocab_size=256, hidden_dim=32, num_layers=2, num_heads=4, num_kv_heads=2, intermediate_dim=48, max_seq_len=64)


@pytest.mark.parametrize("num_items", [None, 7])
def test_scored_only_loss_and_gradients_equal_the_full_logit_path(num_items):
    torch.manual_seed(0)
    model = LumenForCausalLM(LumenConfig(**TINY))
    batch = next(TaskSource("mqar", parse_task_spec("mqar:cpu,V=256,N=8,n_train=64,n_test=8")).batches("train", 6, seed=0))
    grads, losses = [], []
    for scored_only in (False, True):
        model.zero_grad()
        out = model(input_ids=batch["input_ids"], labels=batch["labels"], scored_only=scored_only, num_items_in_batch=num_items)
        out.loss.backward()
        grads.append({n: p.grad.clone() for n, p in model.named_parameters()})
        losses.append(out.loss.detach())
    assert out.logits.shape == (6 * 8, 256)  # scored_only: one row per scored prediction
    torch.testing.assert_close(losses[1], losses[0], atol=1e-6, rtol=0)
    for name in grads[0]:
        torch.testing.assert_close(grads[1][name], grads[0][name], atol=1e-6, rtol=0, msg=name)


def test_fresh_source_is_a_function_of_step_and_rank():
    task = parse_task_spec("t4:cpu,n_train=64,n_test=16")
    source = TaskSource("t4:cpu", task, seed=3)
    assert source.fresh  # the induction task defaults to fresh data per step
    stream = source.batches("train", 8, seed=0)
    first = [next(stream) for _ in range(5)]
    resumed = next(source.batches("train", 8, seed=0, step=3))
    for key in ("input_ids", "labels", "retrieval_positions"):
        assert torch.equal(resumed[key], first[3][key])
    assert not torch.equal(first[0]["input_ids"], first[1]["input_ids"])
    other = next(TaskSource("t4:cpu", task, seed=3).batches("train", 8, seed=0, step=3, rank=1, world_size=2))
    rows = {r.numpy().tobytes() for r in resumed["input_ids"]}
    assert not rows & {r.numpy().tobytes() for r in other["input_ids"]}  # ranks draw disjoint rows
    assert not torch.equal(next(TaskSource("t4:cpu", task, seed=4).batches("train", 8, seed=0))["input_ids"], first[0]["input_ids"])
    # validation and test stay fixed sets
    v1, v2 = next(source.eval_batches("test", 16)), next(TaskSource("t4:cpu", task, seed=3).eval_batches("test", 16))
    assert torch.equal(v1["input_ids"], v2["input_ids"])
    fixed = TaskSource("t4:cpu", task, seed=3, fresh=False)
    assert not fixed.fresh and next(fixed.batches("train", 8, seed=0))["input_ids"].shape == (8, 64)


def test_train_on_all_gives_full_lm_labels_for_training_only():
    task = parse_task_spec("ar:cpu,layout=single,T=32,n_train=32,n_test=8")
    source = TaskSource("ar", task, train_on="all")
    train = next(source.batches("train", 4, seed=0))
    assert torch.equal(train["labels"], train["input_ids"])
    test = next(source.eval_batches("test", 4))
    assert ((test["labels"] != -100).sum(1) == 1).all()
    with pytest.raises(ValueError, match="train_on must be one of"):
        TaskSource("ar", task, train_on="some")



def test_run_config_train_on_reaches_the_source_and_the_trainer(tmp_path):
    from slmlab.train.config import load_config
    from slmlab.train.run import open_source
    from slmlab.train.trainer import Trainer

    for train_on, full in (("all", True), ("scored", False)):
        cfg = load_config(overrides=[f"train_on={train_on}", "data=ar:cpu,layout=single,T=32,n_train=32,n_test=8", "device=cpu",
                                     f"out_dir={tmp_path / train_on}"])
        source = open_source(cfg, None)
        batch = next(source.batches("train", 4, seed=0))
        assert torch.equal(batch["labels"], batch["input_ids"]) == full
        trainer = Trainer(cfg, LumenForCausalLM(LumenConfig(**TINY)), source, run_dir=tmp_path / train_on)
        assert trainer.scored_only == (not full)
    with pytest.raises(ValueError, match="train_on must be 'scored' or 'all'"):
        load_config(overrides=["train_on=half"])
