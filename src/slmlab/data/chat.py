"""Chat templates: how a conversation becomes token ids, and which of them are the assistant's.

A model's chat format is a Jinja template stored with its tokenizer (``tokenizer.chat_template``,
transformers' convention: ``tokenizer.save_pretrained`` writes it, ``apply_chat_template`` renders it).
A model without one gets :data:`DEFAULT_CHAT_TEMPLATE`, the plain role-prefixed layout slmlab's
``/v1/chat/completions`` has always used::

    System: You are terse.
    User: What is 2+2?
    Assistant: 4
    User: And 3+3?
    Assistant:

Every turn is ``<Role>: <content>`` and a newline (``developer`` renders as ``System``); the generation
prompt is ``Assistant:``. The assistant's part of each of its turns (`` <content>\\n``, after the
``Assistant:`` tag) sits inside ``{% generation %}`` blocks, so transformers'
``apply_chat_template(..., return_assistant_tokens_mask=True)`` marks exactly the tokens a fine-tune
is scored on. A training row is the rendered conversation followed by the tokenizer's end-of-text
token (scored too, so the model learns to stop); every other token gets the label ``-100``.
"""

from __future__ import annotations

import re
from collections.abc import Sequence

ROLES = ("system", "developer", "user", "assistant")

DEFAULT_CHAT_TEMPLATE = (
    "{%- set names = {'system': 'System', 'developer': 'System', 'user': 'User'} -%}"
    "{%- for message in messages -%}"
    "{%- if message['role'] == 'assistant' -%}"
    "{{- 'Assistant:' -}}{%- generation -%}{{- ' ' + message['content'] + '\\n' -}}{%- endgeneration -%}"
    "{%- elif message['role'] in names -%}"
    "{{- names[message['role']] + ': ' + message['content'] + '\\n' -}}"
    "{%- else -%}"
    "{{- raise_exception('unknown chat role ' + message['role']) -}}"
    "{%- endif -%}"
    "{%- endfor -%}"
    "{%- if add_generation_prompt -%}{{- 'Assistant:' -}}{%- endif -%}"
)


def chat_template(tokenizer) -> str:
    """The template ``tokenizer`` renders conversations with: its own ``chat_template``, else the default."""
    own = getattr(tokenizer, "chat_template", None) if tokenizer is not None else None
    return own if isinstance(own, str) and own.strip() else DEFAULT_CHAT_TEMPLATE


def ensure_chat_template(tokenizer) -> str:
    """Give ``tokenizer`` the default template when it has none (saved with it from then on); returns
    the template it uses."""
    template = chat_template(tokenizer)
    tokenizer.chat_template = template
    return template


_GENERATION_TAG = re.compile(r"\{%-?\s*(?:end)?generation\s*-?%\}")


def plain_chat_template(tokenizer) -> str:
    """:func:`chat_template` without transformers' ``{% generation %}`` markers (which only mark the
    assistant's tokens for a fine-tune's labels and render nothing): the same text for readers that do
    not know the tag, such as llama.cpp's template engine (a GGUF file's ``tokenizer.chat_template``)."""
    return _GENERATION_TAG.sub("", chat_template(tokenizer))


def check_messages(messages, where: str = "messages") -> list[dict]:
    """``messages`` as a list of ``{"role", "content"}`` string dicts, or a ``ValueError`` naming ``where``."""
    if not isinstance(messages, list) or not messages:
        raise ValueError(f"{where}: 'messages' must be a non-empty list of {{\"role\", \"content\"}} objects")
    out = []
    for i, message in enumerate(messages):
        if not isinstance(message, dict):
            raise ValueError(f"{where}: messages[{i}] must be an object with 'role' and 'content', got {message!r:.60}")
        role, content = message.get("role"), message.get("content")
        if role not in ROLES:
            raise ValueError(f"{where}: messages[{i}].role must be one of {', '.join(ROLES)}, got {role!r:.40}")
        if not isinstance(content, str):
            raise ValueError(f"{where}: messages[{i}].content must be a string, got {type(content).__name__}")
        out.append({"role": role, "content": content})
    return out


