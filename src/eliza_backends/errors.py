"""Status codes and the typed exception tree: every exception this library raises is here.

The seed's C ABI returns ``>= 0`` on success and a negative ``ELIZA_*`` constant on failure. In
Python every failure is an :class:`ElizaError` carrying that code, so callers can catch at the
level they care about (``ElizaError`` for everything, a subclass for one kind of failure) and a
host that still speaks the C ABI can map an exception back to its status with ``error.code``.

Every message says what went wrong *and* what to do about it.

The hierarchy (status code in brackets)::

    ElizaError                          [ERR_RUNTIME unless a subclass says otherwise]
    ├── InvalidArgumentError (ValueError)   [ERR_INVALID_ARG]
    │   ├── ContextFullError                [ERR_CONTEXT_FULL]
    │   ├── ConstraintError                 the constraint engine gave up mid-generation
    │   ├── MediaError                      an image or audio clip that cannot be used
    │   ├── TemplateError                   chat template failed or broke the sandbox
    │   │   └── TemplateLimitError          ran past a RenderLimits bound
    │   └── RequestError                    an OpenAI-shaped request that does not validate
    ├── CancelledError                  [ERR_CANCELLED]
    ├── BackendSelectionError           [ERR_BACKEND_UNAVAILABLE]
    ├── MissingToolError                [ERR_BACKEND_UNAVAILABLE] a converter tool is missing
    ├── BundleError                     [ERR_BUNDLE]
    ├── SlotError                       [ERR_SLOT]
    ├── UnsupportedOperationError       [ERR_UNSUPPORTED]
    ├── SessionClosedError              [ERR_CLOSED]
    ├── SessionBusyError                [ERR_BUSY]
    ├── PoolFullError                   [ERR_BUSY] the server's pool and queue are full (429)
    ├── PoolClosedError                 [ERR_CLOSED] the server's pool is shutting down (503)
    ├── PluginError                     [ERR_PLUGIN]
    └── BackendRuntimeError             [ERR_RUNTIME]

:func:`describe_validation_error` turns a pydantic ``ValidationError`` into the one-line
message these exceptions carry (this module imports nothing but the standard library).
"""

from __future__ import annotations

from enum import IntEnum
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from pydantic import ValidationError


class Status(IntEnum):
    """The ``ELIZA_*`` status codes. ``OK`` is 0; every failure is negative."""

    OK = 0
    ERR_INVALID_ARG = -1
    ERR_CANCELLED = -2
    ERR_BACKEND_UNAVAILABLE = -3
    ERR_CANNOT_SERVE = -4
    ERR_BUNDLE = -5
    ERR_IO = -6
    ERR_RUNTIME = -7
    ERR_CLOSED = -8
    ERR_UNSUPPORTED = -9
    ERR_CONTEXT_FULL = -10
    ERR_BUSY = -11
    ERR_PLUGIN = -12
    ERR_SLOT = -13
    ERR_BACKEND_NOT_INSTALLED = -14

    @property
    def symbol(self) -> str:
        """The C constant's name, e.g. ``ELIZA_ERR_CANCELLED``."""
        return f"ELIZA_{self.name}"


class ElizaError(Exception):
    """Base of every error this library raises.

    ``code`` is the :class:`Status`; ``message`` the human text (also ``str(error)``).
    """

    default_code: Status = Status.ERR_RUNTIME

    def __init__(self, message: str, *, code: Status | None = None) -> None:
        super().__init__(message)
        self.code: Status = code if code is not None else self.default_code
        self.message = message

    def __str__(self) -> str:
        return f"{self.message} [{self.code.symbol}]"


class InvalidArgumentError(ElizaError, ValueError):
    """A caller passed a value the contract does not accept (bad token id, bad config...)."""

    default_code = Status.ERR_INVALID_ARG


class ConstraintError(InvalidArgumentError):
    """An output constraint the constraint engine gave up on while generating (a grammar that
    outgrows its parser limits): the request's fault. The session undoes the step and ends
    the turn (prefill again); it stays usable."""

    default_code = Status.ERR_INVALID_ARG


