"""The OpenAI wire shapes of what the server and the in-process API answer: chat and text
completions, their chunks, logprobs, usage, the model list, errors.

Exactly OpenAI's field names, so ``model_dump(exclude_none=True)`` is what goes on the wire;
``usage.prompt_tokens_details.cached_tokens`` reports the prompt tokens a session already held
(prefix reuse), as OpenAI does for its prompt cache. The request models are
:mod:`eliza_backends.openai.types`, which re-exports these names.
"""

from __future__ import annotations

import time
import uuid
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field

#: OpenAI's finish reasons that this project produces.
OpenAIFinishReason = Literal["stop", "length", "tool_calls"]

#: Replies keep fields a caller adds (as the openai SDK's objects do).
_OPEN = ConfigDict(extra="allow")


def completion_id(prefix: str) -> str:
    """A fresh response id, e.g. ``chatcmpl-3f2a...``."""
    return f"{prefix}-{uuid.uuid4().hex[:24]}"


def now() -> int:
    """``created``: Unix time in seconds."""
    return int(time.time())


class PromptTokensDetails(BaseModel):
    """``usage.prompt_tokens_details``: ``cached_tokens`` were already in the session."""

    cached_tokens: int = 0


class Usage(BaseModel):
    """Token counts of one response (all choices)."""

    prompt_tokens: int
    completion_tokens: int
    total_tokens: int
    prompt_tokens_details: PromptTokensDetails = Field(default_factory=PromptTokensDetails)
    #: extension fields, present when the server decodes speculatively (``serve --drafter``):
    #: tokens the drafter proposed, and how many of them the model kept
    drafted_tokens: int | None = None
    accepted_tokens: int | None = None


class FunctionCall(BaseModel):
    """The function of a tool call: its ``name`` and ``arguments`` as JSON text."""

    name: str
    arguments: str


class ToolCall(BaseModel):
    """One tool call of an assistant message."""

    id: str
    type: Literal["function"] = "function"
    function: FunctionCall


class ToolCallDelta(ToolCall):
    """A tool call in a streamed chunk: sent whole, in the chunk of the step that finished it
    (a reply in the model's own syntax: as it streams; a JSON reply: the choice's last chunk)."""

    index: int


class TopLogprobItem(BaseModel):
    """One alternative at a position: the token's text, logprob and UTF-8 bytes."""

    token: str
    logprob: float
    bytes: list[int] | None = None


class LogprobItem(TopLogprobItem):
    """A generated token's logprob and its most likely alternatives."""

    top_logprobs: list[TopLogprobItem] = Field(default_factory=list)


class ChoiceLogprobs(BaseModel):
    """``choices[i].logprobs`` of a chat completion: one item per generated token."""

    content: list[LogprobItem] | None = None


class CompletionLogprobs(BaseModel):
    """``choices[i].logprobs`` of a text completion (the legacy shape)."""

    tokens: list[str]
    token_logprobs: list[float]
    top_logprobs: list[dict[str, float]] | None = None
    text_offset: list[int]


class AssistantMessage(BaseModel):
    """The message of a chat choice: ``content``, or ``tool_calls`` (then content is None)."""

    role: Literal["assistant"] = "assistant"
    content: str | None
    tool_calls: list[ToolCall] | None = None


class ChatChoice(BaseModel):
    """One choice of a :class:`ChatCompletion`."""

    index: int
    message: AssistantMessage
    finish_reason: OpenAIFinishReason
    logprobs: ChoiceLogprobs | None = None


class ChatCompletion(BaseModel):
    """A chat completion (``object="chat.completion"``)."""

    model_config = _OPEN

    id: str
    object: Literal["chat.completion"] = "chat.completion"
    created: int
    model: str
    choices: list[ChatChoice]
    usage: Usage
    system_fingerprint: str | None = None


class ChoiceDelta(BaseModel):
    """What one chunk adds to a choice: the role (first chunk), then content (or tool
    calls)."""

    role: Literal["assistant"] | None = None
    content: str | None = None
    tool_calls: list[ToolCallDelta] | None = None


class ChunkChoice(BaseModel):
    """One choice of a :class:`ChatCompletionChunk`."""

    index: int
    delta: ChoiceDelta
    finish_reason: OpenAIFinishReason | None = None
    logprobs: ChoiceLogprobs | None = None


class ChatCompletionChunk(BaseModel):
    """A streamed chunk (``object="chat.completion.chunk"``); the optional last one has no
    choices and the usage."""

    model_config = _OPEN

    id: str
    object: Literal["chat.completion.chunk"] = "chat.completion.chunk"
    created: int
    model: str
    choices: list[ChunkChoice]
    usage: Usage | None = None
    system_fingerprint: str | None = None


class CompletionChoice(BaseModel):
    """One choice of a :class:`Completion` (also a streamed text-completion chunk's)."""

    index: int
    text: str
    finish_reason: OpenAIFinishReason | None = None
    logprobs: CompletionLogprobs | None = None


class Completion(BaseModel):
    """A text completion (``object="text_completion"``); streamed chunks have the same shape
    with ``finish_reason`` None until the last one of a choice."""

    model_config = _OPEN

    id: str
    object: Literal["text_completion"] = "text_completion"
    created: int
    model: str
    choices: list[CompletionChoice]
    usage: Usage | None = None
    system_fingerprint: str | None = None


class ModelCard(BaseModel):
    """One entry of ``GET /v1/models``."""

    id: str
    object: Literal["model"] = "model"
    created: int
    owned_by: str = "eliza-backends"


class ModelList(BaseModel):
    """``GET /v1/models``."""

    object: Literal["list"] = "list"
    data: list[ModelCard]


class ErrorDetail(BaseModel):
    """OpenAI's error object: ``type`` is the class of error, ``code`` a machine-readable
    reason (here the ``ELIZA_*`` symbol where the error came from the backend)."""

    message: str
    type: str
    param: str | None = None
    code: str | None = None


class ErrorResponse(BaseModel):
    """The body of every error response: ``{"error": {...}}``."""

    error: ErrorDetail
