"""The OpenAI response shapes of finished and running generations.

:class:`Responder` builds one response's objects from the core's :class:`Generation` s: the
chunks of a streamed response (chat: ``chat.completion.chunk``; text: ``text_completion``) and
the final object of a non-streamed one, with the choices' messages (:func:`assistant_message`:
text or tool calls), logprobs (:func:`chat_logprobs`, the legacy :func:`text_logprobs`) and
usage (:func:`usage_of`). Both OpenAI front-ends, in process (:mod:`.local`) and over HTTP
(:mod:`eliza_backends.server.app`), format through it, so their answers are identical.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from typing import Any, Literal, Protocol

from pydantic import BaseModel

from ..structured.logprobs import TokenLogprob
from .generation import Generation
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
    OpenAIFinishReason,
    PromptTokensDetails,
    ToolCall,
    ToolCallDelta,
    TopLogprobItem,
    Usage,
    completion_id,
    now,
)


class Formatter(Protocol):
    """An API front-end's shapes of one answer (:class:`Responder`: OpenAI chat and text;
    :class:`~.responses_events.ResponsesFormatter`: Responses): the objects of a streamed
    answer, each sent as one server-sent event, and the object of a whole one. The server
    (:mod:`eliza_backends.server.run`) and the in-process API (:mod:`.local`) drive it alike:
    :meth:`opening` when a choice starts, :meth:`step` after each of its steps, :meth:`closing`
    after the last choice (streamed), or :meth:`final` (whole)."""

    #: each event carries an ``event:`` line naming the object's ``type`` (Responses,
    #: Anthropic); False: data lines only (OpenAI chunks)
    named_events: bool
    #: the data of the stream's last event (OpenAI's ``[DONE]``), or None
    done_marker: str | None

    def opening(self, index: int, generation: Generation) -> list[BaseModel]: ...

    def step(self, index: int, text: str, generation: Generation) -> list[BaseModel]: ...

    def step_json(self, index: int, text: str, generation: Generation) -> str | None:
        """The JSON of :meth:`step`'s one event when it is a plain text delta (the tokens
        of a running answer: no end, no logprobs, no tool calls), encoded without building
        its models (the server's per-token path); None when :meth:`step` must be used."""
        ...

    def closing(self, generations: Sequence[Generation], include_usage: bool
                ) -> list[BaseModel]: ...

    def final(self, generations: Sequence[Generation]) -> BaseModel: ...

    def error_body(self, status: int, error: ErrorDetail, streaming: bool
                   ) -> dict[str, Any]: ...


class Responder:
    """Builds one response's OpenAI objects: the chunks of a streamed response and the final
    object of a non-streamed one. ``kind`` is ``"chat"`` or ``"text"``; ``model`` is the id
    the response names. A :class:`Formatter`."""

    named_events = False
    done_marker: str | None = "[DONE]"

    def __init__(self, kind: Literal["chat", "text"], model: str) -> None:
        self.kind = kind
        self.model = model
        self.id = completion_id("chatcmpl" if kind == "chat" else "cmpl")
        self.created = now()
        # (step_json: a text chunk's JSON around its index and text, as pydantic writes it)
        head = {"id": self.id, "object": "chat.completion.chunk" if kind == "chat" else
                "text_completion", "created": self.created, "model": model}
        self._json_head = _json(head)[:-1] + ',"choices":[{"index":'
        self._json_text = ',"delta":{"content":' if kind == "chat" else ',"text":'
        self._json_tail = "}}]}" if kind == "chat" else "}]}"

    def first_chunk(self, index: int) -> ChatCompletionChunk | None:
        """The chunk that opens choice ``index`` (chat: the assistant role; text: none)."""
        if self.kind != "chat":
            return None
        return ChatCompletionChunk(id=self.id, created=self.created, model=self.model,
                                   choices=[ChunkChoice(index=index, delta=ChoiceDelta(
                                       role="assistant", content=""))])

    def chunk(self, index: int, text: str, finish: OpenAIFinishReason | None,
              generation: Generation | None = None) -> ChatCompletionChunk | Completion:
        """A chunk adding ``text`` to choice ``index`` (``finish``: it is the choice's last),
        with ``generation``'s last step's logprobs and the tool calls that step finished (each
        whole, numbered across the choice)."""
        gen = generation
        step_lp = gen.step_logprobs if gen is not None and gen.logprobs is not None else None
        if self.kind == "chat":
            calls = None
            if gen is not None and gen.step_tool_calls:
                first = len(gen.tool_calls) - len(gen.step_tool_calls)
                calls = [ToolCallDelta(index=first + i, **c)
                         for i, c in enumerate(gen.step_tool_calls)]
            delta = ChoiceDelta(content=text or None, tool_calls=calls)
            return ChatCompletionChunk(id=self.id, created=self.created, model=self.model,
                                       choices=[ChunkChoice(
                                           index=index, delta=delta, finish_reason=finish,
                                           logprobs=chat_logprobs(step_lp))])
        return Completion(id=self.id, created=self.created, model=self.model,
                          choices=[CompletionChoice(index=index, text=text,
                                                    finish_reason=finish,
                                                    logprobs=text_logprobs(step_lp))])

    def usage_chunk(self, usage: Usage) -> ChatCompletionChunk | Completion:
        """The last chunk of a stream with ``include_usage``: no choices, the usage."""
        if self.kind == "chat":
            return ChatCompletionChunk(id=self.id, created=self.created, model=self.model,
                                       choices=[], usage=usage)
        return Completion(id=self.id, created=self.created, model=self.model, choices=[],
                          usage=usage)

    def opening(self, index: int, generation: Generation) -> list[BaseModel]:
        """The events that open choice ``index`` (:meth:`first_chunk`, if any), once its
        ``generation`` started."""
        first = self.first_chunk(index)
        return [] if first is None else [first]

    def step(self, index: int, text: str, generation: Generation) -> list[BaseModel]:
        """The chunk of one step of choice ``index``: none when the step adds no text, ends
        nothing and has no logprobs."""
        gen = generation
        if not (text or gen.done or gen.step_logprobs or gen.step_tool_calls):
            return []
        return [self.chunk(index, text, gen.finish_reason, gen)]

    def step_json(self, index: int, text: str, generation: Generation) -> str | None:
        """See :meth:`Formatter.step_json`: the JSON of :meth:`chunk` (``exclude_none``) for
        a text-only step."""
        gen = generation
        if not text or gen.ended is not None or gen.logprobs is not None or \
                gen.step_tool_calls:
            return None
        return f"{self._json_head}{index}{self._json_text}{_json(text)}{self._json_tail}"

    def closing(self, generations: Sequence[Generation], include_usage: bool
                ) -> list[BaseModel]:
        """The usage chunk when ``include_usage`` (after every choice)."""
        return [self.usage_chunk(usage_of(generations))] if include_usage else []

    def error_body(self, status: int, error: ErrorDetail, streaming: bool) -> dict[str, Any]:
        """OpenAI's error body (the same in a stream's last event)."""
        return ErrorResponse(error=error).model_dump()

    def final(self, generations: Sequence[Generation]) -> ChatCompletion | Completion:
        """The non-streamed response of finished ``generations`` (one per choice)."""
        usage = usage_of(generations)
        if self.kind == "chat":
            return ChatCompletion(
                id=self.id, created=self.created, model=self.model, usage=usage,
                choices=[ChatChoice(index=i, message=assistant_message(g),
                                    finish_reason=g.finish_reason or "stop",
                                    logprobs=chat_logprobs(g.logprobs))
                         for i, g in enumerate(generations)])
        return Completion(
            id=self.id, created=self.created, model=self.model, usage=usage,
            choices=[CompletionChoice(index=i, text=g.text, finish_reason=g.finish_reason
                                      or "stop", logprobs=text_logprobs(g.logprobs))
                     for i, g in enumerate(generations)])


def _json(value: Any) -> str:
    """``value`` as compact JSON with non-ASCII characters kept, as pydantic writes it."""
    return json.dumps(value, ensure_ascii=False, separators=(",", ":"))


def assistant_message(gen: Generation) -> AssistantMessage:
    """The message of a finished chat generation: its tool calls (with the text the model
    wrote beside them, if any), or its text."""
    if gen.tool_calls:
        return AssistantMessage(content=gen.content, tool_calls=[
            ToolCall(id=c["id"], function=FunctionCall(**c["function"]))
            for c in gen.tool_calls])
    return AssistantMessage(content=gen.content if gen.holds_reply else gen.text)


def chat_logprobs(entries: Sequence[TokenLogprob] | None) -> ChoiceLogprobs | None:
    """OpenAI's chat ``logprobs`` of ``entries`` (None when none were asked for)."""
    if entries is None:
        return None
    return ChoiceLogprobs(content=[LogprobItem(
        token=e.text, logprob=e.logprob, bytes=list(e.piece),
        top_logprobs=[TopLogprobItem(token=t.text, logprob=t.logprob, bytes=list(t.piece))
                      for t in e.top]) for e in entries])


def text_logprobs(entries: Sequence[TokenLogprob] | None) -> CompletionLogprobs | None:
    """The legacy completions ``logprobs`` of ``entries`` (None when none were asked for)."""
    if entries is None:
        return None
    offsets, at = [], 0
    for e in entries:
        offsets.append(at)
        at += len(e.text)
    return CompletionLogprobs(
        tokens=[e.text for e in entries], token_logprobs=[e.logprob for e in entries],
        top_logprobs=[{t.text: t.logprob for t in e.top} for e in entries],
        text_offset=offsets)


def usage_of(generations: Sequence[Generation]) -> Usage:
    """Usage of a response: the prompt once, the completions of every choice (and, when
    they were drafted, the drafted and accepted tokens of every choice)."""
    first = generations[0] if generations else None
    prompt = first.prompt_tokens if first else 0
    completion_total = sum(g.completion_tokens for g in generations)
    speculated = any(g.speculates for g in generations)
    return Usage(prompt_tokens=prompt, completion_tokens=completion_total,
                 total_tokens=prompt + completion_total,
                 prompt_tokens_details=PromptTokensDetails(
                     cached_tokens=first.cached_tokens if first else 0),
                 drafted_tokens=sum(g.drafted_tokens for g in generations)
                 if speculated else None,
                 accepted_tokens=sum(g.accepted_tokens for g in generations)
                 if speculated else None)


__all__ = ["Formatter", "Responder", "assistant_message", "chat_logprobs", "text_logprobs",
           "usage_of"]
