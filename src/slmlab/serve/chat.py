"""How ``/v1/chat/completions`` turns messages into a prompt: the tokenizer's chat template.

The conversation is rendered with the served tokenizer's ``chat_template`` (transformers'
``apply_chat_template``; :mod:`slmlab.data.chat`), the same template ``slmlab finetune`` trained on
and ``slmlab chat`` uses. A tokenizer without one (a base model) gets slmlab's plain template, which
renders the conversation as role-prefixed turns, one per line block, and asks the model to continue
after ``Assistant:``::

    System: You are terse.
    User: Hello!
    Assistant: Hi.
    User: What is 2+2?
    Assistant:

Each turn is ``<Role>: <content>`` followed by a newline (``developer`` turns are rendered as
``System``). The completion stops at the model's end-of-text token or when the model starts the
next user turn (the stop string ``"\\nUser:"``, :data:`slmlab.generation.chat.TURN_STOP`, never part
of the returned text), besides the request's own ``stop`` strings and ``max_tokens``. A model
fine-tuned on this layout answers in it; a base model trained on plain text simply continues the
transcript.
"""

from __future__ import annotations


def render_chat(messages: list[dict], tokenizer=None) -> str:
    """``[{"role", "content"}]`` -> the prompt text through ``tokenizer``'s chat template (the plain one
    when it has none, or without a tokenizer: every turn as ``Role: content\\n``, then ``Assistant:``)."""
    from ..data.chat import render_chat_text, render_plain

    return render_plain(messages) if tokenizer is None else render_chat_text(tokenizer, messages)
