"""Gemma 4 replies read into content and tool calls, whole or as they stream, repairing slips.

:class:`Gemma4Reader` is fed a reply's text piece by piece (:meth:`~Gemma4Reader.feed`) and
returns what is decided so far: content text and finished calls, in the order written. Text
that may still turn out to be a call (a marker's first characters, a call still being
written, a thought channel still open) is held until it is decided or the reply ends
(:meth:`~Gemma4Reader.finish`). What a prefix of the text decides is never taken back, so the
pieces streamed add up to what the whole text gives (:func:`read_gemma4_reply`), however the
text is cut.

Well-formed replies read exactly as the strict parser reads them
(:func:`~eliza_backends.openai.gemma4_calls.parse_gemma4_reply`: content, thought channels
removed, then calls). On top of that a call a person would recognise is recovered
(:mod:`.gemma4_values` for its arguments) and each repair is logged at DEBUG on the
``eliza_backends.openai.tool_calls`` logger:

* openers: ``<|tool_call>`` repeated or drifted to ``<|tool_call|>``, ``call`` missing
  (``<|tool_call>:name{``), ``call:name(...)`` for ``{...}``, a JSON call object
  (``{"name": ..., "arguments": {...}}``) inside the markers or as the whole reply;
* ``call:name{...}`` with no ``<|tool_call>`` **only** at the start of the reply or right after
  a thought channel or another call, never inside prose; the name must be a tool offered;
* a missing ``<tool_call|>`` (the arguments complete), extra ``<tool_call|>`` or ``}`` after a
  call; a call written inside a thought channel that was never closed.

Text that is not such a call stays content (a call to a tool not offered, a call cut short,
call syntax quoted in prose). Not thread-safe: one reader per reply.
"""

from __future__ import annotations

import logging
import re
import uuid
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from . import json_numbers
from .gemma4_calls import CALL_CLOSE as CLOSE
from .gemma4_calls import CHANNEL_CLOSE, CHANNEL_OPEN
from .gemma4_calls import RESPONSE_OPEN as RESPONSE
from .gemma4_values import ArgumentReader, Malformed, closers_only

log = logging.getLogger("eliza_backends.openai.tool_calls")

OPEN = "<|tool_call>"  # a call's opener (CALL_OPEN is it with 'call:')
OPEN_DRIFTED = "<|tool_call|>"  # the opener as some models drift it
_MARKERS = (OPEN, OPEN_DRIFTED, CLOSE, CHANNEL_OPEN, CHANNEL_CLOSE)
_NAME = re.compile(r"[A-Za-z0-9_.-]{1,64}")
_WS = " \t\r\n"
_FENCE = re.compile(r"^```(?:json)?\s*(.*?)\s*```$", re.S)

#: The tools a reply may call: name -> ``parameters`` JSON schema.
ToolSchemas = Mapping[str, Mapping[str, Any]]


@dataclass
class Reading:
    """What a reader decided: ``content`` pieces and ``calls`` (OpenAI ``tool_calls`` items,
    ``arguments`` as JSON text) in the order they were written."""

    content: list[str] = field(default_factory=list)
    calls: list[dict[str, Any]] = field(default_factory=list)

    def extend(self, other: Reading) -> None:
        """Append ``other``'s content and calls."""
        self.content += other.content
        self.calls += other.calls


class _Pending(Exception):
    """The rest of the text is not decided yet (more may come)."""


