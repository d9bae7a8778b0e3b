"""The HTTP side: a FastAPI app with OpenAI's routes in front of one :class:`Worker`.

Routes: ``GET /health``, ``GET /v1/models`` (and ``/v1/models/{id}``), ``POST /v1/completions``,
``POST /v1/chat/completions``. A request is parsed and checked (:mod:`.schemas`), tokenized,
checked against the model's context, and queued; the answer is one JSON object, or server-sent
events in OpenAI's chunk format ending with ``data: [DONE]`` when ``stream`` is true. Every
refusal is a JSON error in OpenAI's format (:class:`APIError`). With an API key, every ``/v1``
route needs ``Authorization: Bearer <key>`` (401 otherwise); ``/health`` stays open.

The event loop only moves bytes: a body larger than ``max_request_bytes`` is refused with 413
before it is parsed, and parsing, validation and tokenization run on a worker thread
(:func:`asyncio.to_thread`), so ``/health`` and the streams of other clients are answered while a
long prompt is tokenized. A prompt far longer than the context could hold (more characters than
the context times the tokenizer's longest token, times 4) is refused before it is tokenized.
"""

from __future__ import annotations

import asyncio
import contextlib
import hmac
import json
import secrets
import time
import uuid
from dataclasses import dataclass

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse, StreamingResponse
from starlette.exceptions import HTTPException
from starlette.requests import ClientDisconnect

from ..generation import SamplingConfig
from ..generation.chat import chat_stops
from ..generation.text import TextStream
from .chat import render_chat
from .errors import APIError, bad_request
from .schemas import GenerationRequest, check_model, parse_body, parse_chat, parse_completion, resolve_max_tokens
from .worker import Event, Job, Worker

DISCONNECT_POLL_S = 0.5
DEFAULT_MAX_REQUEST_BYTES = 4 * 1024 * 1024  # 4 MiB: ~1M prompt tokens of English text, far past any context
DRAIN_BYTES = 64 * 1024 * 1024  # an oversized body is read (and dropped) up to this, so the client gets the 413
PROMPT_CHARS_PER_TOKEN_MARGIN = 4  # normalizers may shorten a text a little; never refuse what might fit


@dataclass
class ServedModel:
    """What the app serves.

    Args:
        name: the model id clients send (``/v1/models`` lists it).
        model: the causal LM, in eval mode.
        tokenizer: its tokenizer (a ``PreTrainedTokenizerFast``).
        stop_ids: end-of-text token ids.
        context: the model's context length (prompt + completion), or None.
    """

    name: str
    model: object
    tokenizer: object
    stop_ids: list[int]
    context: int | None


class _ErrorJSON(JSONResponse):
    """A JSON error body with every non-ASCII character escaped, so no message can fail to encode."""

    def render(self, content) -> bytes:
        return json.dumps(content, ensure_ascii=True, separators=(",", ":")).encode("ascii")


def _error_response(err: APIError) -> JSONResponse:
    return _ErrorJSON(err.body(), status_code=err.status, headers=err.headers)


class _Authenticate:
    """ASGI middleware: ``/v1`` routes need ``Authorization: Bearer <key>`` (401 otherwise).

    A plain ASGI wrapper, not Starlette's ``BaseHTTPMiddleware``: that one hides a client's
    disconnect from :meth:`Request.is_disconnected`, and a non-streamed request whose client went
    away would keep its row until its last token (and keep a graceful shutdown waiting for it)."""

    def __init__(self, app, api_key: str) -> None:
        self.app = app
        self.key = api_key.encode()

    async def __call__(self, scope, receive, send) -> None:
        if scope["type"] == "http" and scope["path"].startswith("/v1"):
            header = next((v for k, v in scope["headers"] if k == b"authorization"), b"")
            given = header[7:] if header[:7].lower() == b"bearer " else b""
            if not hmac.compare_digest(given, self.key):
                response = _error_response(APIError(401, "missing or wrong API key: send 'Authorization: Bearer"
                                                    " <key>' with the key the server was started with (--api-key)",
                                                    code="invalid_api_key"))
                await response(scope, receive, send)
                return
        await self.app(scope, receive, send)


def check_api_key(api_key: str | None) -> None:
    """Refuse an API key that cannot protect anything: empty or blank (every client would pass, or
    none could), or holding characters an HTTP header cannot carry as sent."""
    if api_key is None:
        return
    if not api_key.strip():
        raise ValueError("--api-key is empty; pass a non-empty key (check the variable you expanded), or leave"
                         " --api-key out to serve without authentication")
    if not all(33 <= ord(c) <= 126 for c in api_key):
        raise ValueError("--api-key holds a space, a control character or a non-ASCII character, which clients"
                         " cannot send in an Authorization header; use printable ASCII")


