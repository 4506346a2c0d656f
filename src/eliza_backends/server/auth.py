"""Access control: the API key every request but ``GET /health`` must carry.

:class:`ApiKeyGuard` is ASGI middleware. With a key set (``serve --api-key KEY``, or the
:data:`API_KEY_ENV` environment variable), a request is let through when it sends
``Authorization: Bearer KEY`` (OpenAI's clients) or ``x-api-key: KEY`` (Anthropic's); any
other request, to any path but :data:`OPEN_PATHS` (an unknown route too, so the guard tells
nothing about the routes), gets 401 with OpenAI's error body (``code: invalid_api_key``; Anthropic's
``authentication_error`` body on ``/v1/messages``) and a
``WWW-Authenticate: Bearer`` header. The comparison takes the same time wherever the sent key
first differs (:func:`hmac.compare_digest` over SHA-256 digests, so not even the key's length
leaks). The key is never logged: the access log records neither headers nor the key, and the
401's message does not repeat what was sent.

:func:`exposure_warning` is the line a server bound beyond loopback without a key logs at
startup. The module imports no web framework at its top (``serve`` checks a key and warns
before the model loads; the 401's response types are imported when one is sent).
"""

from __future__ import annotations

import hashlib
import hmac
import ipaddress
from typing import TYPE_CHECKING

from ..errors import InvalidArgumentError

if TYPE_CHECKING:
    from starlette.responses import Response
    from starlette.types import ASGIApp, Receive, Scope, Send

#: The environment variable ``eliza-backends serve`` reads the key from when ``--api-key`` is
#: not given (a command line is visible to every user of the machine in ``ps``; the
#: environment is not).
API_KEY_ENV = "ELIZA_API_KEY"

#: Paths served without a key (a load balancer's health check has none).
OPEN_PATHS = frozenset({"/health"})
#: Paths whose 401 has Anthropic's error body (``authentication_error``), not OpenAI's.
ANTHROPIC_PATHS = ("/v1/messages",)


def _digest(key: bytes) -> bytes:
    return hashlib.sha256(key).digest()


def check_api_key(key: str) -> str:
    """``key`` if it can be an API key: non-empty printable ASCII without spaces (what an
    HTTP header carries); else :class:`InvalidArgumentError` (the message does not repeat
    the key)."""
    if not key or not key.isascii() or not key.isprintable() or " " in key:
        raise InvalidArgumentError(
            f"the API key must be non-empty printable ASCII without spaces (it travels in an "
            f"HTTP header); check --api-key or ${API_KEY_ENV}")
    return key


def sent_keys(scope: Scope) -> list[bytes]:
    """The keys a request sends: the token of ``Authorization: Bearer ...`` and the value of
    ``x-api-key`` (either header, any case)."""
    keys = []
    for name, value in scope.get("headers", ()):
        if name == b"authorization":
            scheme, _, token = value.strip().partition(b" ")
            if scheme.lower() == b"bearer":
                keys.append(token.strip())
        elif name == b"x-api-key":
            keys.append(value.strip())
    return keys


class ApiKeyGuard:
    """ASGI middleware: 401 for every request without the key (see the module doc)."""

    def __init__(self, app: ASGIApp, key: str) -> None:
        self.app = app
        self._digest = _digest(check_api_key(key).encode("ascii"))

    def allows(self, scope: Scope) -> bool:
        """True when the request may pass: an open path, or a sent key equal to ours."""
        if scope["path"] in OPEN_PATHS:
            return True
        ok = False
        for sent in sent_keys(scope):  # every candidate compared: no early exit
            ok |= hmac.compare_digest(_digest(sent), self._digest)
        return ok

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http" or self.allows(scope):
            await self.app(scope, receive, send)
            return
        sent = bool(sent_keys(scope))
        message = ("the API key is not valid for this server" if sent else
                   "this server needs an API key: send it as 'Authorization: Bearer KEY' "
                   "(OpenAI clients: api_key=KEY) or 'x-api-key: KEY'")
        from starlette.responses import JSONResponse  # imported by the app already

        from ..openai.anthropic_types import error_body
        from .api_errors import ApiError

        headers = {"WWW-Authenticate": "Bearer"}
        if scope.get("path", "").startswith(ANTHROPIC_PATHS):  # Anthropic's clients read theirs
            response: Response = JSONResponse(error_body(401, message), 401, headers=headers)
        else:
            response = ApiError(401, message, code="invalid_api_key", headers=headers).response()
        await response(scope, receive, send)


def is_loopback(host: str) -> bool:
    """True when ``host`` (an address or ``localhost``) is reachable from this machine only."""
    if host.lower() == "localhost":
        return True
    try:
        return ipaddress.ip_address(host.strip("[]")).is_loopback
    except ValueError:
        return False  # a host name: it may resolve to any interface


def exposure_warning(host: str, api_key: str | None) -> str | None:
    """The startup warning of a server on ``host`` without a key, or None when it needs
    none (a key is set, or it listens on loopback only)."""
    if api_key or is_loopback(host):
        return None
    return (f"listening on {host} without an API key: anyone who can reach this address can "
            f"use the model; pass --api-key KEY (or set ${API_KEY_ENV}), or --host 127.0.0.1")


__all__ = ["API_KEY_ENV", "OPEN_PATHS", "ApiKeyGuard", "check_api_key", "exposure_warning",
           "is_loopback", "sent_keys"]
