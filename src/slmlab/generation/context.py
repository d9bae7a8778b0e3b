"""A prompt for the model: its token ids, and those ids and the new tokens fitted into the context, never silently."""

from __future__ import annotations

from dataclasses import dataclass, field


def encode_prompt(tokenizer, text: str) -> list[int]:
    """``text`` as token ids (no special tokens added); an empty text is the tokenizer's
    beginning-of-text token when it has one (else no ids)."""
    ids = tokenizer(text, add_special_tokens=False)["input_ids"]
    return ids if ids or tokenizer.bos_token_id is None else [tokenizer.bos_token_id]


@dataclass
class FittedPrompt:
    """A prompt that fits: its ``ids``, the ``new_tokens`` to generate, and the ``notes`` a user should
    read (each ``"warning: ..."`` or ``"note: ..."``)."""

    ids: list[int]
    new_tokens: int
    notes: list[str] = field(default_factory=list)


def fit_to_context(ids: list[int], max_new_tokens: int, max_positions: int | None, truncate: bool,
                   trained_context: int | None = None) -> FittedPrompt:
    """The prompt ids and the number of new tokens that fit the model's context.

    A prompt that leaves no room for a new token is an error, unless ``truncate``: then its oldest
    tokens are dropped (keeping room for ``max_new_tokens``, at least one), with a warning. When the
    context caps ``max_new_tokens``, a note says so; so does one when prompt and new tokens run past
    ``trained_context`` (the sequence length the model was trained on, when recorded), where the
    model reads positions it never trained on.

    Raises:
        ValueError: the prompt fills the context and ``truncate`` is off.
    """
    fitted = FittedPrompt(ids, max_new_tokens)
    if max_positions is not None:
        _fit_positions(fitted, max_positions, truncate)
    n, new = len(fitted.ids), fitted.new_tokens
    if trained_context is not None and n + new > trained_context:
        fitted.notes.append(f"note: {n} prompt + {new} new tokens run past the {trained_context}-token context the model"
                            " was trained on; the tokens beyond it may be poor")
    return fitted


def _fit_positions(fitted: FittedPrompt, max_positions: int, truncate: bool) -> None:
    ids, max_new_tokens = fitted.ids, fitted.new_tokens
    if len(ids) >= max_positions and max_new_tokens > 0:
        if not truncate:
            raise ValueError(
                f"the prompt has {len(ids)} tokens and fills the model's context of {max_positions} positions, so nothing"
                " can be generated; shorten the prompt or pass --truncate-prompt to keep only its last tokens"
            )
        keep = max(1, max_positions - max_new_tokens)
        fitted.notes.append(f"warning: prompt left-truncated from {len(ids)} to its last {keep} tokens (context"
                            f" {max_positions})")
        ids = ids[-keep:]
    room = max_positions - len(ids)
    if max_new_tokens > room:
        fitted.notes.append(f"note: --max-new-tokens {max_new_tokens} capped at {max(room, 0)} by the model's context of"
                            f" {max_positions} positions (prompt: {len(ids)} tokens)")
    fitted.ids, fitted.new_tokens = ids, max(0, min(max_new_tokens, room))
