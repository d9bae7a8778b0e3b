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


# -- the automatic window is taken from each row's real length ----------------------------------
ROW_OPTIONS = {
    "plain": {},
    "lucid": {"use_lucid_attention": True},
    "affine": {"use_affine_scaled_attention": True},
}


def automatic_window_model(**overrides) -> NeoLLMForCausalLM:
    torch.manual_seed(0)
    config = NeoLLMConfig(
        **{**PRESETS["neollm-tiny"], "use_spelling_bee_embeddings": False, "iha_sliding_window": None, **overrides}
    )
    return NeoLLMForCausalLM(config).eval()


def padded_batch(row: torch.Tensor, other: torch.Tensor, pads: int) -> tuple[torch.Tensor, torch.Tensor]:
    """``row`` behind ``pads`` left pads, stacked over ``other`` (``len(other) == pads + len(row)``)."""
    ids = torch.stack((torch.cat((torch.zeros(pads, dtype=torch.long), row)), other))
    mask = torch.ones_like(ids)
    mask[0, :pads] = 0
    return ids, mask


@pytest.mark.parametrize("option", sorted(ROW_OPTIONS))
def test_a_left_padded_row_equals_the_row_alone_in_forward(option):
    """9 pads before 17 tokens: the row's window is max(1, 17 // 8) = 2 in the batch as alone (the
    padded length 26 would give 3); the other row (26 real tokens) keeps its own W = 3."""
    model = automatic_window_model(**ROW_OPTIONS[option])
    g = torch.Generator().manual_seed(1)
    row, other = torch.randint(1, 300, (17,), generator=g), torch.randint(1, 300, (26,), generator=g)
    ids, mask = padded_batch(row, other, 9)
    with torch.no_grad():
        batch = model(ids, attention_mask=mask).logits
        torch.testing.assert_close(batch[0, 9:], model(row[None]).logits[0], atol=ATOL, rtol=0)
        torch.testing.assert_close(batch[1], model(other[None]).logits[0], atol=ATOL, rtol=0)


@pytest.mark.parametrize("option", sorted(ROW_OPTIONS))
def test_a_left_padded_row_decodes_as_the_row_alone(option):
    """Prefill a 17-token prompt behind 9 pads (W frozen per row: 2 and 3), then feed 6 tokens one at
    a time: every step's logits equal the row decoded alone (its W frozen from its own 17 tokens)."""
    model = automatic_window_model(**ROW_OPTIONS[option])
    g = torch.Generator().manual_seed(2)
    row, other = torch.randint(1, 300, (23,), generator=g), torch.randint(1, 300, (32,), generator=g)
    ids, mask = padded_batch(row, other, 9)

    def stepwise(ids, mask, prefill):
        with torch.no_grad():
            out = model(ids[:, :prefill], attention_mask=None if mask is None else mask[:, :prefill], use_cache=True)
            logits, cache = [out.logits], out.cache
            for t in range(prefill, ids.shape[1]):
                step_mask = None if mask is None else mask[:, : t + 1]
                out = model(ids[:, t : t + 1], attention_mask=step_mask, cache=cache, use_cache=True)
                logits.append(out.logits)
        return torch.cat(logits, dim=1), cache

    batch, cache = stepwise(ids, mask, 9 + 17)
    alone, alone_cache = stepwise(row[None], None, 17)
    local = [s.window for s in cache if getattr(s, "window", None) is not None]
    assert local and all(w.tolist() == [2, 3] for w in local)
    assert {s.window for s in alone_cache if getattr(s, "window", None) is not None} == {2}
    torch.testing.assert_close(batch[0, 9:], alone[0], atol=ATOL, rtol=0)
