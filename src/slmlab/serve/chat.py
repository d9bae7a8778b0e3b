"""The plain chat template for base models.

slmlab's models are base language models with no chat format of their own, so
``/v1/chat/completions`` renders the conversation as role-prefixed turns, one per line block, and
asks the model to continue after ``Assistant:``::

    System: You are terse.
    User: Hello!
    Assistant: Hi.
    User: What is 2+2?
    Assistant:

Each turn is ``<Role>: <content>`` followed by a newline (``developer`` turns are rendered as
``System``). The completion stops at the model's end-of-text token or when the model starts the
next user turn (the stop string ``"\\nUser:"``, never part of the returned text), besides the
request's own ``stop`` strings and ``max_tokens``. A model fine-tuned on this layout answers in it;
a base model trained on plain text simply continues the transcript.
"""

from __future__ import annotations

ROLE_NAMES = {"system": "System", "developer": "System", "user": "User", "assistant": "Assistant"}
ASSISTANT_PREFIX = "Assistant:"
TURN_STOP = "\nUser:"


def render_chat(messages: list[dict]) -> str:
    """``[{"role", "content"}]`` -> the prompt text: every turn as ``Role: content\\n``, then ``Assistant:``."""
    lines = [f"{ROLE_NAMES[m['role']]}: {m['content']}\n" for m in messages]
    return "".join(lines) + ASSISTANT_PREFIX


def chat_stops(stop: list[str]) -> list[str]:
    """The request's stop strings plus the start of a new user turn."""
    return list(stop) + ([TURN_STOP] if TURN_STOP not in stop else [])
