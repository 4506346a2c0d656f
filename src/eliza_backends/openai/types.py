"""The OpenAI wire shapes: chat and text completion requests, responses, chunks, errors.

Pydantic models of the subset of OpenAI's Chat Completions and (legacy) Completions API that
:mod:`eliza_backends.openai.local` and the server speak. Requests are strict: an unknown
field, a wrong type or a value out of range is an
:class:`~eliza_backends.errors.InvalidArgumentError` naming the field. ``response_format``,
``tools`` / ``tool_choice`` and ``logprobs`` / ``top_logprobs`` are served (see
:mod:`eliza_backends.openai.tools`); fields that OpenAI defines but this project does not implement
(penalties, ``logit_bias``) are declared, so :func:`unsupported_fields` can refuse them with a
message instead of calling them unknown.

:func:`parse_request` is the one validation layer every request goes through (the server's
bodies, :func:`~eliza_backends.openai.local.chat_completion`, Ray batch rows): the JSON text is
decoded there, nesting deeper than :data:`MAX_DEPTH` is refused before anything walks it, the
request models are pydantic *strict* (``"max_tokens": "16"`` or ``"stream": "yes"`` is an
error, not coerced), earlier assistant ``tool_calls`` are typed, and a constraint that does
not compile is refused; each failure is a :class:`RequestError` naming the field.

Responses carry exactly OpenAI's field names, so ``model_dump(exclude_none=True)`` is what goes
on the wire. ``usage.prompt_tokens_details.cached_tokens`` reports the prompt tokens that a
session already held (prefix reuse), as OpenAI does for its prompt cache.
"""

from __future__ import annotations

import json
from typing import Annotated, Any, Literal, TypeVar

from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator

from ..errors import InvalidArgumentError, RequestError, describe_validation_error
from ..structured.constraint import Constraint
from ..structured.logits import OutputSpec
from .replies import (
    AssistantMessage,
    ChatChoice,
    ChatCompletion,
    ChatCompletionChunk,
    ChoiceDelta,
    ChoiceLogprobs,
    ChunkChoice,
    Completion,
    CompletionChoice,
    CompletionLogprobs,
    ErrorDetail,
    ErrorResponse,
    FunctionCall,
    LogprobItem,
    ModelCard,
    ModelList,
    OpenAIFinishReason,
    PromptTokensDetails,
    ToolCall,
    ToolCallDelta,
    TopLogprobItem,
    Usage,
    completion_id,
    now,
)
from .tools import Tool, chosen_tools, parse_tools, reply_constraint

_STRICT = ConfigDict(extra="forbid", strict=True)

#: The deepest nesting of arrays and objects a request may have (a JSON schema or tool
#: parameters nest a few levels; thousands only exhaust the stack of whatever walks them).
MAX_DEPTH = 64
_Model = TypeVar("_Model", bound=BaseModel)


# --------------------------------------------------------------------------- requests


class TextPart(BaseModel):
    """One ``{"type": "text", "text": ...}`` part of a message's content."""

    model_config = _STRICT

    type: Literal["text"]
    text: str


class ImageUrl(BaseModel):
    """``image_url`` of an image part: a ``data:image/...;base64,`` URI (a local path or
    ``file://`` URL only where the server allows local files; remote URLs are never fetched).
    ``detail`` is accepted and ignored (the model's processor picks the resolution)."""

    model_config = _STRICT

    url: str
    detail: Literal["auto", "low", "high"] | None = None


class ImagePart(BaseModel):
    """One ``{"type": "image_url", "image_url": {"url": ...}}`` part of a message's content."""

    model_config = _STRICT

    type: Literal["image_url"]
    image_url: ImageUrl


class InputAudio(BaseModel):
    """``input_audio`` of an audio part: base64 bytes and their format."""

    model_config = _STRICT

    data: str
    format: Literal["wav", "mp3", "flac"]


class AudioPart(BaseModel):
    """One ``{"type": "input_audio", "input_audio": {"data": ..., "format": ...}}`` part."""

    model_config = _STRICT

    type: Literal["input_audio"]
    input_audio: InputAudio


ContentPart = Annotated[TextPart | ImagePart | AudioPart, Field(discriminator="type")]


class CalledFunction(BaseModel):
    """The function of an earlier assistant turn's tool call: ``arguments`` is JSON text
    (OpenAI's form) or the decoded object."""

    model_config = ConfigDict(extra="allow", strict=True)

    name: str
    arguments: str | dict[str, Any] = "{}"


