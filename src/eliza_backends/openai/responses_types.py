"""The wire shapes of OpenAI's Responses API (``/v1/responses``): the request, the response
object, its output items and the streamed events.

The request is strict like the chat request (:func:`~.types.validate_body`): an unknown field
is an error naming it. Fields that the Responses API defines but this server does not serve
(``background``, ``include``, ``reasoning``, ``max_tool_calls``, ``top_logprobs``, ``prompt``,
``conversation``, ``truncation: "auto"``, built-in tools) are declared so that
:func:`unsupported_fields` refuses them by name instead of calling them unknown. ``input``
items are checked by the front-end (:mod:`.responses`), which names the item that is wrong.

The response and event models carry exactly the API's field names, so
``model_dump(exclude_none=True)`` is what goes on the wire (and what the ``openai`` SDK reads).
"""

from __future__ import annotations

from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field

_STRICT = ConfigDict(extra="forbid", strict=True)

#: ``status`` of a response: ``incomplete`` when it stopped at ``max_output_tokens`` or the end
#: of the context window.
ResponseStatus = Literal["in_progress", "completed", "incomplete"]


class ResponsesRequest(BaseModel):
    """``POST /v1/responses``. ``input`` is a string (one user message) or a list of items
    (messages, ``function_call`` and ``function_call_output`` items). ``seed``, ``top_k``,
    ``min_p``, ``repeat_penalty`` and ``ignore_eos`` are this server's extensions, as in chat
    requests."""

    model_config = _STRICT

    model: str | None = None
    input: str | list[dict[str, Any]]
    instructions: str | None = None
    tools: list[dict[str, Any]] | None = None
    tool_choice: str | dict[str, Any] | None = None
    parallel_tool_calls: bool | None = None
    text: dict[str, Any] | None = None
    max_output_tokens: int | None = Field(None, ge=1)
    temperature: float | None = Field(None, ge=0.0, le=2.0)
    top_p: float | None = Field(None, gt=0.0, le=1.0)
    stream: bool = False
    stream_options: dict[str, Any] | None = None
    store: bool = True
    previous_response_id: str | None = None
    metadata: dict[str, str] | None = None
    user: str | None = None
    safety_identifier: str | None = None
    prompt_cache_key: str | None = None
    service_tier: str | None = None
    truncation: Literal["disabled", "auto"] | None = None
    seed: int | None = Field(None, ge=0, lt=1 << 32)
    top_k: int | None = Field(None, ge=0)
    min_p: float | None = Field(None, ge=0.0, le=1.0)
    repeat_penalty: float | None = Field(None, gt=0.0, le=10.0)
    ignore_eos: bool | None = None
    # Responses fields this server does not serve: refused by name when set
    background: bool | None = None
    include: list[str] | None = None
    reasoning: dict[str, Any] | None = None
    max_tool_calls: int | None = None
    top_logprobs: int | None = None
    prompt: dict[str, Any] | None = None
    conversation: str | dict[str, Any] | None = None


#: Request fields refused when set (to anything but null, false or an empty value), with
#: what to do instead.
REFUSED_FIELDS: dict[str, str] = {
    "background": "background mode is not supported; send the request and wait, or stream it",
    "include": "include is not supported (there are no built-in tool outputs or reasoning "
               "items to include)",
    "reasoning": "reasoning options are not supported by this server",
    "max_tool_calls": "max_tool_calls is not supported; use parallel_tool_calls: false for "
                      "at most one call",
    "top_logprobs": "top_logprobs is not supported on /v1/responses; use "
                    "/v1/chat/completions with logprobs",
    "prompt": "prompt templates are not supported; send input (and instructions)",
    "conversation": "conversations are not supported; chain responses with "
                    "previous_response_id",
}


