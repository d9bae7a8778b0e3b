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

Every value is checked against the range the code behind it takes (``seed`` fits the 64-bit seed of
``torch.Generator``, stop strings are short, numbers are finite), so a request the worker would fail
on is refused here with 400 naming the field; so is a string holding a lone UTF-16 surrogate (no
tokenizer encodes it, no response can echo it) and a body nested deeper than
:data:`MAX_JSON_DEPTH`.
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass, field

from .errors import APIError, bad_request

MAX_STOP_STRINGS = 4
MAX_STOP_CHARS = 256  # the text stream compares every stop prefix after each token: keep it cheap
MAX_SEED = 2**64 - 1  # torch.Generator.manual_seed takes 0 .. 2**64 - 1
MAX_TOP_K = 2**31 - 1  # any k above the vocabulary keeps every token; larger values mean the same
MIN_TEMPERATURE = 1e-5  # below it, logits / temperature overflow float32: such a request is greedy
MIN_TOP_P = 1e-30  # float32 rounds smaller values to 0, which would drop every token; any p below the
# top token's probability keeps the top token only, so this is the same request
MAX_JSON_DEPTH = 32  # the deepest request (messages[i].content[j].text) is 5 levels
UNBOUNDED_MAX_TOKENS = 2**20  # the most new tokens when the model has no context length

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
    except RecursionError:
        raise bad_request(f"the request body nests arrays or objects too deeply; at most {MAX_JSON_DEPTH} levels are"
                          " accepted", code="invalid_json") from None
    except ValueError as err:  # e.g. an integer literal longer than Python converts (4300 digits)
        raise bad_request(f"the request body is not valid JSON ({_clip(str(err))})", code="invalid_json") from None
    if not isinstance(body, dict):
        raise bad_request(f"the request body must be a JSON object, got {type(body).__name__}", code="invalid_json")
    _check_json(body, "", 1)
    return body


def _clip(text: str, limit: int = 80) -> str:
    return text if len(text) <= limit else text[: limit - 3] + "..."


def _show(value) -> str:
    """``value`` as JSON for an error message, cut to a readable length."""
    return _clip(json.dumps(value))


def _check_text(text: str, where: str, key: bool = False) -> None:
    try:
        text.encode("utf-8")
    except UnicodeEncodeError as err:
        what = (f"a key of '{where}'" if where else "a key of the request body") if key else f"'{where}'"
        raise bad_request(f"{what} holds a lone UTF-16 surrogate ({text[err.start]!r} at character {err.start}),"
                          " which is not valid Unicode; send well-formed text (an escaped surrogate pair such as"
                          " \\ud83d\\ude00 is fine)", param=where or None, code="invalid_encoding") from None


def _check_json(value, where: str, depth: int) -> None:
    """Refuse strings with lone surrogates (in keys too) and nesting deeper than :data:`MAX_JSON_DEPTH`."""
    if depth > MAX_JSON_DEPTH:
        raise bad_request(f"the request body nests arrays or objects deeper than {MAX_JSON_DEPTH} levels (at"
                          f" {_clip(where, 60)})", param=where or None, code="invalid_json")
    if isinstance(value, dict):
        for key, item in value.items():
            path = f"{where}.{key}" if where else key
            _check_text(key, where, key=True)
            if isinstance(item, (str, dict, list)):
                _check_json(item, path, depth + 1)
    elif isinstance(value, list):
        for i, item in enumerate(value):
            if isinstance(item, (str, dict, list)):
                _check_json(item, f"{where}[{i}]", depth + 1)
    elif isinstance(value, str):
        _check_text(value, where)


def _number(body: dict, name: str, default, kind=float):
    """``body[name]`` as ``kind`` (``int`` takes integral floats such as ``5.0``), or ``default`` when
    absent or null; 400 naming the field for another type, a non-finite or an unrepresentable number."""
    value = body.get(name)
    if value is None:
        return default
    what = "an integer" if kind is int else "a number"
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise bad_request(f"'{name}' must be {what}, got {_show(value)}", param=name)
    if isinstance(value, float):
        if not math.isfinite(value):
            raise bad_request(f"'{name}' must be finite, got {value}", param=name)
        if kind is int and not value.is_integer():
            raise bad_request(f"'{name}' must be {what}, got {_show(value)}", param=name)
        return kind(value)
    if kind is float:
        try:
            return float(value)
        except OverflowError:  # an integer beyond the float range
            raise bad_request(f"'{name}' is out of range, got {_show(value)}", param=name) from None
    return value


def _check_fields(body: dict, allowed: set[str], endpoint: str) -> None:
    for name in body:
        if name not in allowed:
            raise bad_request(f"unrecognized request argument '{_clip(name)}' for {endpoint}; slmlab serve does not"
                              " support it",
                              param=name, code="unsupported_parameter")
    for name, defaults in _DEFAULTS_ONLY.items():
        if name in body and not any(body[name] == d and type(body[name]) is type(d) or body[name] is d for d in defaults):
            raise bad_request(f"'{name}' is not supported by slmlab serve (got {_show(body[name])}); leave it out",
                              param=name, code="unsupported_parameter")
    n = body.get("n")
    if n is not None and (isinstance(n, bool) or n != 1):
        raise bad_request(f"'n' must be 1 (one choice per request), got {_show(n)}; send n separate requests"
                          " instead", param="n", code="unsupported_parameter")