def apply_template(tokenizer, messages: Sequence[dict], **kwargs):
    """``tokenizer.apply_chat_template`` with :func:`chat_template`; a template that fails to render (a
    syntax error, or an operation the Jinja sandbox blocks) is a ``ValueError`` saying where to fix it."""
    from jinja2 import TemplateError

    try:
        return tokenizer.apply_chat_template(list(messages), chat_template=chat_template(tokenizer), **kwargs)
    except TemplateError as err:
        raise ValueError(f"the tokenizer's chat template cannot be rendered ({type(err).__name__}: {err}); fix"
                         " chat_template in the model's tokenizer_config.json, or delete it to use slmlab's plain"
                         " template") from None


def render_chat_text(tokenizer, messages: Sequence[dict], add_generation_prompt: bool = True) -> str:
    """The conversation as text through ``tokenizer``'s template (:func:`chat_template`), ending with the
    generation prompt when ``add_generation_prompt``: what the model continues from."""
    return apply_template(tokenizer, messages, tokenize=False, add_generation_prompt=add_generation_prompt)


def render_plain(messages: Sequence[dict], add_generation_prompt: bool = True) -> str:
    """:data:`DEFAULT_CHAT_TEMPLATE` in Python (no tokenizer needed): every turn ``Role: content\\n``,
    then ``Assistant:``. Tests check both render the same text."""
    names = {"system": "System", "developer": "System", "user": "User", "assistant": "Assistant"}
    text = "".join(f"{names[m['role']]}: {m['content']}\n" for m in messages)
    return text + ("Assistant:" if add_generation_prompt else "")


def prompt_ids(tokenizer, messages: Sequence[dict]) -> list[int]:
    """Token ids of the conversation plus the generation prompt: what ``slmlab chat`` and the server feed."""
    return tokenizer(render_chat_text(tokenizer, messages), add_special_tokens=False)["input_ids"]


def encode_conversation(tokenizer, messages: Sequence[dict]) -> tuple[list[int], list[int]]:
    """``(ids, scored)`` of one training conversation: the template's ids (transformers'
    ``apply_chat_template``) then the end-of-text token, and 1 where the token is the assistant's (the
    template's ``{% generation %}`` blocks, and the final end-of-text), 0 elsewhere.

    Raises:
        ValueError: the conversation has no assistant turn, or the template marks no assistant tokens
            (a custom template without ``{% generation %}`` blocks).
    """
    if not any(m["role"] == "assistant" for m in messages):
        raise ValueError("the conversation has no assistant turn; nothing to learn from it: add one")
    out = apply_template(tokenizer, messages, tokenize=True, return_dict=True, return_assistant_tokens_mask=True,
                         add_generation_prompt=False)
    ids, scored = list(out["input_ids"]), [int(bool(x)) for x in out["assistant_masks"]]
    if not any(scored):
        raise ValueError("the chat template marks no assistant tokens; wrap each assistant turn of the tokenizer's"
                         " chat_template in {% generation %} ... {% endgeneration %}")
    eos = tokenizer.eos_token_id
    if eos is not None and (not ids or ids[-1] != eos):
        ids.append(int(eos))
        scored.append(1)
    return ids, scored


def fit_history(tokenizer, system: str | None, turns: list[dict], budget: int) -> tuple[list[int], int]:
    """The prompt ids of ``system`` (if any) + ``turns`` + the generation prompt, dropping the oldest turns
    (a user turn with the assistant's answer after it) until the prompt has at most ``budget`` tokens.

    Args:
        system: the system line, kept whatever is dropped (None: none).
        turns: the conversation so far, oldest first, ending with the new user turn; trimmed in place.
        budget: the most prompt tokens the model's context leaves for them.
    Returns:
        ``(ids, dropped)``: the prompt ids and how many messages were dropped from ``turns``.
    Raises:
        ValueError: even the newest user turn alone does not fit.
    """
    head = [{"role": "system", "content": system}] if system else []
    dropped = 0
    warned = getattr(tokenizer, "deprecation_warnings", {})  # a long prompt is trimmed here, not an error
    warned["sequence-length-is-longer-than-the-specified-maximum"] = True
    while True:
        ids = prompt_ids(tokenizer, head + turns)
        if len(ids) <= budget:
            return ids, dropped
        if len(turns) <= 1:
            raise ValueError(f"the message needs {len(ids)} tokens with the template, more than the {budget} the model's"
                             " context leaves; send a shorter one (or lower --max-tokens)")
        cut = 2 if len(turns) > 2 and turns[1]["role"] == "assistant" else 1
        del turns[:cut]
        dropped += cut
