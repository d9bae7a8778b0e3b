"""Regression: a NeoLLM trained with the automatic local-attention window (``iha_sliding_window=None``)
is saved with the window it was trained with, and decodes the trained function.

Before the fix the checkpoint said ``None`` and generation froze ``W = max(1, T_prompt // (2P²))``
from the prompt (``W = 1`` for a 3-token prompt), a different function from the one trained."""

from __future__ import annotations

import json
import logging

import pytest
import torch
from transformers import AutoModelForCausalLM

from slmlab import cli
from slmlab.models.neollm import PRESETS, NeoLLMConfig, NeoLLMForCausalLM

ATOL = 1e-5
BLOCK = 32  # training length: W = max(1, 32 // (2·2²)) = 4


@pytest.fixture(scope="module")
def trained(tmp_path_factory):
    """`slmlab train --model neollm:neollm-tiny ... iha_sliding_window=null` for 2 steps."""
    root = tmp_path_factory.mktemp("window")
    corpus = root / "corpus"
    corpus.mkdir()
    text = "To be, or not to be, that is the question. Whether 'tis nobler in the mind to suffer.\n"
    for i in range(3):
        (corpus / f"part{i}.txt").write_text(text * (30 + 10 * i), encoding="utf-8")
    out = root / "run"
    args = [
        "train", "--model", "neollm:neollm-tiny", "--data", str(corpus), "--out", str(out), "--steps", "2",
        "batch_size=2", f"block_size={BLOCK}", "vocab_size=300", "eval_batches=1", "eval_every=0",
        "checkpoint_every=0", "progress=false", "tensorboard=false", f"data_cache={root / 'cache'}",
        "sample_tokens=2", "model_config.iha_sliding_window=null",
    ]
    assert cli.main(args) == 0
    (ckpt,) = sorted((out / "checkpoints").glob("step_*"))
    return ckpt


def test_training_writes_the_resolved_window_into_the_checkpoint(trained):
    saved = json.loads((trained / "config.json").read_text())
    assert saved["iha_sliding_window"] == 4 and isinstance(saved["iha_sliding_window"], int)


def test_greedy_decode_from_a_short_prompt_equals_the_full_forward(trained, caplog):
    model = AutoModelForCausalLM.from_pretrained(trained).eval()
    ids = torch.tensor([[5, 17, 42]])
    steps = []
    with torch.no_grad(), caplog.at_level(logging.WARNING):
        out = model(input_ids=ids, use_cache=True)
        cache, logits = out.cache, out.logits[:, -1]
        steps.append(logits)
        for _ in range(BLOCK - ids.shape[1]):  # reach the training length, where W matters
            ids = torch.cat((ids, logits.argmax(-1, keepdim=True)), dim=1)
            out = model(input_ids=ids[:, -1:], cache=cache, use_cache=True)
            cache, logits = out.cache, out.logits[:, -1]
            steps.append(logits)
        full = model(input_ids=ids, use_cache=False).logits[0, 2:]
    torch.testing.assert_close(torch.cat(steps)[: full.shape[0]], full, atol=ATOL, rtol=0)
    assert "froze their window" not in caplog.text


def test_prepare_for_training_hook_sets_config_and_modules_once(caplog):
    torch.manual_seed(0)
    model = NeoLLMForCausalLM(NeoLLMConfig(**{**PRESETS["neollm-tiny"], "iha_sliding_window": None}))
    with caplog.at_level(logging.INFO):
        model.prepare_for_training(64)  # W = 64 // 8
        model.prepare_for_training(64)  # already resolved: nothing to do, nothing logged
    assert model.config.iha_sliding_window == 8
    assert all(layer.self_attn.core.window == 8 for layer in model.model.layers)
    assert caplog.text.count("iha_sliding_window") == 1
    fixed = NeoLLMForCausalLM(NeoLLMConfig(**PRESETS["neollm-tiny"]))
    fixed.prepare_for_training(64)
    assert fixed.config.iha_sliding_window == 4  # an explicit window is never overwritten


def test_a_window_frozen_from_a_prefill_warns_once_naming_it(caplog):
    torch.manual_seed(0)
    model = NeoLLMForCausalLM(NeoLLMConfig(**{**PRESETS["neollm-tiny"], "iha_sliding_window": None})).eval()
    model.model.spelling_bee.set_byte_table_from_bytes([bytes([t % 256]) for t in range(300)])
    ids = torch.tensor([[5, 17, 42]])
    with torch.no_grad(), caplog.at_level(logging.WARNING):
        out = model(input_ids=ids, use_cache=True)
        model(input_ids=ids[:, :1], cache=out.cache, use_cache=True)
        model(input_ids=ids, use_cache=True)  # a second prefill: no second warning
    warnings = [r for r in caplog.records if "froze their window" in r.getMessage()]
    assert len(warnings) == 1
    assert "W=1" in warnings[0].getMessage() and "iha_sliding_window" in warnings[0].getMessage()