def _common(body: dict, kind: str) -> GenerationRequest:
    model = body.get("model")
    if model is not None and not isinstance(model, str):
        raise bad_request(f"'model' must be a string, got {_show(model)}", param="model")
    max_tokens = _number(body, "max_tokens", None, int)
    if kind == "chat" and body.get("max_completion_tokens") is not None:
        max_tokens = _number(body, "max_completion_tokens", None, int)
    max_name = "max_completion_tokens" if kind == "chat" and body.get("max_completion_tokens") is not None else "max_tokens"
    if max_tokens is not None and max_tokens <= 0:
        raise bad_request(f"'{max_name}' must be at least 1, got {_clip(str(max_tokens))}", param=max_name)
    temperature = _number(body, "temperature", 1.0)
    if temperature < 0:
        raise bad_request(f"'temperature' must be >= 0 (0 = greedy), got {temperature}", param="temperature")
    if temperature < MIN_TEMPERATURE:
        temperature = 0.0
    top_p = _number(body, "top_p", 1.0)
    if not 0.0 < top_p <= 1.0:
        raise bad_request(f"'top_p' must be in (0, 1], got {top_p}", param="top_p")
    top_p = max(top_p, MIN_TOP_P)
    top_k = _number(body, "top_k", 0, int)
    if top_k < 0:
        raise bad_request(f"'top_k' must be >= 0 (0 = off), got {_clip(str(top_k))}", param="top_k")
    top_k = min(top_k, MAX_TOP_K)
    seed = _number(body, "seed", None, int)
    if seed is not None and not 0 <= seed <= MAX_SEED:
        raise bad_request(f"'seed' must be an integer from 0 to {MAX_SEED} (2**64 - 1), got {_clip(str(seed))}",
                          param="seed")
    stop = body.get("stop")
    if stop is None:
        stop = []
    elif isinstance(stop, str):
        stop = [stop]
    if not isinstance(stop, list) or not all(isinstance(s, str) for s in stop):
        raise bad_request(f"'stop' must be a string or a list of strings, got {_show(stop)}", param="stop")
    if len(stop) > MAX_STOP_STRINGS or any(not s for s in stop):
        raise bad_request(f"'stop' takes 1 to {MAX_STOP_STRINGS} non-empty strings, got {_show(stop)}", param="stop")
    if any(len(s) > MAX_STOP_CHARS for s in stop):
        longest = max(len(s) for s in stop)
        raise bad_request(f"'stop' strings may have at most {MAX_STOP_CHARS} characters, got one of {longest}",
                          param="stop")
    stream = body.get("stream", False)
    if stream is None:
        stream = False
    if not isinstance(stream, bool):
        raise bad_request(f"'stream' must be true or false, got {_show(stream)}", param="stream")
    options = body.get("stream_options")
    if options is None:
        options = {}
    if not isinstance(options, dict) or set(options) - {"include_usage"}:
        raise bad_request(f"'stream_options' takes only include_usage, got {_show(options)}", param="stream_options")
    include_usage = options.get("include_usage")
    if include_usage is not None and not isinstance(include_usage, bool):
        raise bad_request(f"'stream_options.include_usage' must be true or false, got {_show(include_usage)}",
                          param="stream_options.include_usage")
    return GenerationRequest(kind=kind, model=model, max_tokens=max_tokens, temperature=temperature, top_p=top_p,
                             top_k=top_k, stop=stop, seed=seed, stream=stream, include_usage=bool(include_usage))


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
            raise bad_request(f"messages[{i}].role {_show(role)} is not supported; use one of {list(CHAT_ROLES)}"
                              " (tool calls are not supported)", param=f"messages[{i}].role")
        turns.append({"role": role, "content": _message_text(message.get("content"), i)})
    if not any(t["content"] for t in turns):
        raise bad_request("every message is empty; send some text", param="messages", code="empty_prompt")
    request.messages = turns
    return request


def check_model(requested: str | None, served: str) -> None:
    """404 when the request names a model this server does not serve (no name: the served one)."""
    if requested is not None and requested != served:
        raise APIError(404, f"the model '{_clip(requested)}' does not exist; this server serves '{served}' (GET"
                       " /v1/models)",
                       param="model", code="model_not_found")


def resolve_max_tokens(request: GenerationRequest, prompt_tokens: int, context: int | None) -> int:
    """The number of new tokens to generate, checked against the model's context.

    400 when the prompt alone fills the context, when ``max_tokens`` exceeds the context, or when
    prompt + ``max_tokens`` do not fit; both lengths are named. Without ``max_tokens``: 16 for
    completions (OpenAI's default), the rest of the context for chat, capped by what fits (256 for
    chat when the model has no context length, which also caps ``max_tokens`` at
    :data:`UNBOUNDED_MAX_TOKENS`).
    """
    if context is not None and prompt_tokens >= context:
        raise bad_request(f"the prompt has {prompt_tokens} tokens, but the model's context is {context} tokens, leaving"
                          " no room for a completion; shorten the prompt", param="prompt" if request.kind == "completion"
                          else "messages", code="context_length_exceeded")
    wanted = request.max_tokens
    if wanted is None:
        if context is None:
            return 16 if request.kind == "completion" else 256
        return min(16, context - prompt_tokens) if request.kind == "completion" else context - prompt_tokens
    if context is None and wanted > UNBOUNDED_MAX_TOKENS:
        raise bad_request(f"'max_tokens' is {_clip(str(wanted))}; the model has no context length, and this server"
                          f" generates at most {UNBOUNDED_MAX_TOKENS} tokens per request", param="max_tokens")
    if context is not None and wanted > context:
        raise bad_request(f"'max_tokens' is {_clip(str(wanted))}, above the model's context of {context} tokens", param="max_tokens",
                          code="context_length_exceeded")
    if context is not None and prompt_tokens + wanted > context:
        raise bad_request(f"the model's context is {context} tokens, but the request asks for {prompt_tokens + wanted}"
                          f" ({prompt_tokens} in the prompt, {wanted} in the completion); lower 'max_tokens' or shorten"
                          " the prompt", param="max_tokens", code="context_length_exceeded")
    return wanted
