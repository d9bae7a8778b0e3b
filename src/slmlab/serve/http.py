"""The server's HTTP plumbing: errors as OpenAI-format JSON, the API-key middleware, request bodies
read up to a size limit, and server-sent events."""

from __future__ import annotations

import hmac
import json

from fastapi import Request
from fastapi.responses import JSONResponse
from starlette.requests import ClientDisconnect

from .errors import APIError

DEFAULT_MAX_REQUEST_BYTES = 4 * 1024 * 1024  # 4 MiB: ~1M prompt tokens of English text, far past any context
DRAIN_BYTES = 64 * 1024 * 1024  # an oversized body is read (and dropped) up to this, so the client gets the 413


class _ErrorJSON(JSONResponse):
    """A JSON error body with every non-ASCII character escaped, so no message can fail to encode."""

    def render(self, content) -> bytes:
        return json.dumps(content, ensure_ascii=True, separators=(",", ":")).encode("ascii")


def error_response(err: APIError) -> JSONResponse:
    """``err`` as a JSON response in OpenAI's format, with its status and headers."""
    return _ErrorJSON(err.body(), status_code=err.status, headers=err.headers)


class Authenticate:
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
                response = error_response(APIError(401, "missing or wrong API key: send 'Authorization: Bearer"
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


async def read_body(request: Request, max_request_bytes: int) -> bytes:
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


def sse(payload) -> str:
    """One server-sent event: ``data: <payload as JSON, or a string as it is>`` and a blank line."""
    return f"data: {json.dumps(payload, ensure_ascii=False) if not isinstance(payload, str) else payload}\n\n"
