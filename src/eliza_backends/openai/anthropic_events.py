"""Anthropic's Messages shapes of a running and a finished generation: :class:`MessagesFormatter`,
the ``/v1/messages`` front-end's :class:`~.formatting.Formatter`.

A streamed answer is Anthropic's event sequence, each a server-sent event named by its
``type``: ``message_start`` (the message with no content, the input usage); for text
``content_block_start`` (a ``text`` block), ``content_block_delta`` (``text_delta``) per step,
``content_block_stop``; for each tool call ``content_block_start`` (a ``tool_use`` block with
empty ``input``), one ``content_block_delta`` (``input_json_delta``: the arguments whole, a
tool-call reply being parsed when it ends), ``content_block_stop``; then ``message_delta``
(``stop_reason``, ``stop_sequence``, the output usage) and ``message_stop``. A failure is an
``error`` event with Anthropic's error body. A non-streamed answer is the :class:`Message`.

``stop_sequence``: the stop sequence when the request set exactly one (the core reports that
a stop string ended the text, not which one); None otherwise.
"""

from __future__ import annotations

import json
import uuid
from collections.abc import Sequence
from typing import Any

from pydantic import BaseModel

from .anthropic_types import (
    Message,
    MessageEvent,
    MessagesRequest,
    MessageUsage,
    StopReason,
    TextBlock,
    ToolUseBlock,
    error_body,
)
from .generation import Generation
from .replies import ErrorDetail

#: The core's end reasons in Anthropic's terms.
STOP_REASONS: dict[str, StopReason] = {"eos": "end_turn", "stop": "stop_sequence",
                                       "length": "max_tokens", "context": "max_tokens",
                                       "tool_calls": "tool_use"}


def _event(kind: str, **fields: Any) -> MessageEvent:
    """The event ``kind`` with ``fields``."""
    return MessageEvent(type=kind, **fields)


class MessagesFormatter:
    """Builds one answer's Anthropic objects (one choice). Used by one request's task (or
    iterator)."""

    named_events = True
    done_marker: str | None = None

    def __init__(self, request: MessagesRequest, model: str) -> None:
        self.request = request
        self.model = model
        self.id = f"msg_{uuid.uuid4().hex}"
        self._text_open = False

    def _usage(self, gen: Generation, output_tokens: int) -> MessageUsage:
        return MessageUsage(input_tokens=gen.prompt_tokens - gen.cached_tokens,
                            cache_read_input_tokens=gen.cached_tokens,
                            output_tokens=output_tokens)

    @staticmethod
    def _text(gen: Generation) -> str | None:
        """The text of a finished generation (None: it answered with tool calls only)."""
        text = gen.content if gen.holds_reply else gen.text
        return text if text or not gen.tool_calls else None

    @staticmethod
    def _tool_uses(gen: Generation) -> list[ToolUseBlock]:
        out = []
        for call in gen.tool_calls:
            arguments = json.loads(call["function"]["arguments"] or "{}")
            out.append(ToolUseBlock(id="toolu_" + call["id"].removeprefix("call_"),
                                    name=call["function"]["name"],
                                    input=arguments if isinstance(arguments, dict) else {}))
        return out

    def _stop(self, gen: Generation) -> tuple[StopReason | None, str | None]:
        reason = STOP_REASONS.get(gen.ended or "")
        stops = self.request.stop_sequences or []
        return reason, stops[0] if reason == "stop_sequence" and len(stops) == 1 else None

    def final(self, generations: Sequence[Generation]) -> Message:
        """The :class:`Message` of the finished generation."""
        gen = generations[0]
        text = self._text(gen)
        blocks: list[TextBlock | ToolUseBlock] = [] if text is None else [TextBlock(text=text)]
        reason, sequence = self._stop(gen)
        return Message(id=self.id, model=self.model, content=[*blocks, *self._tool_uses(gen)],
                       stop_reason=reason, stop_sequence=sequence,
                       usage=self._usage(gen, gen.completion_tokens))

    # ------------------------------------------------------------------ events

    def opening(self, index: int, generation: Generation) -> list[BaseModel]:
        """``message_start``: the message without content, with the input usage."""
        message = Message(id=self.id, model=self.model, usage=self._usage(generation, 0))
        return [_event("message_start", message=message.model_dump())]

    def _open_text(self) -> list[BaseModel]:
        if self._text_open:
            return []
        self._text_open = True
        return [_event("content_block_start", index=0,
                       content_block={"type": "text", "text": ""})]

    def step_json(self, index: int, text: str, generation: Generation) -> str | None:
        """None: every step goes through :meth:`step` (its events change with the state)."""
        return None

    def step(self, index: int, text: str, generation: Generation) -> list[BaseModel]:
        """A ``text_delta`` (opening the text block first); at the end, the text block's
        stop, each tool call's block and ``message_delta``."""
        events: list[BaseModel] = []
        if text:
            events += self._open_text()
            events.append(_event("content_block_delta", index=0,
                                 delta={"type": "text_delta", "text": text}))
        if generation.done:
            events += self._ending(generation)
        return events

    def _ending(self, gen: Generation) -> list[BaseModel]:
        events: list[BaseModel] = []
        at = 0
        if self._text(gen) is not None:
            events += self._open_text()
            events.append(_event("content_block_stop", index=0))
            at = 1
        for i, block in enumerate(self._tool_uses(gen), start=at):
            opened = block.model_copy(update={"input": {}})
            events += [_event("content_block_start", index=i,
                              content_block=opened.model_dump()),
                       _event("content_block_delta", index=i, delta={
                           "type": "input_json_delta",
                           "partial_json": json.dumps(block.input, ensure_ascii=False)}),
                       _event("content_block_stop", index=i)]
        reason, sequence = self._stop(gen)
        events.append(_event("message_delta",
                             delta={"stop_reason": reason, "stop_sequence": sequence},
                             usage={"output_tokens": gen.completion_tokens}))
        return events

    def closing(self, generations: Sequence[Generation], include_usage: bool
                ) -> list[BaseModel]:
        """``message_stop``."""
        return [_event("message_stop")]

    def error_body(self, status: int, error: ErrorDetail, streaming: bool) -> dict[str, Any]:
        """Anthropic's error body (the ``error`` event's data in a stream)."""
        return error_body(status, error.message)


__all__ = ["STOP_REASONS", "MessagesFormatter"]
