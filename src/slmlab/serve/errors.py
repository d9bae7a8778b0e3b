"""Errors in the OpenAI format: ``{"error": {"message", "type", "param", "code"}}`` with an HTTP status.

Every refusal of the server is an :class:`APIError`; the app turns it into a JSON response (or, once
a stream has started, into a last ``data: {"error": ...}`` event), so a client never sees a
traceback and the server keeps answering.
"""

from __future__ import annotations


class APIError(Exception):
    """A refusal with its HTTP status, in the shape OpenAI's API returns.

    Args:
        status: the HTTP status (400 bad request, 401, 404 unknown model, 503 overloaded, ...).
        message: what is wrong and what to do.
        param: the request field at fault, or None.
        code: a short machine-readable code (``context_length_exceeded``, ``model_not_found``, ...).
        headers: extra response headers (``Retry-After`` on 503).
    """

    def __init__(self, status: int, message: str, param: str | None = None, code: str | None = None,
                 headers: dict[str, str] | None = None) -> None:
        super().__init__(message)
        self.status = status
        self.message = message
        self.param = param
        self.code = code
        self.headers = dict(headers or {})

    @property
    def type(self) -> str:
        if self.status == 401:
            return "authentication_error"
        if self.status == 404:
            return "not_found_error"
        if self.status >= 500:
            return "server_error"
        return "invalid_request_error"

    def body(self) -> dict:
        return {"error": {"message": self.message, "type": self.type, "param": self.param, "code": self.code}}


def bad_request(message: str, param: str | None = None, code: str | None = None) -> APIError:
    return APIError(400, message, param, code)
