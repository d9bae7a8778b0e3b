"""The HTTP side: a FastAPI app with OpenAI's routes (:mod:`.routes`) in front of one :class:`Worker`.

Routes: ``GET /health``, ``GET /v1/models`` (and ``/v1/models/{id}``), ``POST /v1/completions``,
``POST /v1/chat/completions``. A request is parsed and checked (:mod:`.schemas`), tokenized,
checked against the model's context, and queued; the answer is one JSON object, or server-sent
events in OpenAI's chunk format ending with ``data: [DONE]`` when ``stream`` is true. Every
refusal is a JSON error in OpenAI's format (:class:`APIError`). With an API key, every ``/v1``
route needs ``Authorization: Bearer <key>`` (401 otherwise); ``/health`` stays open. The plumbing
(errors, the key, bodies, events) is :mod:`.http`.

The event loop only moves bytes: a body larger than ``max_request_bytes`` is refused with 413
before it is parsed, and parsing, validation and tokenization run on a worker thread
(:func:`asyncio.to_thread`), so ``/health`` and the streams of other clients are answered while a
long prompt is tokenized. A prompt far longer than the context could hold (more characters than
the context times the tokenizer's longest token, times 4) is refused before it is tokenized.
"""

from __future__ import annotations

import contextlib

from fastapi import FastAPI
from fastapi.exceptions import RequestValidationError
from starlette.exceptions import HTTPException

from .errors import APIError, bad_request
from .http import DEFAULT_MAX_REQUEST_BYTES, Authenticate, check_api_key, error_response
from .routes import Routes, ServedModel
from .worker import Worker


def build_app(served: ServedModel, worker: Worker, api_key: str | None = None,
              max_request_bytes: int = DEFAULT_MAX_REQUEST_BYTES) -> FastAPI:
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
        app.add_middleware(Authenticate, api_key=api_key)
    for kind, handler in ERROR_HANDLERS.items():
        app.add_exception_handler(kind, handler)
    routes = Routes(served, worker, max_request_bytes)
    app.get("/health")(routes.health)
    app.get("/v1/models")(routes.models)
    app.get("/v1/models/{model_id:path}")(routes.model)
    app.post("/v1/completions")(routes.completions)
    app.post("/v1/chat/completions")(routes.chat_completions)
    return app


async def _api_error(request, err: APIError):
    return error_response(err)


async def _http_error(request, err: HTTPException):
    return error_response(APIError(err.status_code, f"{request.method} {request.url.path}: {err.detail}",
                                   code="not_found" if err.status_code == 404 else None))


async def _validation_error(request, err: RequestValidationError):
    return error_response(bad_request(str(err)))


async def _internal_error(request, err: Exception):
    return error_response(APIError(500, f"internal error: {type(err).__name__}: {err}"))


# Every refusal is a JSON error in OpenAI's format, whatever raised it.
ERROR_HANDLERS = {APIError: _api_error, HTTPException: _http_error, RequestValidationError: _validation_error,
                  Exception: _internal_error}
