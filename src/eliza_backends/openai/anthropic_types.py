"""The wire shapes of Anthropic's Messages API (``/v1/messages``): the request, the message
object, its content blocks, the streamed events and the error body.

The request is strict (:func:`~.types.validate_body`): an unknown field is an error naming it.
Fields Anthropic defines that this server does not serve (``thinking`` enabled,
``mcp_servers``, ``container``, ``context_management``) are declared so that
:func:`unsupported_fields` refuses them by name. Content blocks are checked by the front-end
(:mod:`.anthropic_messages`), which names the block that is wrong; ``cache_control`` on a
block is accepted and has no effect (every session reuses its longest cached prefix anyway).
"""

from __future__ import annotations

from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field

_STRICT = ConfigDict(extra="forbid", strict=True)

#: Anthropic's stop reasons that this server produces.
StopReason = Literal["end_turn", "max_tokens", "stop_sequence", "tool_use"]


class InputMessage(BaseModel):
    """One message of the request: ``content`` is text or a list of blocks (``text``,
    ``tool_use`` in assistant turns, ``tool_result`` in user turns)."""

    model_config = _STRICT

    role: Literal["user", "assistant"]
    content: str | list[dict[str, Any]]


class MessagesRequest(BaseModel):
    """``POST /v1/messages`` (and, without ``max_tokens``, ``/v1/messages/count_tokens``).
    ``seed``, ``min_p``, ``repeat_penalty`` and ``ignore_eos`` are this server's extensions,
    as in chat requests."""

    model_config = _STRICT

    model: str | None = None
    messages: list[InputMessage] = Field(min_length=1)
    max_tokens: int | None = Field(None, ge=1)
    system: str | list[dict[str, Any]] | None = None
    stop_sequences: list[str] | None = None
    stream: bool = False
    temperature: float | None = Field(None, ge=0.0, le=1.0)
    top_p: float | None = Field(None, gt=0.0, le=1.0)
    top_k: int | None = Field(None, ge=0)
    tools: list[dict[str, Any]] | None = None
    tool_choice: dict[str, Any] | None = None
    metadata: dict[str, Any] | None = None
    service_tier: str | None = None
    seed: int | None = Field(None, ge=0, lt=1 << 32)
    min_p: float | None = Field(None, ge=0.0, le=1.0)
    repeat_penalty: float | None = Field(None, gt=0.0, le=10.0)
    ignore_eos: bool | None = None
    # Anthropic fields this server does not serve: refused by name when set
    thinking: dict[str, Any] | None = None
    mcp_servers: list[dict[str, Any]] | None = None
    container: str | dict[str, Any] | None = None
    context_management: dict[str, Any] | None = None


def unsupported_fields(request: MessagesRequest) -> list[tuple[str, str]]:
    """(field, message) for each Messages feature ``request`` asks for that this server does
    not serve (empty: all served)."""
    out = []
    if request.thinking and request.thinking.get("type") != "disabled":
        out.append(("thinking", "extended thinking is not supported by this server; leave "
                                "thinking out or set {'type': 'disabled'}"))
    for name in ("mcp_servers", "container", "context_management"):
        if getattr(request, name):
            out.append((name, f"{name} is not supported by this server"))
    return out


class TextBlock(BaseModel):
    """A ``text`` content block."""

    type: Literal["text"] = "text"
    text: str


class ToolUseBlock(BaseModel):
    """A ``tool_use`` content block: the call's ``id`` (what a ``tool_result`` answers), the
    tool's ``name`` and its ``input`` (the arguments, decoded)."""

    type: Literal["tool_use"] = "tool_use"
    id: str
    name: str
    input: dict[str, Any]


class MessageUsage(BaseModel):
    """Token counts, Anthropic's way: ``input_tokens`` are the prompt tokens prefilled for this
    request, ``cache_read_input_tokens`` those a session already held (their sum is the
    prompt)."""

    input_tokens: int
    output_tokens: int
    cache_read_input_tokens: int = 0
    cache_creation_input_tokens: int = 0


class Message(BaseModel):
    """The answer (``type="message"``): content blocks, why it stopped, usage."""

    id: str
    type: Literal["message"] = "message"
    role: Literal["assistant"] = "assistant"
    model: str
    content: list[TextBlock | ToolUseBlock] = Field(default_factory=list)
    stop_reason: StopReason | None = None
    stop_sequence: str | None = None
    usage: MessageUsage


class TokenCount(BaseModel):
    """The answer of ``/v1/messages/count_tokens``."""

    input_tokens: int


class MessageEvent(BaseModel):
    """One streamed event: ``type`` names it (it is also the server-sent event's name), the
    other fields are the event's (``message``, ``index``, ``content_block``, ``delta``,
    ``usage``)."""

    model_config = ConfigDict(extra="allow")

    type: str


#: Anthropic's error ``type`` by HTTP status (others: ``api_error``).
ERROR_TYPES = {400: "invalid_request_error", 401: "authentication_error",
               403: "permission_error", 404: "not_found_error", 413: "request_too_large",
               429: "rate_limit_error", 503: "overloaded_error", 529: "overloaded_error"}


def error_body(status: int, message: str) -> dict[str, Any]:
    """Anthropic's error body: ``{"type": "error", "error": {"type", "message"}}``."""
    return {"type": "error", "error": {"type": ERROR_TYPES.get(status, "api_error"),
                                       "message": message}}


__all__ = ["ERROR_TYPES", "InputMessage", "Message", "MessageEvent", "MessageUsage",
           "MessagesRequest", "StopReason", "TextBlock", "TokenCount", "ToolUseBlock",
           "error_body", "unsupported_fields"]