def max_chars_per_token(tokenizer) -> int | None:
    """An upper bound on the characters of text one token stands for: the longest vocabulary entry in
    UTF-8 bytes (a byte-level entry has one character per byte, a SentencePiece or WordPiece one at
    least as many characters as it covers); None when the tokenizer has an unknown token (one token
    may then stand for any run of characters) or no vocabulary to read."""
    if getattr(tokenizer, "unk_token", None) is not None:
        return None
    try:
        vocab = tokenizer.get_vocab()
    except Exception:  # not a Hugging Face tokenizer: no bound
        return None
    return max((len(token.encode("utf-8", "surrogatepass")) for token in vocab), default=None) or None


def _sse(payload) -> str:
    return f"data: {json.dumps(payload, ensure_ascii=False) if not isinstance(payload, str) else payload}\n\n"


def build_app(served: ServedModel, worker: Worker, api_key: str | None = None,
              max_request_bytes: int = DEFAULT_MAX_REQUEST_BYTES):
    """The FastAPI app; starting it (its lifespan) starts the worker thread, stopping it stops it.

    Raises:
        ValueError: an empty or unusable ``api_key``, or ``max_request_bytes`` < 1.
    """
    check_api_key(api_key)
    if max_request_bytes < 1:
        raise ValueError(f"--max-request-bytes must be >= 1, got {max_request_bytes}")

    @contextlib.asynccontextmanager
    async def lifespan(app):
        worker.start()
        yield
        worker.stop()

    app = FastAPI(title="slmlab serve", lifespan=lifespan, docs_url=None, redoc_url=None, openapi_url=None)
    if api_key is not None:
        app.add_middleware(_Authenticate, api_key=api_key)
    created = int(time.time())
    longest = max_chars_per_token(served.tokenizer)
    prompt_chars = None if served.context is None or longest is None else (
        served.context * longest * PROMPT_CHARS_PER_TOKEN_MARGIN)

    @app.exception_handler(APIError)
    async def api_error(request, err: APIError):
        return _error_response(err)

    @app.exception_handler(HTTPException)
    async def http_error(request, err: HTTPException):
        return _error_response(APIError(err.status_code, f"{request.method} {request.url.path}: {err.detail}",
                                        code="not_found" if err.status_code == 404 else None))

    @app.exception_handler(RequestValidationError)
    async def validation_error(request, err: RequestValidationError):
        return _error_response(bad_request(str(err)))

    @app.exception_handler(Exception)
    async def internal_error(request, err: Exception):
        return _error_response(APIError(500, f"internal error: {type(err).__name__}: {err}"))

    def model_card() -> dict:
        return {"id": served.name, "object": "model", "created": created, "owned_by": "slmlab",
                "context_length": served.context}

    @app.get("/health")
    async def health():
        body = {"status": "ok", "model": served.name, "mode": "batched" if worker.batched else "sequential",
                "max_batch": worker.max_batch, **worker.stats()}
        if worker.broken is not None:  # the worker thread stopped: this server answers nothing but 503s
            return JSONResponse({**body, "status": "error", "error": f"the model worker stopped: {worker.broken}"},
                                status_code=503)
        return body

    @app.get("/v1/models")
    async def models():
        return {"object": "list", "data": [model_card()]}

    @app.get("/v1/models/{model_id:path}")
    async def model(model_id: str):
        check_model(model_id, served.name)
        return model_card()

    @app.post("/v1/completions")
    async def completions(request: Request):
        return await answer(request, *await asyncio.to_thread(prepare, await read_body(request), parse_completion))

    @app.post("/v1/chat/completions")
    async def chat_completions(request: Request):
        return await answer(request, *await asyncio.to_thread(prepare, await read_body(request), parse_chat))

    async def read_body(request: Request) -> bytes:
        """The body, or 413 when it is longer than ``max_request_bytes`` (told by Content-Length, or
        counted while it arrives). An oversized body is still read, and dropped, up to
        :data:`DRAIN_BYTES`, so that the client, still sending, can read the answer."""
        declared = request.headers.get("content-length", "")
        size = int(declared) if declared.isdigit() else None
        over = size is not None and size > max_request_bytes
        chunks, received, complete = [], 0, True
        try:
            async for chunk in request.stream():
                received += len(chunk)
                over = over or received > max_request_bytes
                if not over:
                    chunks.append(chunk)
                elif received > DRAIN_BYTES:
                    complete = False
                    break
        except ClientDisconnect:
            raise APIError(400, "the client disconnected while sending the request") from None
        if over:
            size = size if size is not None else received
            what = f"{size:,} bytes" if complete or declared else f"more than {DRAIN_BYTES:,} bytes"
            raise APIError(413, f"the request body has {what}, above this server's limit of {max_request_bytes:,}"
                           " bytes (--max-request-bytes); send a shorter prompt, or start the server with a larger"
                           " --max-request-bytes", code="request_too_large")
        return b"".join(chunks)

    def prepare(raw: bytes, parse) -> tuple[GenerationRequest, list[int], list[str], int]:
        """Parse, check and tokenize one request (on a worker thread, off the event loop): the
        request, its prompt ids, its stop strings and the number of tokens to generate."""
        req = parse(parse_body(raw))
        check_model(req.model, served.name)
        ids, stops = prompt_ids(req)
        return req, ids, stops, resolve_max_tokens(req, len(ids), served.context)

    def prompt_ids(req: GenerationRequest) -> tuple[list[int], list[str]]:
        if req.kind == "chat":
            text, stops = render_chat(req.messages, served.tokenizer), chat_stops(req.stop)
        else:
            text, stops = req.prompt, list(req.stop)
        where = "prompt" if req.kind == "completion" else "messages"
        if req.prompt_ids is not None:
            if served.context is not None and len(req.prompt_ids) >= served.context:
                resolve_max_tokens(req, len(req.prompt_ids), served.context)  # refuses it, naming both lengths
            vocab = served.model.config.vocab_size
            bad = next((t for t in req.prompt_ids if not 0 <= t < vocab), None)
            if bad is not None:
                raise bad_request(f"token id {str(bad)[:40]} in 'prompt' is outside the vocabulary [0, {vocab})",
                                  param="prompt")
            return list(req.prompt_ids), stops
        if prompt_chars is not None and len(text) > prompt_chars:
            raise bad_request(f"the prompt has {len(text):,} characters, more than the model's context of"
                              f" {served.context} tokens can hold (at most {prompt_chars:,} characters with this"
                              " tokenizer); shorten the prompt", param=where, code="context_length_exceeded")
        ids = served.tokenizer(text, add_special_tokens=False)["input_ids"]
        if not ids:
            raise bad_request("the prompt encodes to no tokens; send some text", param=where, code="empty_prompt")
        return ids, stops

    async def answer(request: Request, req: GenerationRequest, ids: list[int], stops: list[str], max_tokens: int):
        loop, events = asyncio.get_running_loop(), asyncio.Queue()
        job = Job(prompt_ids=ids, max_tokens=max_tokens, sampling=SamplingConfig(req.temperature, req.top_k, req.top_p),
                  seed=req.seed if req.seed is not None else secrets.randbits(63), text=TextStream(served.tokenizer, stops),
                  deliver=events.put_nowait, loop=loop)
        worker.submit(job)
        chat = req.kind == "chat"
        ident = f"{'chatcmpl' if chat else 'cmpl'}-{uuid.uuid4().hex[:24]}"
        now = int(time.time())
        usage = lambda n: {"prompt_tokens": len(ids), "completion_tokens": n, "total_tokens": len(ids) + n}  # noqa: E731
        if req.stream:
            return StreamingResponse(stream(job, events, chat, ident, now, req.include_usage, usage),
                                     media_type="text/event-stream", headers={"Cache-Control": "no-cache"})
        text, done = [], None
        check_at = loop.time() + DISCONNECT_POLL_S
        try:
            while done is None:
                try:
                    event = await asyncio.wait_for(events.get(), DISCONNECT_POLL_S)
                except asyncio.TimeoutError:
                    event = None
                if loop.time() >= check_at:  # also while tokens arrive: a client gone mid-answer frees its row
                    if await request.is_disconnected():
                        return JSONResponse({}, status_code=499)
                    check_at = loop.time() + DISCONNECT_POLL_S
                if event is None:
                    continue
                if event.kind == "delta":
                    text.append(event.text)
                elif event.kind == "error":
                    raise event.error
                else:
                    done = event
        finally:
            if not job.finished:
                job.cancel()
        content = "".join(text)
        choice = ({"index": 0, "message": {"role": "assistant", "content": content}} if chat
                  else {"index": 0, "text": content})
        choice.update(logprobs=None, finish_reason=done.finish_reason)
        return {"id": ident, "object": "chat.completion" if chat else "text_completion", "created": now,
                "model": served.name, "choices": [choice], "usage": usage(done.completion_tokens)}

    async def stream(job: Job, events: asyncio.Queue, chat: bool, ident: str, now: int, include_usage: bool, usage):
        head = {"id": ident, "object": "chat.completion.chunk" if chat else "text_completion", "created": now,
                "model": served.name}

        def chunk(text: str | None, finish: str | None) -> dict:
            if chat:
                delta = {} if text is None else {"content": text}
                return {**head, "choices": [{"index": 0, "delta": delta, "logprobs": None, "finish_reason": finish}]}
            return {**head, "choices": [{"index": 0, "text": text or "", "logprobs": None, "finish_reason": finish}]}

        try:
            if chat:
                first = chunk("", None)
                first["choices"][0]["delta"] = {"role": "assistant", "content": ""}
                yield _sse(first)
            pending: Event | None = None
            while True:
                event, pending = pending or await events.get(), None
                if event.kind == "delta":  # deltas that queued up while the client was slower go out as one chunk
                    text = [event.text]
                    while not events.empty():
                        pending = events.get_nowait()
                        if pending.kind != "delta":
                            break
                        text.append(pending.text)
                        pending = None
                    yield _sse(chunk("".join(text), None))
                elif event.kind == "error":
                    yield _sse(event.error.body())
                    break
                else:
                    yield _sse(chunk(None if chat else "", event.finish_reason))
                    if include_usage:
                        yield _sse({**head, "choices": [], "usage": usage(event.completion_tokens)})
                    break
            yield _sse("[DONE]")
        finally:
            if not job.finished:
                job.cancel()

    return app
