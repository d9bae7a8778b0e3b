"""Request parsing and validation: a JSON body -> a :class:`GenerationRequest`, or an :class:`APIError`.

The body is read as bytes and checked here, field by field, so that every bad input gets the OpenAI
error format and the status OpenAI uses (400 for a bad request, 404 for an unknown model), naming
the field; no validation framework's own error shape ever reaches a client.

Accepted (both endpoints): ``model``, ``max_tokens``, ``temperature``, ``top_p``, ``top_k`` (an
extension), ``stop`` (a string or up to 4 strings), ``seed``, ``n`` (1 only), ``stream``,
``stream_options.include_usage``, ``user`` (ignored), ``presence_penalty`` / ``frequency_penalty``
(0 only). ``/v1/completions`` takes ``prompt`` (a string, or token ids); ``/v1/chat/completions``
takes ``messages`` and ``max_completion_tokens`` as another name of ``max_tokens``. Anything else
(``logprobs``, ``tools``, ``n`` > 1, ``echo``, ``best_of``, ``suffix``, ...) is refused by name.
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass, field

from .errors import APIError, bad_request

MAX_STOP_STRINGS = 4

_COMMON = {"model", "max_tokens", "temperature", "top_p", "top_k", "stop", "seed", "n", "stream", "stream_options",
           "user", "presence_penalty", "frequency_penalty"}
COMPLETION_FIELDS = _COMMON | {"prompt", "logprobs", "echo", "best_of", "suffix", "logit_bias"}
CHAT_FIELDS = _COMMON | {"messages", "max_completion_tokens", "logprobs", "top_logprobs", "logit_bias", "tools",
                         "tool_choice", "functions", "function_call", "parallel_tool_calls", "response_format"}
# Fields clients send with a harmless default; any other value is refused by name.
_DEFAULTS_ONLY = {
    "logprobs": (None, False), "top_logprobs": (None, 0), "echo": (None, False), "best_of": (None, 1),
    "suffix": (None, ""), "logit_bias": (None, {}), "tools": (None, []), "tool_choice": (None, "none"),
    "functions": (None, []), "function_call": (None, "none"), "parallel_tool_calls": (None, False),
    "presence_penalty": (None, 0, 0.0), "frequency_penalty": (None, 0, 0.0),
}


@dataclass
class GenerationRequest:
    """One validated request, before tokenization.

    Args:
        kind: ``"completion"`` or ``"chat"``.
        prompt: the prompt text, or None when ``prompt_ids`` were given.
        prompt_ids: token ids given directly (``/v1/completions`` only), or None.
        messages: the chat turns ``[{"role", "content"}]`` (chat only).
        max_tokens: the most new tokens, or None for the default (16 for completions, the rest of
            the context for chat).
        temperature / top_p / top_k: sampling; temperature 0 is greedy.
        stop: strings that end the completion (not included in the text).
        seed: seeds the request's own random generator (None: a fresh random seed).
        stream: answer as server-sent events.
        include_usage: with ``stream``, send a last chunk holding ``usage``.
    """

    kind: str
    model: str | None
    prompt: str | None = None
    prompt_ids: list[int] | None = None
    messages: list[dict] = field(default_factory=list)
    max_tokens: int | None = None
    temperature: float = 1.0
    top_p: float = 1.0
    top_k: int = 0
    stop: list[str] = field(default_factory=list)
    seed: int | None = None
    stream: bool = False
    include_usage: bool = False


def parse_body(raw: bytes) -> dict:
    """The request body as a JSON object; 400 for bytes that are not UTF-8, malformed JSON or a non-object."""
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as err:
        raise bad_request(f"the request body is not valid UTF-8 (byte {err.start}: {raw[err.start:err.start + 1]!r});"
                          " send UTF-8 encoded JSON", code="invalid_encoding") from None
    if not text.strip():
        raise bad_request("the request body is empty; send a JSON object", code="invalid_json")
    try:
        body = json.loads(text)
    except json.JSONDecodeError as err:
        raise bad_request(f"the request body is not valid JSON ({err.msg} at line {err.lineno} column {err.colno})",
                          code="invalid_json") from None
    if not isinstance(body, dict):
        raise bad_request(f"the request body must be a JSON object, got {type(body).__name__}", code="invalid_json")
    return body


def _number(body: dict, name: str, default, kind=float):
    value = body.get(name)
    if value is None:
        return default
    if isinstance(value, bool) or not isinstance(value, (int, float)) or (kind is int and not float(value).is_integer()):
        what = "an integer" if kind is int else "a number"
        raise bad_request(f"'{name}' must be {what}, got {json.dumps(value)}", param=name)
    if not math.isfinite(value):
        raise bad_request(f"'{name}' must be finite, got {value}", param=name)
    return kind(value)


def _check_fields(body: dict, allowed: set[str], endpoint: str) -> None:
    for name in body:
        if name not in allowed:
            raise bad_request(f"unrecognized request argument '{name}' for {endpoint}; slmlab serve does not support it",
                              param=name, code="unsupported_parameter")
    for name, defaults in _DEFAULTS_ONLY.items():
        if name in body and not any(body[name] == d and type(body[name]) is type(d) or body[name] is d for d in defaults):
            raise bad_request(f"'{name}' is not supported by slmlab serve (got {json.dumps(body[name])}); leave it out",
                              param=name, code="unsupported_parameter")
    n = body.get("n")
    if n is not None and (isinstance(n, bool) or n != 1):
        raise bad_request(f"'n' must be 1 (one choice per request), got {json.dumps(n)}; send n separate requests"
                          " instead", param="n", code="unsupported_parameter")


def _common(body: dict, kind: str) -> GenerationRequest:
    model = body.get("model")
    if model is not None and not isinstance(model, str):
        raise bad_request(f"'model' must be a string, got {json.dumps(model)}", param="model")
    max_tokens = _number(body, "max_tokens", None, int)
    if kind == "chat" and body.get("max_completion_tokens") is not None:
        max_tokens = _number(body, "max_completion_tokens", None, int)
    if max_tokens is not None and max_tokens <= 0:
        raise bad_request(f"'max_tokens' must be at least 1, got {max_tokens}", param="max_tokens")
    temperature = _number(body, "temperature", 1.0)
    if temperature < 0:
        raise bad_request(f"'temperature' must be >= 0 (0 = greedy), got {temperature}", param="temperature")
    top_p = _number(body, "top_p", 1.0)
    if not 0.0 < top_p <= 1.0:
        raise bad_request(f"'top_p' must be in (0, 1], got {top_p}", param="top_p")
    top_k = _number(body, "top_k", 0, int)
    if top_k < 0:
        raise bad_request(f"'top_k' must be >= 0 (0 = off), got {top_k}", param="top_k")
    seed = _number(body, "seed", None, int)
    stop = body.get("stop")
    if stop is None:
        stop = []
    elif isinstance(stop, str):
        stop = [stop]
    if not isinstance(stop, list) or not all(isinstance(s, str) for s in stop):
        raise bad_request(f"'stop' must be a string or a list of strings, got {json.dumps(stop)}", param="stop")
    if len(stop) > MAX_STOP_STRINGS or any(not s for s in stop):
        raise bad_request(f"'stop' takes 1 to {MAX_STOP_STRINGS} non-empty strings, got {json.dumps(stop)}", param="stop")
    stream = body.get("stream", False)
    if stream is None:
        stream = False
    if not isinstance(stream, bool):
        raise bad_request(f"'stream' must be true or false, got {json.dumps(stream)}", param="stream")
    options = body.get("stream_options") or {}
    if not isinstance(options, dict) or set(options) - {"include_usage"}:
        raise bad_request(f"'stream_options' takes only include_usage, got {json.dumps(options)}", param="stream_options")
    return GenerationRequest(kind=kind, model=model, max_tokens=max_tokens, temperature=temperature, top_p=top_p,
                             top_k=top_k, stop=stop, seed=seed, stream=stream,
                             include_usage=bool(options.get("include_usage", False)))


def parse_completion(body: dict) -> GenerationRequest:
    """A ``/v1/completions`` body -> request; ``prompt`` is a string, a list of one string, token ids
    or a list of one list of token ids."""
    _check_fields(body, COMPLETION_FIELDS, "/v1/completions")
    request = _common(body, "completion")
    prompt = body.get("prompt")
    if isinstance(prompt, list) and len(prompt) == 1 and isinstance(prompt[0], (str, list)):
        prompt = prompt[0]
    if isinstance(prompt, str):
        if not prompt:
            raise bad_request("'prompt' is empty; send at least one character", param="prompt", code="empty_prompt")
        request.prompt = prompt
    elif isinstance(prompt, list) and prompt and all(isinstance(t, int) and not isinstance(t, bool) for t in prompt):
        request.prompt_ids = list(prompt)
    elif isinstance(prompt, list) and not prompt:
        raise bad_request("'prompt' is empty; send at least one token", param="prompt", code="empty_prompt")
    elif prompt is None:
        raise bad_request("'prompt' is required", param="prompt")
    else:
        raise bad_request("'prompt' must be a string or a list of token ids (one prompt per request; n prompts are"
                          " n requests)", param="prompt")
    return request


CHAT_ROLES = ("system", "developer", "user", "assistant")


def _message_text(content, index: int) -> str:
    if isinstance(content, str):
        return content
    if isinstance(content, list) and all(isinstance(p, dict) and p.get("type") == "text" and isinstance(p.get("text"), str)
                                         for p in content):
        return "".join(p["text"] for p in content)
    raise bad_request(f"messages[{index}].content must be a string or a list of text parts"
                      " ({\"type\": \"text\", \"text\": ...})", param=f"messages[{index}].content")


def parse_chat(body: dict) -> GenerationRequest:
    """A ``/v1/chat/completions`` body -> request; ``messages`` are system/developer/user/assistant
    turns with text content."""
    _check_fields(body, CHAT_FIELDS, "/v1/chat/completions")
    request = _common(body, "chat")
    messages = body.get("messages")
    if not isinstance(messages, list) or not messages:
        raise bad_request("'messages' must be a non-empty list of {\"role\", \"content\"} objects", param="messages")
    turns = []
    for i, message in enumerate(messages):
        if not isinstance(message, dict) or "role" not in message:
            raise bad_request(f"messages[{i}] must be an object with 'role' and 'content'", param=f"messages[{i}]")
        role = message["role"]
        if role not in CHAT_ROLES:
            raise bad_request(f"messages[{i}].role {json.dumps(role)} is not supported; use one of {list(CHAT_ROLES)}"
                              " (tool calls are not supported)", param=f"messages[{i}].role")
        turns.append({"role": role, "content": _message_text(message.get("content"), i)})
    if not any(t["content"] for t in turns):
        raise bad_request("every message is empty; send some text", param="messages", code="empty_prompt")
    request.messages = turns
    return request


def check_model(requested: str | None, served: str) -> None:
    """404 when the request names a model this server does not serve (no name: the served one)."""
    if requested is not None and requested != served:
        raise APIError(404, f"the model '{requested}' does not exist; this server serves '{served}' (GET /v1/models)",
                       param="model", code="model_not_found")


def resolve_max_tokens(request: GenerationRequest, prompt_tokens: int, context: int | None) -> int:
    """The number of new tokens to generate, checked against the model's context.

    400 when the prompt alone fills the context, when ``max_tokens`` exceeds the context, or when
    prompt + ``max_tokens`` do not fit; both lengths are named. Without ``max_tokens``: 16 for
    completions (OpenAI's default), the rest of the context for chat, capped by what fits.
    """
    if context is not None and prompt_tokens >= context:
        raise bad_request(f"the prompt has {prompt_tokens} tokens, but the model's context is {context} tokens, leaving"
                          " no room for a completion; shorten the prompt", param="prompt" if request.kind == "completion"
                          else "messages", code="context_length_exceeded")
    wanted = request.max_tokens
    if wanted is None:
        default = 16 if request.kind == "completion" else (context or 256) - prompt_tokens
        return default if context is None else min(default, context - prompt_tokens)
    if context is not None and wanted > context:
        raise bad_request(f"'max_tokens' is {wanted}, above the model's context of {context} tokens", param="max_tokens",
                          code="context_length_exceeded")
    if context is not None and prompt_tokens + wanted > context:
        raise bad_request(f"the model's context is {context} tokens, but the request asks for {prompt_tokens + wanted}"
                          f" ({prompt_tokens} in the prompt, {wanted} in the completion); lower 'max_tokens' or shorten"
                          " the prompt", param="max_tokens", code="context_length_exceeded")
    return wanted