class Gemma4Reader:
    """Reads one Gemma 4 reply (see the module docstring). ``tools``: the tools offered
    (name -> parameters schema); None accepts any name (no schema to guide raw values)."""

    def __init__(self, tools: ToolSchemas | None = None) -> None:
        self.tools = tools
        self.text = ""
        self.pos = 0  # the text before this is decided
        self.eligible = True  # a bare call:name{ may start here
        self.ended = False  # a <|tool_response> was read: the rest is not the model's turn
        self.after_call = False  # right after a call (whitespace, extra <tool_call|> dropped)
        self._seen = (-1, 0)  # (a call's start, how far its end was looked for in vain)
        self.content: list[str] = []
        self.calls: list[dict[str, Any]] = []

    def feed(self, piece: str) -> Reading:
        """Add ``piece`` of the reply; returns what it decided."""
        self.text += piece
        return self._scan(final=False)

    def finish(self) -> Reading:
        """The reply is over: decide the rest."""
        return self._scan(final=True)

    # ------------------------------------------------------------------ scanning

    def _scan(self, *, final: bool) -> Reading:
        out = Reading()
        while self.pos < len(self.text) and not self.ended:
            try:
                step = self._step(final)
            except _Pending:
                break
            out.extend(step)
        self.content += out.content
        self.calls += out.calls
        return out

    def _step(self, final: bool) -> Reading:
        """Decide the text at :attr:`pos`: a call, a channel, or content up to a marker."""
        text, pos = self.text, self.pos
        if self.after_call:
            self._after_call(final)
            return Reading()
        if self.eligible:
            lead = pos
            while lead < len(text) and text[lead] in _WS:
                lead += 1
            if lead == len(text) and not final:
                raise _Pending
            found = self._bare(lead, final)
            if found is not None:
                return found
            self.eligible = False
        at = pos if any(text.startswith(m, pos) for m in _MARKERS) else \
            self._next_marker(pos, final)
        if at > pos:
            self.pos = at
            return Reading(content=[text[pos:at]])
        if text.startswith(CHANNEL_OPEN, pos):
            return self._channel(pos, final)
        if text.startswith(CHANNEL_CLOSE, pos):
            self.pos, self.eligible = pos + len(CHANNEL_CLOSE), True  # a stray close
            return Reading()
        if text.startswith(CLOSE, pos):  # a close tag with no call open: text
            self.pos = pos + len(CLOSE)
            return Reading(content=[CLOSE])
        return self._call(pos, pos, final)

    def _next_marker(self, pos: int, final: bool) -> int:
        """Where the next marker starts (the end of the text when none; not final: before a
        partial marker at the end, which may be completed)."""
        text = self.text
        found = [i for i in (text.find(m, pos) for m in _MARKERS) if i >= 0]
        if found:
            return min(found)
        if not final:  # a partial marker holds its one '<' (every marker starts with it)
            start = text.rfind("<", max(pos, len(text) - len(OPEN_DRIFTED) + 1))
            if start >= 0 and any(m.startswith(text[start:]) for m in _MARKERS):
                return start
        return len(text)

    def _channel(self, pos: int, final: bool) -> Reading:
        """A thought channel: removed up to its close (or up to a call written inside it);
        a channel reopened before it closes, or never closed, loses only its mark."""
        text = self.text
        after = pos + len(CHANNEL_OPEN)
        ends = {m: text.find(m, after) for m in (CHANNEL_CLOSE, CHANNEL_OPEN, OPEN, OPEN_DRIFTED)}
        ends = {m: i for m, i in ends.items() if i >= 0}
        if not ends:
            if not final:
                raise _Pending
            self.pos = after
            return Reading()
        mark = min(ends, key=lambda m: ends[m])
        if mark == CHANNEL_CLOSE:
            self.pos, self.eligible = ends[mark] + len(CHANNEL_CLOSE), True
        elif mark == CHANNEL_OPEN:
            self.pos = after
        else:
            log.debug("gemma4 reply: a call was written inside an unclosed thought channel")
            self.pos = ends[mark]
        return Reading()

    def _bare(self, lead: int, final: bool) -> Reading | None:
        """A call without its opener (``call:name{``) or a JSON call object as the whole
        rest of the reply, at ``lead``; None when the text there is neither."""
        text = self.text
        rest = text[lead:lead + 5]
        if rest == "call:"[:len(rest)] and len(rest) < 5 and not final:
            raise _Pending
        if text.startswith("call:", lead):
            name = _NAME.match(text, lead + 5)
            if name is None or name.end() == len(text):
                if not final:
                    raise _Pending
                return None
            if text[name.end()] in "{(" and self._offered(name.group(0)):
                return self._call(self.pos, lead, final)
            return None
        if text.startswith("{", lead) or text.startswith("`", lead):
            if not final:
                raise _Pending
            call = self._json_reply(text[lead:])
            if call is not None:
                self.pos = len(text)
                return Reading(calls=[call])
        return None

    def _json_reply(self, rest: str) -> dict[str, Any] | None:
        fenced = _FENCE.match(rest.strip(_WS))
        body = fenced.group(1) if fenced else rest.strip(_WS)
        try:
            data = json_numbers.loads(body)
        except (ValueError, RecursionError):
            return None
        call = self._json_call(data)
        if call is not None:
            self._log(call, ["a JSON call object instead of Gemma 4 syntax"])
        return call

    def _json_call(self, data: Any) -> dict[str, Any] | None:
        if not isinstance(data, dict) or not isinstance(data.get("name"), str):
            return None
        args = data.get("arguments", data.get("parameters", {}))
        if not isinstance(args, dict) or not self._offered(data["name"]):
            return None
        return _item(data["name"], args)

    def _offered(self, name: str) -> bool:
        return self.tools is None or name in self.tools

    # ------------------------------------------------------------------ calls

    def _call(self, start: int, head: int, final: bool) -> Reading:
        """The call whose text starts at ``start`` (``head``: its opener or ``call:``)."""
        text = self.text
        limit, closed = self._region(_past_openers(text, head), final)
        try:
            call, end, repairs = self._read_call(head, limit, closed, final)
        except Malformed as exc:
            if not final and not closed:
                raise _Pending from None
            stop = limit + len(CLOSE) if text.startswith(CLOSE, limit) else limit
            log.debug("gemma4 reply: not a call (%s): %r", exc, text[start:stop][:200])
            self.pos, self.eligible = stop, False
            return Reading(content=[text[start:stop]])
        self._log(call, repairs)
        self.pos, self.eligible, self.after_call = end, True, True
        return Reading(calls=[call])

    def _region(self, after: int, final: bool) -> tuple[int, bool]:
        """Where the call whose opener(s) end at ``after`` ends: its ``<tool_call|>``, the
        next call, or a ``<|tool_response>`` (the model ended it: True), else the end of the
        text."""
        text = self.text
        start, seen = self._seen
        begin = max(after, seen) if start == after else after
        found = [i for i in (text.find(m, begin) for m in (CLOSE, OPEN, OPEN_DRIFTED, RESPONSE))
                 if i >= 0]
        if found:
            return min(found), True
        # not there yet: the next look starts where a marker could still begin
        self._seen = (after, max(after, len(text) - len(RESPONSE)))
        if not final:
            raise _Pending
        return len(text), False

    def _read_call(self, head: int, limit: int, closed: bool, final: bool
                   ) -> tuple[dict[str, Any], int, list[str]]:
        text = self.text
        repairs: list[str] = []
        pos = head
        openers = 0
        while True:
            opener = next((m for m in (OPEN_DRIFTED, OPEN) if text.startswith(m, pos)), None)
            if opener is None:
                break
            if opener == OPEN_DRIFTED:
                repairs.append("opener <|tool_call|> read as <|tool_call>")
            openers += 1
            pos = _skip(text, pos + len(opener), limit)
        if openers > 1:
            repairs.append("dropped a repeated <|tool_call>")
        if openers == 0:
            repairs.append("no <|tool_call> before call:")
        if text.startswith("call:", pos):
            pos += len("call:")
        elif text.startswith(":", pos):
            pos += 1
            repairs.append("'call' missing before ':'")
        reader = ArgumentReader(text, limit, closed=closed)
        pos = _skip(text, pos, limit)
        if text.startswith("{", pos):
            value, pos = reader.json_value(pos)
            call = self._json_call(value)
            if call is None:
                raise Malformed("a JSON object that is not a call")
            repairs.append("a JSON call object instead of Gemma 4 syntax")
        else:
            call, pos = self._native_call(reader, pos, repairs)
        return call, self._close(pos, limit, closed, final, repairs), repairs + reader.repairs

    def _native_call(self, reader: ArgumentReader, pos: int, repairs: list[str]
                     ) -> tuple[dict[str, Any], int]:
        text = reader.text
        name = _NAME.match(text, pos, reader.limit)
        if name is None or not (reader.at(name.end(), "{") or reader.at(name.end(), "(")):
            raise Malformed(f"no tool name and '{{' at {pos}")
        if not self._offered(name.group(0)):
            raise Malformed(f"{name.group(0)!r} is not a tool offered")
        schema = self.tools.get(name.group(0)) if self.tools is not None else None
        pos = name.end()
        if text[pos] == "(":
            repairs.append("call:name(...) read as call:name{...}")
            inner = reader.skip(pos + 1)
            if reader.at(inner, "{"):  # call:name({...}): one object in the parentheses
                args, pos = reader.object(inner, "}", schema, ())
                pos = reader.skip(pos)
                if not reader.at(pos, ")"):
                    raise Malformed(f"no ')' at {pos}")
                pos += 1
            else:
                args, pos = reader.object(pos, ")", schema, ())
        else:
            args, pos = reader.object(pos, "}", schema, ())
        return _item(name.group(0), args), pos

    def _close(self, pos: int, limit: int, closed: bool, final: bool,
               repairs: list[str]) -> int:
        """Where the call's text ends after its arguments (at ``pos``): past its
        ``<tool_call|>`` (a repeated one is dropped by :meth:`_after_call`); extra closing
        brackets before it are dropped, other text before it makes the call malformed (with
        no ``<tool_call|>`` at all, the call ends with its arguments)."""
        text = self.text
        if pos < limit and not closers_only(text[pos:limit]):
            if closed:
                raise Malformed(f"text after the arguments at {pos}")
            repairs.append("no <tool_call|> after the arguments")
            return pos
        if pos < limit and text[pos:limit].strip(_WS):
            repairs.append("dropped extra closing brackets")
        if not text.startswith(CLOSE, limit):
            if limit == len(text) and not final:
                raise _Pending
            repairs.append("no <tool_call|> after the arguments")
            return limit
        return limit + len(CLOSE)

    def _after_call(self, final: bool) -> None:
        """After a call: whitespace and repeated ``<tool_call|>`` are dropped, a
        ``<|tool_response>`` ends the turn (the model hands over to the tool)."""
        text = self.text
        lead = _skip(text, self.pos, len(text))
        rest = text[lead:lead + len(RESPONSE)]
        if not final and (lead == len(text) or (len(rest) < len(RESPONSE) and any(
                m.startswith(rest) for m in (CLOSE, RESPONSE)))):
            raise _Pending
        if text.startswith(CLOSE, lead):
            log.debug("gemma4 reply: dropped a repeated <tool_call|>")
            self.pos = lead + len(CLOSE)
            return
        self.pos, self.after_call = lead, False
        self.ended = text.startswith(RESPONSE, lead)

    @staticmethod
    def _log(call: dict[str, Any], repairs: list[str]) -> None:
        if repairs:
            log.debug("gemma4 tool call %s repaired: %s", call["function"]["name"],
                      "; ".join(dict.fromkeys(repairs)))


