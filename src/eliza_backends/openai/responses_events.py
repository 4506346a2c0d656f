"""The Responses API's shapes of a running and a finished generation:
:class:`ResponsesFormatter`, the ``/v1/responses`` front-end's
:class:`~.formatting.Formatter`.

A streamed response is the Responses event sequence, each event a server-sent event named by
its ``type`` and numbered by ``sequence_number``: ``response.created``,
``response.in_progress``; for text ``response.output_item.added`` (a ``message``),
``response.content_part.added``, ``response.output_text.delta`` per step,
``response.output_text.done``, ``response.content_part.done``, ``response.output_item.done``;
for each tool call ``response.output_item.added`` (a ``function_call``),
``response.function_call_arguments.delta`` (the arguments whole: a tool-call reply is parsed
when it ends), ``response.function_call_arguments.done``, ``response.output_item.done``; then
``response.completed`` (``response.incomplete`` when it stopped at the budget or the context
window) with the whole response. A non-streamed response is that last object.

A finished response with ``store`` is kept in the :class:`~.response_store.ResponseStore`
with its conversation, for ``previous_response_id`` and ``GET /v1/responses/{id}``.
"""

from __future__ import annotations

import time
import uuid
from collections.abc import Sequence
from typing import Any

from pydantic import BaseModel

from .formatting import usage_of
from .generation import Generation
from .replies import ErrorDetail, ErrorResponse
from .response_store import ResponseStore
from .responses import conversation_reply
from .responses_types import (
    FunctionCallItem,
    IncompleteDetails,
    InputTokensDetails,
    OutputItem,
    OutputMessage,
    OutputText,
    Response,
    ResponseEvent,
    ResponsesRequest,
    ResponseStatus,
    ResponseUsage,
)


def _id(prefix: str) -> str:
    return f"{prefix}_{uuid.uuid4().hex}"