class ContextFullError(InvalidArgumentError):
    """The tokens would not fit in the session's context window."""

    default_code = Status.ERR_CONTEXT_FULL


class CancelledError(ElizaError):
    """The operation stopped because :meth:`Session.cancel` was called.

    The session keeps raising it until ``reset()`` or ``reset_keep()`` is called.
    """

    default_code = Status.ERR_CANCELLED


class BackendSelectionError(ElizaError):
    """No backend could be selected, or an explicitly requested one cannot be used."""

    default_code = Status.ERR_BACKEND_UNAVAILABLE


class BundleError(ElizaError):
    """The model bundle is missing, malformed, or does not match its manifest."""

    default_code = Status.ERR_BUNDLE


class SlotError(ElizaError):
    """A saved slot file is truncated, corrupted, or was made by another model or runtime."""

    default_code = Status.ERR_SLOT


class UnsupportedOperationError(ElizaError):
    """The backend does not offer this optional operation (see ``Session.capabilities``)."""

    default_code = Status.ERR_UNSUPPORTED


class SessionClosedError(ElizaError):
    """The session (or its inference context) was closed; open a new one."""

    default_code = Status.ERR_CLOSED


class SessionBusyError(ElizaError):
    """Two threads used one session at once; a session has a single consumer."""

    default_code = Status.ERR_BUSY


class PluginError(ElizaError):
    """A backend plugin failed to load or returned something that is not a Factory."""

    default_code = Status.ERR_PLUGIN


class BackendRuntimeError(ElizaError):
    """The runtime underneath a backend reported a failure."""

    default_code = Status.ERR_RUNTIME


class MediaError(InvalidArgumentError):
    """An image or audio clip that cannot be used: corrupt or truncated, in an unsupported
    format, too large (a decompression bomb, audio too long), at a rate that cannot be
    resampled, a data URI that is not base64, a URL or file this process may not read. Raised
    while the media is decoded, before any session or native call."""


class TemplateError(InvalidArgumentError):
    """A chat template failed to compile or render, or tried something the sandbox forbids."""


class TemplateLimitError(TemplateError):
    """A chat template ran past a :class:`~eliza_backends.prompt.chat.RenderLimits` bound
    (time, memory, output)."""


class RequestError(InvalidArgumentError):
    """A request that does not validate; ``param`` is the field OpenAI's error body names."""

    def __init__(self, message: str, *, param: str | None,
                 error_code: str | None = None) -> None:
        super().__init__(message)
        self.param = param
        self.error_code = error_code


class MissingToolError(ElizaError):
    """A converter tool is not installed (``ELIZA_ERR_BACKEND_UNAVAILABLE``)."""

    default_code = Status.ERR_BACKEND_UNAVAILABLE


class PoolFullError(ElizaError):
    """Every session is busy and the wait queue is full: retry later (HTTP 429)."""

    default_code = Status.ERR_BUSY


class PoolClosedError(ElizaError):
    """The pool is shutting down and takes no new requests (HTTP 503)."""

    default_code = Status.ERR_CLOSED


def describe_validation_error(exc: ValidationError, what: str) -> str:
    """One readable message for a pydantic error: each problem on its own line."""
    problems = []
    for err in exc.errors():
        where = ".".join(str(p) for p in err["loc"]) or what
        msg = err["msg"].removeprefix("Value error, ")
        if err["type"] == "extra_forbidden":
            msg = "unknown field (check the spelling; see the field list in the docs)"
        problems.append(f"{where}: {msg}")
    return f"invalid {what}: " + "; ".join(problems)


__all__ = [
    "BackendRuntimeError",
    "BackendSelectionError",
    "BundleError",
    "CancelledError",
    "ConstraintError",
    "ContextFullError",
    "ElizaError",
    "InvalidArgumentError",
    "MediaError",
    "MissingToolError",
    "PluginError",
    "PoolClosedError",
    "PoolFullError",
    "RequestError",
    "SessionBusyError",
    "SessionClosedError",
    "SlotError",
    "Status",
    "TemplateError",
    "TemplateLimitError",
    "UnsupportedOperationError",
    "describe_validation_error",
]