def unsupported_fields(request: ResponsesRequest) -> list[tuple[str, str]]:
    """(field, message) for each Responses feature ``request`` asks for that this server does
    not serve (empty: all served)."""
    out = [(name, why) for name, why in REFUSED_FIELDS.items() if getattr(request, name)]
    if request.truncation == "auto":
        out.append(("truncation", "truncation 'auto' is not supported: a conversation that "
                                  "does not fit the context window is an error"))
    if request.tool_choice not in (None, "none") and not request.tools:
        out.append(("tool_choice", "tool_choice needs tools"))
    return out


class InputTokensDetails(BaseModel):
    """``usage.input_tokens_details``: ``cached_tokens`` were already in the session."""

    cached_tokens: int = 0


class OutputTokensDetails(BaseModel):
    """``usage.output_tokens_details`` (no reasoning tokens here)."""

    reasoning_tokens: int = 0


class ResponseUsage(BaseModel):
    """Token counts of one response."""

    input_tokens: int
    input_tokens_details: InputTokensDetails = Field(default_factory=InputTokensDetails)
    output_tokens: int
    output_tokens_details: OutputTokensDetails = Field(default_factory=OutputTokensDetails)
    total_tokens: int


class OutputText(BaseModel):
    """One ``output_text`` part of an output message."""

    type: Literal["output_text"] = "output_text"
    text: str
    annotations: list[Any] = Field(default_factory=list)
    logprobs: list[Any] = Field(default_factory=list)


class OutputMessage(BaseModel):
    """An assistant ``message`` output item."""

    id: str
    type: Literal["message"] = "message"
    role: Literal["assistant"] = "assistant"
    status: ResponseStatus
    content: list[OutputText] = Field(default_factory=list)


class FunctionCallItem(BaseModel):
    """A ``function_call`` output item: ``arguments`` is JSON text; ``call_id`` is what a
    ``function_call_output`` item answers."""

    id: str
    type: Literal["function_call"] = "function_call"
    call_id: str
    name: str
    arguments: str
    status: ResponseStatus = "completed"


OutputItem = OutputMessage | FunctionCallItem


class IncompleteDetails(BaseModel):
    """Why a response is ``incomplete``."""

    reason: Literal["max_output_tokens"] = "max_output_tokens"


class Response(BaseModel):
    """A response object (``object="response"``): the request's settings echoed, the output
    items, the usage."""

    model_config = ConfigDict(extra="allow")

    id: str
    object: Literal["response"] = "response"
    created_at: int
    status: ResponseStatus
    model: str
    output: list[OutputItem] = Field(default_factory=list)
    usage: ResponseUsage | None = None
    incomplete_details: IncompleteDetails | None = None
    instructions: str | None = None
    max_output_tokens: int | None = None
    previous_response_id: str | None = None
    parallel_tool_calls: bool = True
    temperature: float | None = None
    top_p: float | None = None
    tool_choice: str | dict[str, Any] = "auto"
    tools: list[dict[str, Any]] = Field(default_factory=list)
    text: dict[str, Any] = Field(default_factory=lambda: {"format": {"type": "text"}})
    truncation: str = "disabled"
    store: bool = True
    metadata: dict[str, str] = Field(default_factory=dict)

    @property
    def output_text(self) -> str:
        """The text of all output messages, joined (as the SDK's property)."""
        return "".join(part.text for item in self.output if isinstance(item, OutputMessage)
                       for part in item.content)


class ResponseDeleted(BaseModel):
    """The answer of ``DELETE /v1/responses/{id}``."""

    id: str
    object: Literal["response.deleted"] = "response.deleted"
    deleted: bool = True


class ResponseEvent(BaseModel):
    """One streamed event: ``type`` names it (it is also the server-sent event's name), the
    other fields are the event's (``response``, ``item``, ``delta``, ...)."""

    model_config = ConfigDict(extra="allow")

    type: str
    sequence_number: int


__all__ = ["REFUSED_FIELDS", "FunctionCallItem", "IncompleteDetails", "InputTokensDetails",
           "OutputItem", "OutputMessage", "OutputText", "OutputTokensDetails", "Response",
           "ResponseDeleted", "ResponseEvent", "ResponseStatus", "ResponseUsage",
           "ResponsesRequest", "unsupported_fields"]
