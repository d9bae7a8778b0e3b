"""OpenAI's routes over one :class:`Worker`: what each route reads, checks, queues and answers.

``GET /health``, ``GET /v1/models`` (and ``/v1/models/{id}``), ``POST /v1/completions`` and
``POST /v1/chat/completions``. A generation request is read (:func:`.http.read_body`, up to the size
limit), then parsed, checked and tokenized on a worker thread (:meth:`Routes.prepare`, off the event
loop), queued as a :class:`Job`, and answered as one JSON object (:meth:`Routes.collect`) or as
server-sent events in OpenAI's chunk format ending with ``data: [DONE]`` (:meth:`Routes.stream`).
"""

from __future__ import annotations

import asyncio
import secrets
import time
import uuid
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass

from fastapi import Request
from fastapi.responses import JSONResponse, StreamingResponse

from ..generation import SamplingConfig
from ..generation.chat import chat_stops
from ..generation.text import TextStream
from .chat import render_chat
from .errors import bad_request
from .http import read_body, sse
from .schemas import GenerationRequest, check_model, parse_body, parse_chat, parse_completion, resolve_max_tokens
from .worker import Event, Job, Worker

DISCONNECT_POLL_S = 0.5
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




@dataclass
class Reply:
    """One queued request's answer in the making: its job, the events the worker sends it, and what
    every response object of it repeats."""

    job: Job
    events: asyncio.Queue
    chat: bool
    ident: str
    created: int
    model: str
    prompt_tokens: int
    include_usage: bool

    def usage(self, completion_tokens: int) -> dict:
        return {"prompt_tokens": self.prompt_tokens, "completion_tokens": completion_tokens,
                "total_tokens": self.prompt_tokens + completion_tokens}

    def completion(self, content: str, done: Event) -> dict:
        """The whole answer (``stream`` false)."""
        choice = ({"index": 0, "message": {"role": "assistant", "content": content}} if self.chat
                  else {"index": 0, "text": content})
        choice.update(logprobs=None, finish_reason=done.finish_reason)
        return {"id": self.ident, "object": "chat.completion" if self.chat else "text_completion",
                "created": self.created, "model": self.model, "choices": [choice],
                "usage": self.usage(done.completion_tokens)}

    def head(self) -> dict:
        return {"id": self.ident, "object": "chat.completion.chunk" if self.chat else "text_completion",
                "created": self.created, "model": self.model}

    def chunk(self, text: str | None, finish: str | None) -> dict:
        """One streamed chunk: new ``text`` (None: none, in a chat's last chunk) or the ``finish`` reason."""
        if self.chat:
            delta = {} if text is None else {"content": text}
            return {**self.head(), "choices": [{"index": 0, "delta": delta, "logprobs": None, "finish_reason": finish}]}
        return {**self.head(), "choices": [{"index": 0, "text": text or "", "logprobs": None, "finish_reason": finish}]}


