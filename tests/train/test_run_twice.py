"""Every training entry point, run twice with the same seed, writes the same weights bit for bit
(issue 46: a LoRA fine-tune's adapters were drawn from an unseeded generator and differed from step 2).

Each run happens in this process after the other, so a draw taken before the seed is set would see
the generator where the first run left it and differ."""

from __future__ import annotations

import json

import pytest
import torch
from safetensors.torch import load_file

from slmlab import cli
from slmlab.train.checkpoint import resolve_checkpoint
from tiny_runs import train_tiny_run

QUIET = ["progress=false", "tensorboard=false", "batch_size=2", "checkpoint_every=0", "sample_tokens=0"]


def weights(run) -> dict:
    ckpt = resolve_checkpoint(run)
    name = "adapter_model.safetensors" if (ckpt / "adapter_model.safetensors").is_file() else "model.safetensors"
    return load_file(str(ckpt / name))


def as_bytes(tensor: torch.Tensor) -> torch.Tensor:
    return tensor.contiguous().reshape(-1).view(torch.uint8)


def assert_same_weights(a, b) -> None:
    wa, wb = weights(a), weights(b)
    assert wa.keys() == wb.keys() and wa
    differ = [k for k in wa if not (wa[k].dtype == wb[k].dtype and wa[k].shape == wb[k].shape
                                    and torch.equal(as_bytes(wa[k]), as_bytes(wb[k])))]
    assert not differ, f"{len(differ)} tensors differ between the two runs, e.g. {differ[:3]}"


@pytest.fixture(scope="module")
def base(tmp_path_factory):
    from slmlab.data.chat_data import builtin_chat, write_chat_jsonl

    root = tmp_path_factory.mktemp("twice")
    return train_tiny_run(root, 128, "User: What is 2 + 2?\nAssistant: 4\n"), write_chat_jsonl(builtin_chat(30),
                                                                                              root / "chat.jsonl")


def test_train_twice_is_bit_identical(tmp_path):
    runs = []
    for name in ("a", "b"):
        (tmp_path / name).mkdir()
        runs.append(train_tiny_run(tmp_path / name, 32, "to be or not to be, that is the question. ", steps=3))
    assert_same_weights(*runs)


@pytest.mark.parametrize("lora", [None, "r=2,alpha=4,dropout=0.1"], ids=["full", "lora"])
def test_finetune_twice_is_bit_identical(base, tmp_path, lora):
    run, chat = base
    extra = [] if lora is None else ["--lora", lora]
    for name in ("a", "b"):
        assert cli.main(["finetune", str(run), "--data", str(chat), "--out", str(tmp_path / name), "--steps", "3",
                         *extra, *QUIET]) == 0
    assert_same_weights(tmp_path / "a", tmp_path / "b")
    losses = [[r["loss"] for r in map(json.loads, (tmp_path / n / "metrics.jsonl").read_text().splitlines())
               if r.get("kind") == "train"] for n in ("a", "b")]
    assert losses[0] == losses[1] and len(losses[0]) >= 1


def test_transactions_pretrain_and_finetune_twice_are_bit_identical(tmp_path):
    pytest.importorskip("pandas")
    pytest.importorskip("sklearn")
    bank = tmp_path / "bank"
    assert cli.main(["transactions", "generate", "--preset", "tiny", "--seed", "5", "--out", str(bank),
                     "n_customers=40", "n_days=30", "n_physical_merchants=300", "n_online_merchants=100"]) == 0
    common = ["--data", str(bank), "--threads", "1", "--device", "cpu"]
    steps = ["max_steps=2", "batch_size=8", "progress=false"]
    for name in ("a", "b"):
        assert cli.main(["transactions", "pretrain", *common, "--out", str(tmp_path / f"pre-{name}"), *steps]) == 0
        assert cli.main(["transactions", "finetune", *common, "--encoder", str(tmp_path / f"pre-{name}"), "--out",
                         str(tmp_path / f"ft-{name}"), *steps]) == 0
    assert_same_weights(tmp_path / "pre-a", tmp_path / "pre-b")
    assert_same_weights(tmp_path / "ft-a", tmp_path / "ft-b")