class CalledTool(BaseModel):
    """One ``tool_calls`` item of an earlier assistant message."""

    model_config = ConfigDict(extra="allow", strict=True)

    id: str | None = None
    type: Literal["function"] = "function"
    function: CalledFunction


class ChatMessage(BaseModel):
    """One chat message. ``content`` is text or a list of parts: text (joined on use), images
    and audio clips (decoded by :mod:`eliza_backends.media` when the prompt is built);
    ``developer`` is OpenAI's newer name for ``system`` and is rendered as one."""

    model_config = _STRICT

    role: Literal["system", "developer", "user", "assistant", "tool"]
    content: str | list[ContentPart] | None = None
    name: str | None = None
    tool_calls: list[CalledTool] | None = None
    tool_call_id: str | None = None

    def text(self) -> str:
        """The content as one string."""
        if self.content is None:
            return ""
        if isinstance(self.content, str):
            return self.content
        return "".join(part.text for part in self.content if isinstance(part, TextPart))

    @property
    def has_media(self) -> bool:
        """True when the content holds an image or audio part."""
        return isinstance(self.content, list) and any(
            not isinstance(part, TextPart) for part in self.content)

    def for_template(self, *, text_only: bool = False) -> dict[str, Any]:
        """The dict a chat template renders (``developer`` becomes ``system``; tool calls and
        the id a tool result answers are kept, for
        :func:`~eliza_backends.openai.tools.prepare_messages`). Content with media stays a
        list of parts (OpenAI's shape, read by :meth:`~eliza_backends.Stream.chat_elements`)
        unless ``text_only``."""
        content: Any = self.text()
        if isinstance(self.content, list) and self.has_media and not text_only:
            content = [part.model_dump(exclude_none=True) for part in self.content]
        out: dict[str, Any] = {"role": "system" if self.role == "developer" else self.role,
                               "content": content}
        if self.name is not None:
            out["name"] = self.name
        if self.tool_calls:
            out["tool_calls"] = [c.model_dump(exclude_none=True) for c in self.tool_calls]
        if self.tool_call_id is not None:
            out["tool_call_id"] = self.tool_call_id
        return out


class StreamOptions(BaseModel):
    """``stream_options``: ``include_usage`` adds a last chunk with the usage and no
    choices."""

    model_config = _STRICT

    include_usage: bool = False


class GenerationRequest(BaseModel):
    """What chat and text completion requests share: the model and the sampling fields.

    ``max_tokens`` None means: until the end of generation or of the context window. ``seed``
    None means the server's (or ``StreamConfig``'s) seed, so a repeated sampled request
    repeats its answer. ``top_k``, ``min_p`` and ``repeat_penalty`` are extensions that
    llama.cpp's server accepts too.
    """

    model_config = _STRICT

    model: str | None = None
    stream: bool = False
    stream_options: StreamOptions | None = None
    max_tokens: int | None = Field(None, ge=1)
    temperature: float | None = Field(None, ge=0.0, le=2.0)
    top_p: float | None = Field(None, gt=0.0, le=1.0)
    seed: int | None = Field(None, ge=0, lt=1 << 32)
    stop: str | list[str] | None = None
    n: int = Field(1, ge=1, le=16)
    user: str | None = None
    top_k: int | None = Field(None, ge=0)
    min_p: float | None = Field(None, ge=0.0, le=1.0)
    repeat_penalty: float | None = Field(None, gt=0.0, le=10.0)
    ignore_eos: bool | None = None
    # OpenAI fields that are not implemented yet: refused when set to anything but the default
    frequency_penalty: float | None = None
    presence_penalty: float | None = None
    logit_bias: dict[str, float] | None = None
    logprobs: bool | int | None = None

    @field_validator("stop")
    @classmethod
    def _stop_strings(cls, value: str | list[str] | None) -> str | list[str] | None:
        stops = [value] if isinstance(value, str) else value or []
        if len(stops) > 4:
            raise ValueError("at most 4 stop strings")
        if any(not s for s in stops):
            raise ValueError("stop strings must be non-empty")
        return value

    @property
    def stop_strings(self) -> tuple[str, ...]:
        """``stop`` as a tuple."""
        if self.stop is None:
            return ()
        return (self.stop,) if isinstance(self.stop, str) else tuple(self.stop)

    @property
    def include_usage(self) -> bool:
        """Whether a streamed response ends with a usage chunk."""
        return self.stream_options is not None and self.stream_options.include_usage


