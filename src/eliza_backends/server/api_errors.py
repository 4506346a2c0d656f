"""The HTTP errors of the API routes: OpenAI's error body for any exception, and server-sent
events.

Errors always have OpenAI's body, ``{"error": {"message", "type", "param", "code"}}``;
:func:`api_error` maps every exception a request can raise to its status (the table is
:mod:`eliza_backends.server.app`'s). Every endpoint, and the events of a streamed answer
(:mod:`eliza_backends.server.run`), answers errors through it.
"""

from __future__ import annotations

import json
import logging
from typing import Any

from starlette.responses import JSONResponse

from ..errors import ContextFullError, ElizaError, PoolClosedError, PoolFullError
from ..openai.types import ErrorDetail, ErrorResponse, RequestError

error_log = logging.getLogger("eliza_backends.server")


class ApiError(Exception):
    """An error response: HTTP ``status`` and OpenAI's error fields."""

    def __init__(self, status: int, message: str, *, type: str = "invalid_request_error",
                 param: str | None = None, code: str | None = None,
                 headers: dict[str, str] | None = None) -> None:
        super().__init__(message)
        self.status = status
        self.detail = ErrorDetail(message=message, type=type, param=param, code=code)
        self.headers = headers

    def body(self) -> dict[str, Any]:
        """The JSON body."""
        return ErrorResponse(error=self.detail).model_dump()

    def response(self) -> JSONResponse:
        """The HTTP response."""
        return JSONResponse(self.body(), status_code=self.status, headers=self.headers)


def api_error(exc: BaseException, *, prompt_param: str = "messages") -> ApiError:
    """The error response for any exception a request raised."""
    if isinstance(exc, ApiError):
        return exc
    if isinstance(exc, RequestError):
        return ApiError(400, exc.message, param=exc.param, code=exc.error_code)
    if isinstance(exc, ContextFullError):
        return ApiError(400, exc.message, param=prompt_param, code="context_length_exceeded")
    if isinstance(exc, PoolFullError):
        return ApiError(429, exc.message, type="rate_limit_error", code="rate_limit_exceeded",
                        headers={"Retry-After": "1"})
    if isinstance(exc, PoolClosedError):
        return ApiError(503, exc.message, type="server_error", code="service_unavailable")
    if isinstance(exc, ElizaError) and exc.code.symbol in (
            "ELIZA_ERR_INVALID_ARG", "ELIZA_ERR_UNSUPPORTED"):
        return ApiError(400, exc.message, code=exc.code.symbol)
    if isinstance(exc, ElizaError):
        return ApiError(500, exc.message, type="server_error", code=exc.code.symbol)
    error_log.error("unexpected error serving a request", exc_info=exc)
    return ApiError(500, f"internal error: {type(exc).__name__}: {exc}", type="server_error",
                    code="internal_error")


def sse(data: Any, event: str | None = None) -> bytes:
    """One server-sent event carrying ``data`` (a model, a dict, or ``"[DONE]"``), named
    ``event`` when given (the Responses and Anthropic streams name each event)."""
    if isinstance(data, str):
        text = data
    elif hasattr(data, "model_dump_json"):
        text = data.model_dump_json(exclude_none=True)
    else:
        text = json.dumps(data)
    head = f"event: {event}\n" if event else ""
    return f"{head}data: {text}\n\n".encode()


__all__ = ["ApiError", "api_error", "sse"]