class Routes:
    """The handlers of every route, over one served model and its worker.

    Args:
        served: what is served.
        worker: the model worker the requests are queued on.
        max_request_bytes: the largest request body (413 above).
    """

    def __init__(self, served: ServedModel, worker: Worker, max_request_bytes: int) -> None:
        self.served, self.worker, self.max_request_bytes = served, worker, max_request_bytes
        self.created = int(time.time())
        longest = max_chars_per_token(served.tokenizer)
        self.prompt_chars = None if served.context is None or longest is None else (
            served.context * longest * PROMPT_CHARS_PER_TOKEN_MARGIN)

    def model_card(self) -> dict:
        return {"id": self.served.name, "object": "model", "created": self.created, "owned_by": "slmlab",
                "context_length": self.served.context}

    async def health(self):
        worker = self.worker
        body = {"status": "ok", "model": self.served.name, "mode": "batched" if worker.batched else "sequential",
                "max_batch": worker.max_batch, **worker.stats()}
        if worker.broken is not None:  # the worker thread stopped: this server answers nothing but 503s
            return JSONResponse({**body, "status": "error", "error": f"the model worker stopped: {worker.broken}"},
                                status_code=503)
        return body

    async def models(self):
        return {"object": "list", "data": [self.model_card()]}

    async def model(self, model_id: str):
        check_model(model_id, self.served.name)
        return self.model_card()

    async def completions(self, request: Request):
        return await self.answer(request, parse_completion)

    async def chat_completions(self, request: Request):
        return await self.answer(request, parse_chat)

    async def answer(self, request: Request, parse: Callable[[dict], GenerationRequest]):
        """Read, prepare and queue one generation request; answer it whole or as a stream."""
        raw = await read_body(request, self.max_request_bytes)
        req, ids, stops, max_tokens = await asyncio.to_thread(self.prepare, raw, parse)
        loop, events = asyncio.get_running_loop(), asyncio.Queue()
        job = Job(prompt_ids=ids, max_tokens=max_tokens, sampling=SamplingConfig(req.temperature, req.top_k, req.top_p),
                  seed=req.seed if req.seed is not None else secrets.randbits(63),
                  text=TextStream(self.served.tokenizer, stops), deliver=events.put_nowait, loop=loop)
        self.worker.submit(job)
        chat = req.kind == "chat"
        reply = Reply(job, events, chat, f"{'chatcmpl' if chat else 'cmpl'}-{uuid.uuid4().hex[:24]}", int(time.time()),
                      self.served.name, len(ids), req.include_usage)
        if req.stream:
            return StreamingResponse(self.stream(reply), media_type="text/event-stream",
                                     headers={"Cache-Control": "no-cache"})
        return await self.collect(request, reply)

    def prepare(self, raw: bytes, parse) -> tuple[GenerationRequest, list[int], list[str], int]:
        """Parse, check and tokenize one request (on a worker thread, off the event loop): the
        request, its prompt ids, its stop strings and the number of tokens to generate."""
        req = parse(parse_body(raw))
        check_model(req.model, self.served.name)
        ids, stops = self.prompt_ids(req)
        return req, ids, stops, resolve_max_tokens(req, len(ids), self.served.context)

    def prompt_ids(self, req: GenerationRequest) -> tuple[list[int], list[str]]:
        """The request's prompt token ids (given, or its text tokenized) and its stop strings."""
        served = self.served
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
        if self.prompt_chars is not None and len(text) > self.prompt_chars:
            raise bad_request(f"the prompt has {len(text):,} characters, more than the model's context of"
                              f" {served.context} tokens can hold (at most {self.prompt_chars:,} characters with this"
                              " tokenizer); shorten the prompt", param=where, code="context_length_exceeded")
        ids = served.tokenizer(text, add_special_tokens=False)["input_ids"]
        if not ids:
            raise bad_request("the prompt encodes to no tokens; send some text", param=where, code="empty_prompt")
        return ids, stops

    async def collect(self, request: Request, reply: Reply):
        """The whole answer once the worker is done (499 when the client went away before)."""
        loop, text, done = asyncio.get_running_loop(), [], None
        check_at = loop.time() + DISCONNECT_POLL_S
        try:
            while done is None:
                try:
                    event = await asyncio.wait_for(reply.events.get(), DISCONNECT_POLL_S)
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
            if not reply.job.finished:
                reply.job.cancel()
        return reply.completion("".join(text), done)

    async def stream(self, reply: Reply) -> AsyncIterator[str]:
        """The answer as server-sent events, as the worker's events arrive."""
        events = reply.events
        try:
            if reply.chat:
                first = reply.chunk("", None)
                first["choices"][0]["delta"] = {"role": "assistant", "content": ""}
                yield sse(first)
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
                    yield sse(reply.chunk("".join(text), None))
                elif event.kind == "error":
                    yield sse(event.error.body())
                    break
                else:
                    yield sse(reply.chunk(None if reply.chat else "", event.finish_reason))
                    if reply.include_usage:
                        yield sse({**reply.head(), "choices": [], "usage": reply.usage(event.completion_tokens)})
                    break
            yield sse("[DONE]")
        finally:
            if not reply.job.finished:
                reply.job.cancel()
