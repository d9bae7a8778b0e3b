"""The HTTP side: a FastAPI app with OpenAI's routes in front of one :class:`Worker`.

Routes: ``GET /health``, ``GET /v1/models`` (and ``/v1/models/{id}``), ``POST /v1/completions``,
``POST /v1/chat/completions``. A request is parsed and checked (:mod:`.schemas`), tokenized,
checked against the model's context, and queued; the answer is one JSON object, or server-sent
events in OpenAI's chunk format ending with ``data: [DONE]`` when ``stream`` is true. Every
refusal is a JSON error in OpenAI's format (:class:`APIError`). With an API key, every ``/v1``
route needs ``Authorization: Bearer <key>`` (401 otherwise); ``/health`` stays open.
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

from ..generation import SamplingConfig
from .chat import chat_stops, render_chat
from .errors import APIError, bad_request
from .schemas import GenerationRequest, check_model, parse_body, parse_chat, parse_completion, resolve_max_tokens
from .text import TextStream
from .worker import Event, Job, Worker

DISCONNECT_POLL_S = 0.5


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


def _error_response(err: APIError) -> JSONResponse:
    return JSONResponse(err.body(), status_code=err.status, headers=err.headers)


def _sse(payload) -> str:
    return f"data: {json.dumps(payload, ensure_ascii=False) if not isinstance(payload, str) else payload}\n\n"


def build_app(served: ServedModel, worker: Worker, api_key: str | None = None):
    """The FastAPI app; starting it (its lifespan) starts the worker thread, stopping it stops it."""
    @contextlib.asynccontextmanager
    async def lifespan(app):
        worker.start()
        yield
        worker.stop()

    app = FastAPI(title="slmlab serve", lifespan=lifespan, docs_url=None, redoc_url=None, openapi_url=None)
    created = int(time.time())

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

    @app.middleware("http")
    async def authenticate(request: Request, call_next):
        if api_key is not None and request.url.path.startswith("/v1"):
            header = request.headers.get("authorization", "")
            given = header[7:] if header.lower().startswith("bearer ") else ""
            if not hmac.compare_digest(given.encode(), api_key.encode()):
                return _error_response(APIError(401, "missing or wrong API key: send 'Authorization: Bearer <key>'"
                                                " with the key the server was started with (--api-key)",
                                                code="invalid_api_key"))
        return await call_next(request)

    def model_card() -> dict:
        return {"id": served.name, "object": "model", "created": created, "owned_by": "slmlab",
                "context_length": served.context}

    @app.get("/health")
    async def health():
        return {"status": "ok", "model": served.name, "mode": "batched" if worker.batched else "sequential",
                "max_batch": worker.max_batch, **worker.stats()}

    @app.get("/v1/models")
    async def models():
        return {"object": "list", "data": [model_card()]}

    @app.get("/v1/models/{model_id:path}")
    async def model(model_id: str):
        check_model(model_id, served.name)
        return model_card()

    @app.post("/v1/completions")
    async def completions(request: Request):
        return await answer(request, parse_completion(parse_body(await request.body())))

    @app.post("/v1/chat/completions")
    async def chat_completions(request: Request):
        return await answer(request, parse_chat(parse_body(await request.body())))

    def prompt_ids(req: GenerationRequest) -> tuple[list[int], list[str]]:
        if req.kind == "chat":
            text, stops = render_chat(req.messages), chat_stops(req.stop)
        else:
            text, stops = req.prompt, list(req.stop)
        if req.prompt_ids is not None:
            vocab = served.model.config.vocab_size
            bad = [t for t in req.prompt_ids if not 0 <= t < vocab]
            if bad:
                raise bad_request(f"token id {bad[0]} in 'prompt' is outside the vocabulary [0, {vocab})", param="prompt")
            return list(req.prompt_ids), stops
        ids = served.tokenizer(text, add_special_tokens=False)["input_ids"]
        if not ids:
            raise bad_request("the prompt encodes to no tokens; send some text", param="prompt", code="empty_prompt")
        return ids, stops

    async def answer(request: Request, req: GenerationRequest):
        check_model(req.model, served.name)
        ids, stops = prompt_ids(req)
        max_tokens = resolve_max_tokens(req, len(ids), served.context)
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
        try:
            while done is None:
                try:
                    event = await asyncio.wait_for(events.get(), DISCONNECT_POLL_S)
                except asyncio.TimeoutError:
                    if await request.is_disconnected():
                        return JSONResponse({}, status_code=499)
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