class ChatCompletionRequest(GenerationRequest):
    """``POST /v1/chat/completions``."""

    messages: list[ChatMessage]
    max_completion_tokens: int | None = Field(None, ge=1)
    top_logprobs: int | None = Field(None, ge=0, le=20)
    response_format: dict[str, Any] | None = None
    tools: list[dict[str, Any]] | None = None
    tool_choice: str | dict[str, Any] | None = None
    parallel_tool_calls: bool | None = None

    @field_validator("messages")
    @classmethod
    def _some_messages(cls, value: list[ChatMessage]) -> list[ChatMessage]:
        if not value:
            raise ValueError("send at least one message, e.g. [{\"role\": \"user\", "
                             "\"content\": \"Hello\"}]")
        return value

    @property
    def token_budget(self) -> int | None:
        """``max_completion_tokens`` (OpenAI's newer name) or ``max_tokens``."""
        return self.max_completion_tokens or self.max_tokens


class CompletionRequest(GenerationRequest):
    """``POST /v1/completions``: one prompt, as text or token ids."""

    prompt: str | list[int] | list[str] = Field(min_length=1)
    echo: bool = False
    suffix: str | None = None
    best_of: int | None = None

    @field_validator("prompt")
    @classmethod
    def _one_prompt(cls, value: str | list[int] | list[str]) -> str | list[int] | list[str]:
        if isinstance(value, list) and value and isinstance(value[0], str) and len(value) != 1:
            raise ValueError("send one prompt per request (a list of several prompts is a "
                             "batch, which this server does not take)")
        return value

    @property
    def token_budget(self) -> int | None:
        """``max_tokens``."""
        return self.max_tokens


def unsupported_fields(request: GenerationRequest) -> list[str]:
    """The OpenAI features ``request`` asks for that this project does not implement yet,
    one line each (empty: everything asked for is supported)."""
    out = []
    if request.frequency_penalty or request.presence_penalty:
        out.append("frequency_penalty/presence_penalty are not supported; use repeat_penalty "
                   "(1.0 disables, 1.1 is a common choice)")
    if request.logit_bias:
        out.append("logit_bias is not supported yet")
    if isinstance(request, ChatCompletionRequest):
        if request.top_logprobs and not request.logprobs:
            out.append("top_logprobs needs logprobs: true")
        if isinstance(request.logprobs, int) and not isinstance(request.logprobs, bool):
            out.append("logprobs is a boolean in chat completions (use top_logprobs for the "
                       "number of alternatives)")
        if request.response_format is not None and request.tools:
            out.append("response_format and tools cannot be combined (a tool-call reply has "
                       "its own format)")
        if request.tool_choice not in (None, "none") and not request.tools:
            out.append("tool_choice needs tools")
    if isinstance(request, CompletionRequest) and (request.logprobs is True or (
            isinstance(request.logprobs, int) and not 0 <= request.logprobs <= 20)):
        out.append("logprobs is the number of alternatives (0..20) in text completions")
    if isinstance(request, CompletionRequest):
        if request.echo:
            out.append("echo is not supported")
        if request.suffix:
            out.append("suffix is not supported")
        if request.best_of not in (None, 1):
            out.append("best_of is not supported (send n requests)")
    return out


def request_output(request: GenerationRequest) -> tuple[OutputSpec | None, list[Tool] | None]:
    """The :class:`~eliza_backends.structured.logits.OutputSpec` (constraint, logprobs) and the
    tools of ``request``; a malformed ``response_format``, ``tools`` or ``tool_choice`` is a
    :class:`RequestError` naming the field."""
    constraint: Constraint | None = None
    tools: list[Tool] | None = None
    if isinstance(request, ChatCompletionRequest):
        logprobs, top = bool(request.logprobs), request.top_logprobs or 0
        field = "response_format"
        try:
            if request.response_format is not None:
                constraint = Constraint.from_response_format(request.response_format)
            if request.tools:
                field = "tools"
                tools = parse_tools(request.tools)
                field = "tool_choice"
                chosen_tools(tools, request.tool_choice)
                field = "tools"  # a parameters schema that does not compile
                constraint = reply_constraint(tools, request.tool_choice,
                                              request.parallel_tool_calls)
            spec = OutputSpec(constraint, logprobs, top)  # compiles the constraint
        except InvalidArgumentError as exc:
            raise RequestError(exc.message, param=field) from None
    else:
        n = request.logprobs
        logprobs, top = n is not None and n is not False, int(n or 0)
        spec = OutputSpec(None, logprobs, top)
    return (spec if spec.active else None), tools


