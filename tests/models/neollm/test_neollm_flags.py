"""NeoLLM flag combinations, generated: every row of the seeded all-pairs cover of
``tests/models/neollm/neollm_flags.py`` builds, takes one AdamW step with a finite loss and a gradient to every
parameter, and decodes == prefill on a left-padded batch (fp32, 1e-5)."""

from __future__ import annotations

import re

import pytest
import torch

from family_tester import decode_stepwise, left_pad
from neollm_flags import (
    BASE,
    CONSTRAINTS,
    FLAGS,
    HAND_PICKED,
    NEVER_GRAD,
    ZERO_GRAD_AT_INIT,
    all_pairs_rows,
    is_valid,
    pairs_of,
    required_pairs,
)
from slmlab.models.neollm import NeoLLMConfig, NeoLLMForCausalLM

ATOL = 1e-5
ROWS = all_pairs_rows(seed=0)
T = 12  # training length; an automatic window resolves to max(1, T // (2P²)) through the training hook


def build(row: dict) -> NeoLLMForCausalLM:
    torch.manual_seed(0)
    model = NeoLLMForCausalLM(NeoLLMConfig(**{**BASE, **row}))
    if model.config.use_spelling_bee_embeddings:
        vocab = model.config.vocab_size
        model.model.spelling_bee.set_byte_table_from_bytes([bytes((t * 7 + i) % 256 for i in range(t % 5)) for t in range(vocab)])
    model.prepare_for_training(T)  # what `slmlab train` does
    return model


def test_rows_cover_every_pair_and_respect_the_constraints():
    covered = set().union(*(pairs_of(row) for _, row in ROWS))
    assert required_pairs() <= covered
    assert all(is_valid(row) for _, row in ROWS), [c for c, _ in CONSTRAINTS]
    assert {name for name, _ in ROWS} >= set(HAND_PICKED)
    for flag in ("tie_word_embeddings", "attention_bias"):
        assert any(row[flag] for _, row in ROWS), flag
    assert all(set(row) == set(FLAGS) for _, row in ROWS)


@pytest.mark.parametrize("name, row", ROWS, ids=[name for name, _ in ROWS])
def test_row_trains_one_step_and_decodes_like_prefill(name, row):
    model = build(row)
    g = torch.Generator().manual_seed(1)
    ids = torch.randint(1, model.config.vocab_size, (2, T), generator=g)
    with torch.inference_mode():  # tables cached on first use under inference_mode must still train afterwards
        model(input_ids=ids)
    model.train()
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    loss = model(input_ids=ids, labels=ids).loss
    assert torch.isfinite(loss), name
    loss.backward()
    silent = [n for n, p in model.named_parameters() if p.grad is None or not torch.any(p.grad != 0)]
    assert all(re.search(ZERO_GRAD_AT_INIT, n) for n in silent), f"{name}: no gradient for {silent}"
    opt.step()
    if silent:  # zero-init partners have moved: now every parameter but the provably dead ones gets one
        opt.zero_grad()
        model(input_ids=ids, labels=ids).loss.backward()
        silent = [n for n, p in model.named_parameters() if p.grad is None or not torch.any(p.grad != 0)]
        assert all(re.search(NEVER_GRAD, n) for n in silent), f"{name}: no gradient after a step for {silent}"
    model.eval()
    rows = [torch.randint(1, model.config.vocab_size, (n,), generator=g) for n in (9, 6)]
    ids, mask = left_pad(rows)
    with torch.no_grad():
        full = model(input_ids=ids, attention_mask=mask, use_cache=False).logits
        step = decode_stepwise(model, ids, mask, prefill=5)
        alone = model(input_ids=rows[1][None], use_cache=False).logits[0]
    real = mask.bool()
    torch.testing.assert_close(step[real], full[real], atol=ATOL, rtol=0)
    torch.testing.assert_close(full[1, -6:], alone, atol=ATOL, rtol=0)
