"""Fitting a prompt into the context: what fits is kept, what is cut or capped is said, never silently."""

from __future__ import annotations

import pytest

from slmlab.generation.context import encode_prompt, fit_to_context


def test_a_prompt_that_fits_is_kept_without_notes():
    fitted = fit_to_context(list(range(5)), 10, 32, truncate=False, trained_context=32)
    assert (fitted.ids, fitted.new_tokens, fitted.notes) == (list(range(5)), 10, [])


def test_the_context_caps_new_tokens_with_a_note():
    fitted = fit_to_context(list(range(28)), 10, 32, truncate=False)
    assert fitted.new_tokens == 4 and fitted.ids == list(range(28))
    assert fitted.notes == ["note: --max-new-tokens 10 capped at 4 by the model's context of 32 positions (prompt: 28 tokens)"]


def test_a_full_prompt_is_refused_or_truncated_with_a_warning():
    with pytest.raises(ValueError, match="fills the model's context of 32 positions.*--truncate-prompt"):
        fit_to_context(list(range(40)), 8, 32, truncate=False)
    fitted = fit_to_context(list(range(40)), 8, 32, truncate=True)
    assert fitted.ids == list(range(16, 40)) and fitted.new_tokens == 8
    assert fitted.notes == ["warning: prompt left-truncated from 40 to its last 24 tokens (context 32)"]


def test_running_past_the_trained_context_is_noted():
    fitted = fit_to_context(list(range(20)), 10, None, truncate=False, trained_context=24)
    assert fitted.new_tokens == 10
    assert fitted.notes == ["note: 20 prompt + 10 new tokens run past the 24-token context the model was trained on; the"
                            " tokens beyond it may be poor"]


class Tokenizer:
    bos_token_id = 1

    def __call__(self, text, add_special_tokens=True):
        assert add_special_tokens is False
        return {"input_ids": [ord(c) for c in text]}


def test_an_empty_prompt_is_the_beginning_of_text_token():
    tok = Tokenizer()
    assert encode_prompt(tok, "ab") == [97, 98] and encode_prompt(tok, "") == [1]
    tok.bos_token_id = None
    assert encode_prompt(tok, "") == []