def decode_body(body: bytes | bytearray | str) -> Any:
    """A request body's JSON text, decoded; :class:`RequestError` when it is not JSON (or
    nests so deep that the decoder runs out of stack)."""
    try:
        return json.loads(body)
    except (ValueError, RecursionError) as exc:
        why = f"nested deeper than {MAX_DEPTH} levels" if isinstance(exc, RecursionError) \
            else str(exc)
        raise RequestError(f"the request body is not valid JSON ({why}); send a JSON object "
                           "with Content-Type: application/json", param=None) from None


def too_deep(data: Any, limit: int = MAX_DEPTH) -> str | None:
    """The path (``messages.0.content``) of the first place where ``data`` nests lists and
    dicts deeper than ``limit``, or None. Iterative: it never recurses itself."""
    todo: list[tuple[Any, int, str]] = [(data, 0, "")]
    while todo:
        value, depth, path = todo.pop()
        if isinstance(value, dict):
            items: Any = value.items()
        elif isinstance(value, list | tuple):
            items = enumerate(value)
        else:
            continue
        if depth >= limit:
            return path or "(body)"
        todo.extend((v, depth + 1, f"{path}.{k}" if path else str(k)) for k, v in items)
    return None


def parse_request(model: type[GenerationRequest], data: Any) -> Any:
    """Validate a request as ``model``: ``data`` is the body (JSON ``bytes``/``str``) or the
    decoded object. Every problem, and every unsupported feature, in one
    :class:`RequestError` (an :class:`InvalidArgumentError`; its ``param`` names the first
    offending field)."""
    request = validate_body(model, data)
    problems = unsupported_fields(request)
    if problems:
        raise RequestError("; ".join(problems), param=None)
    request_output(request)  # a bad response_format / tools is refused before any work
    return request


def validate_body(model: type[_Model], data: Any) -> _Model:
    """``data`` (a JSON body, or the decoded object) validated as ``model``: decoded, refused
    when nested deeper than :data:`MAX_DEPTH`, validated strictly; each failure is a
    :class:`RequestError` naming the field. Every API front-end's request goes through it."""
    if isinstance(data, bytes | bytearray | str):
        data = decode_body(data)
    if not isinstance(data, dict):
        raise RequestError("the request body must be a JSON object", param=None)
    where = too_deep(data)
    if where is not None:
        parts = where.split(".")
        shown = ".".join(parts[:6]) + (".…" if len(parts) > 6 else "")
        raise RequestError(f"{shown}: nested deeper than {MAX_DEPTH} levels; send a flatter "
                           "request", param=".".join(parts[:4]))
    try:
        request = model.model_validate(data)
    except ValidationError as exc:
        first = exc.errors()[0]["loc"]
        raise RequestError(describe_validation_error(exc, "request"),
                           param=".".join(str(p) for p in first) or None) from None
    return request


__all__ = [
    "MAX_DEPTH",
    "AssistantMessage",
    "CalledFunction",
    "CalledTool",
    "ChatChoice",
    "ChatCompletion",
    "ChatCompletionChunk",
    "ChatCompletionRequest",
    "ChatMessage",
    "ChoiceDelta",
    "ChoiceLogprobs",
    "ChunkChoice",
    "Completion",
    "CompletionChoice",
    "CompletionLogprobs",
    "CompletionRequest",
    "ErrorDetail",
    "ErrorResponse",
    "FunctionCall",
    "GenerationRequest",
    "LogprobItem",
    "ModelCard",
    "ModelList",
    "OpenAIFinishReason",
    "PromptTokensDetails",
    "RequestError",
    "StreamOptions",
    "TextPart",
    "ToolCall",
    "ToolCallDelta",
    "TopLogprobItem",
    "Usage",
    "completion_id",
    "decode_body",
    "now",
    "parse_request",
    "request_output",
    "too_deep",
    "unsupported_fields",
    "validate_body",
]