def _past_openers(text: str, pos: int) -> int:
    """The position after the openers (``<|tool_call>``, repeated or drifted) at ``pos``."""
    while True:
        opener = next((m for m in (OPEN_DRIFTED, OPEN) if text.startswith(m, pos)), None)
        if opener is None:
            return pos
        pos = _skip(text, pos + len(opener), len(text))


def _skip(text: str, pos: int, limit: int) -> int:
    while pos < limit and text[pos] in _WS:
        pos += 1
    return pos


def _item(name: str, args: dict[str, Any]) -> dict[str, Any]:
    return {"id": f"call_{uuid.uuid4().hex[:24]}", "type": "function",
            "function": {"name": name, "arguments": json_numbers.dumps(args)}}


def read_gemma4_reply(text: str, tools: ToolSchemas | None = None
                      ) -> tuple[str | None, list[dict[str, Any]]]:
    """(content, tool_calls) of a whole Gemma 4 reply, read as :class:`Gemma4Reader` reads it
    (content None when it is empty and there are calls)."""
    reader = Gemma4Reader(tools)
    reader.feed(text)
    reader.finish()
    content = "".join(reader.content)
    return (content or None) if reader.calls else content, reader.calls


__all__ = ["Gemma4Reader", "Reading", "ToolSchemas", "read_gemma4_reply"]