class ResponsesFormatter:
    """Builds one response's Responses objects (one choice). ``conversation``: what the
    request's conversation was, stored with the answer; ``store``: where (None or
    ``request.store`` false: not stored). Used by one request's task (or iterator)."""

    named_events = True
    done_marker: str | None = None

    def __init__(self, request: ResponsesRequest, model: str,
                 conversation: Sequence[dict[str, Any]], store: ResponseStore | None) -> None:
        self.request = request
        self.model = model
        self.conversation = list(conversation)
        self.store = store if request.store else None
        self.id = _id("resp")
        self.created_at = int(time.time())
        self.message_id = _id("msg")
        self._sequence = 0
        self._text_open = False
        self._text: list[str] = []

    # ------------------------------------------------------------------ objects

    def response(self, status: ResponseStatus, output: list[OutputItem] | None = None,
                 usage: ResponseUsage | None = None) -> Response:
        """The response object in ``status``, echoing the request's settings."""
        req = self.request
        return Response(
            id=self.id, created_at=self.created_at, status=status, model=self.model,
            output=output or [], usage=usage, instructions=req.instructions,
            incomplete_details=IncompleteDetails() if status == "incomplete" else None,
            max_output_tokens=req.max_output_tokens,
            previous_response_id=req.previous_response_id,
            parallel_tool_calls=req.parallel_tool_calls is not False,
            temperature=req.temperature, top_p=req.top_p,
            tool_choice=req.tool_choice or "auto", tools=req.tools or [],
            text=req.text or {"format": {"type": "text"}}, store=req.store,
            metadata=req.metadata or {})

    def _message(self, text: str, status: ResponseStatus) -> OutputMessage:
        return OutputMessage(id=self.message_id, status=status,
                             content=[OutputText(text=text)] if status != "in_progress" else [])

    @staticmethod
    def _calls(gen: Generation) -> list[FunctionCallItem]:
        return [FunctionCallItem(id="fc_" + c["id"].removeprefix("call_"), call_id=c["id"],
                                 name=c["function"]["name"],
                                 arguments=c["function"]["arguments"])
                for c in gen.tool_calls]

    @staticmethod
    def _reply_text(gen: Generation) -> str | None:
        """The text output of a finished generation (None: it answered with calls only)."""
        text = gen.content if gen.holds_reply else gen.text
        return text if text or not gen.tool_calls else None

    def output(self, gen: Generation) -> list[OutputItem]:
        """The output items of a finished generation: its text as a message, its calls."""
        text = self._reply_text(gen)
        status: ResponseStatus = "incomplete" if _incomplete(gen) else "completed"
        items: list[OutputItem] = [] if text is None else [self._message(text, status)]
        return items + list(self._calls(gen))

    def final(self, generations: Sequence[Generation]) -> Response:
        """The whole response of the finished generation (stored when asked for)."""
        gen = generations[0]
        usage = usage_of(generations)
        response = self.response(
            "incomplete" if _incomplete(gen) else "completed", self.output(gen),
            ResponseUsage(input_tokens=usage.prompt_tokens,
                          output_tokens=usage.completion_tokens,
                          total_tokens=usage.total_tokens,
                          input_tokens_details=InputTokensDetails(
                              cached_tokens=usage.prompt_tokens_details.cached_tokens)))
        if self.store is not None:
            reply = conversation_reply(self._reply_text(gen), gen.tool_calls)
            self.store.put(response, [*self.conversation, reply])
        return response

    # ------------------------------------------------------------------ events

    def _event(self, kind: str, **fields: Any) -> ResponseEvent:
        event = ResponseEvent(type=kind, sequence_number=self._sequence, **fields)
        self._sequence += 1
        return event

    def opening(self, index: int, generation: Generation) -> list[BaseModel]:
        """``response.created`` and ``response.in_progress``."""
        snapshot = self.response("in_progress").model_dump(exclude_none=True)
        return [self._event("response.created", response=snapshot),
                self._event("response.in_progress", response=snapshot)]

    def _open_text(self) -> list[BaseModel]:
        if self._text_open:
            return []
        self._text_open = True
        where = {"item_id": self.message_id, "output_index": 0}
        return [self._event("response.output_item.added", output_index=0,
                            item=self._message("", "in_progress").model_dump()),
                self._event("response.content_part.added", content_index=0,
                            part=OutputText(text="").model_dump(), **where)]

    def step_json(self, index: int, text: str, generation: Generation) -> str | None:
        """None: every step goes through :meth:`step` (its events change with the state)."""
        return None

    def step(self, index: int, text: str, generation: Generation) -> list[BaseModel]:
        """The events of one step: a text delta (opening the message first), and at the end
        the closing of the text and each tool call's events."""
        events: list[BaseModel] = []
        if text:
            events += self._open_text()
            self._text.append(text)
            events.append(self._event("response.output_text.delta", item_id=self.message_id,
                                      output_index=0, content_index=0, delta=text,
                                      logprobs=[]))
        if generation.done:
            events += self._ending(generation)
        return events

    def _ending(self, gen: Generation) -> list[BaseModel]:
        events: list[BaseModel] = []
        text = self._reply_text(gen)
        at = 0
        if text is not None:
            events += self._open_text()
            where = {"item_id": self.message_id, "output_index": 0, "content_index": 0}
            item = self._message(text, "incomplete" if _incomplete(gen) else "completed")
            events += [self._event("response.output_text.done", text=text, logprobs=[],
                                   **where),
                       self._event("response.content_part.done",
                                   part=item.content[0].model_dump(), **where),
                       self._event("response.output_item.done", output_index=0,
                                   item=item.model_dump())]
            at = 1
        for i, call in enumerate(self._calls(gen), start=at):
            opened = call.model_copy(update={"arguments": "", "status": "in_progress"})
            where = {"item_id": call.id, "output_index": i}
            events += [self._event("response.output_item.added", output_index=i,
                                   item=opened.model_dump()),
                       self._event("response.function_call_arguments.delta",
                                   delta=call.arguments, **where),
                       self._event("response.function_call_arguments.done",
                                   arguments=call.arguments, name=call.name, **where),
                       self._event("response.output_item.done", output_index=i,
                                   item=call.model_dump())]
        return events

    def closing(self, generations: Sequence[Generation], include_usage: bool
                ) -> list[BaseModel]:
        """``response.completed`` (or ``response.incomplete``) with the whole response."""
        response = self.final(generations)
        kind = "response.incomplete" if response.status == "incomplete" else \
            "response.completed"
        return [self._event(kind, response=response.model_dump(exclude_none=True))]

    def error_body(self, status: int, error: ErrorDetail, streaming: bool) -> dict[str, Any]:
        """An error: OpenAI's body, or in a stream the Responses ``error`` event."""
        if not streaming:
            return ErrorResponse(error=error).model_dump()
        return self._event("error", code=error.code, message=error.message,
                           param=error.param).model_dump()


def _incomplete(gen: Generation) -> bool:
    return gen.ended in ("length", "context")


__all__ = ["ResponsesFormatter"]
