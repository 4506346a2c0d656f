"""Gemma 4's own tool-call syntax: recognised in a chat template, parsed out of generated text.

Gemma 4's template (Google's ``chat_template.jinja``; llama.cpp carries it as
``models/templates/google-gemma-4-31B-it.jinja``) declares tools between ``<|tool>`` and
``<tool|>`` in the system turn, writes an assistant's calls as::

    <|tool_call>call:get_weather{city:<|"|>Paris<|"|>,days:3}<tool_call|>

and a result as ``<|tool_response>response:get_weather{value:<|"|>...<|"|>}<tool_response|>``.
Argument values are Gemma's own notation, not JSON: strings are wrapped in ``<|"|>`` (no
escapes inside), dict keys are bare (``key:value``), and numbers, ``true``/``false``/``null``,
``[...]`` and ``{...}`` nest as in JSON. The model may think first
(``<|channel>thought ...<channel|>``) and may write text before its calls. Channel marks are
removed outside quoted strings only: the inside of ``<|"|>...<|"|>`` is data, kept whole.

:func:`parse_gemma4_reply` reads that text back into OpenAI ``tool_calls`` (``arguments`` as
JSON text), following the grammar of llama.cpp's Gemma 4 parser (``common/parsers/gemma4.cpp``):
content, then one or more calls, then nothing but an optional ``<|tool_response>`` (where the
model hands over to the tool). Text with no call is content. A reply that starts a call but does
not finish it, or calls a tool that was not offered, is returned whole as content with no calls,
the same rule :func:`eliza_backends.openai.tools.parse_reply` applies to a reply cut short.

Pure functions; any thread.
"""

from __future__ import annotations

import re
import uuid
from collections.abc import Callable, Collection
from typing import Any

from . import json_numbers

CALL_OPEN = "<|tool_call>call:"
CALL_CLOSE = "<tool_call|>"
QUOTE = '<|"|>'
RESPONSE_OPEN = "<|tool_response>"
CHANNEL_OPEN = "<|channel>"
CHANNEL_CLOSE = "<channel|>"
MAX_DEPTH = 64  # nesting of argument values; deeper is malformed

#: A JSON number literal (Gemma 4 writes numbers as JSON does).
NUMBER = re.compile(r"-?(?:0|[1-9]\d*)(?:\.\d+)?(?:[eE][+-]?\d+)?")
_NAME = re.compile(r"[A-Za-z0-9_.-]{1,64}")
_WS = " \t\r\n"


class _Malformed(Exception):
    """The text is not Gemma 4 call syntax (internal; callers get the text back as content)."""


def is_gemma4_template(template: str) -> bool:
    """True when ``template`` writes Gemma 4's tool calls (``<|tool_call>call:``)."""
    return CALL_OPEN in template


def parse_gemma4_reply(text: str, names: Collection[str] | None = None
                       ) -> tuple[str | None, list[dict[str, Any]]]:
    """(content, tool_calls) of a Gemma 4 reply. ``tool_calls`` are OpenAI items (``id``,
    ``type``, ``function: {name, arguments}``, ``arguments`` as JSON text); ``content`` is the
    text before the first call with thought channels removed (None when empty and there are
    calls). ``names``: the tools offered; a call to any other name makes the reply malformed.
    Malformed call syntax: ``(text, [])``."""
    visible = _strip_channels(text)
    start = visible.find(CALL_OPEN)
    if start < 0:
        return visible, []
    try:
        calls, end = _calls(visible, start)
    except _Malformed:
        return text, []
    rest = visible[end:].strip(_WS)
    if rest not in ("", RESPONSE_OPEN) or \
            (names is not None and any(c["function"]["name"] not in names for c in calls)):
        return text, []
    return visible[:start] or None, calls


def _strip_channels(text: str) -> str:
    """``text`` without complete ``<|channel>...<channel|>`` blocks (a block runs to the first
    close with no other open before it) and stray channel marks, except inside quoted strings
    (``<|"|>...<|"|>``, data: kept whole; an unclosed quote mark is just text)."""
    out: list[str] = []
    pos = 0
    while True:
        marks = [i for i in (text.find(QUOTE, pos), text.find(CHANNEL_OPEN, pos),
                             text.find(CHANNEL_CLOSE, pos)) if i >= 0]
        if not marks:
            out.append(text[pos:])
            return "".join(out)
        at = min(marks)
        out.append(text[pos:at])
        if text.startswith(QUOTE, at):
            end = text.find(QUOTE, at + len(QUOTE))
            pos = at + len(QUOTE) if end < 0 else end + len(QUOTE)
            out.append(text[at:pos])
        elif text.startswith(CHANNEL_OPEN, at):
            after = at + len(CHANNEL_OPEN)
            close, reopen = text.find(CHANNEL_CLOSE, after), text.find(CHANNEL_OPEN, after)
            whole = close >= 0 and not 0 <= reopen < close
            pos = close + len(CHANNEL_CLOSE) if whole else after  # a block, or a stray open
        else:
            pos = at + len(CHANNEL_CLOSE)  # a stray close


def _calls(text: str, pos: int) -> tuple[list[dict[str, Any]], int]:
    calls: list[dict[str, Any]] = []
    while text.startswith(CALL_OPEN, pos):
        pos += len(CALL_OPEN)
        name = _NAME.match(text, pos)
        if name is None or not text.startswith("{", name.end()):
            raise _Malformed(f"no tool name and '{{' at {pos}")
        args, pos = _dict(text, name.end(), 0)
        if not text.startswith(CALL_CLOSE, pos):
            raise _Malformed(f"no {CALL_CLOSE} at {pos}")
        pos = _skip(text, pos + len(CALL_CLOSE))
        calls.append({"id": f"call_{uuid.uuid4().hex[:24]}", "type": "function",
                      "function": {"name": name.group(0),
                                   "arguments": json_numbers.dumps(args)}})
    return calls, pos


def _skip(text: str, pos: int) -> int:
    while pos < len(text) and text[pos] in _WS:
        pos += 1
    return pos


def _value(text: str, pos: int, depth: int) -> tuple[Any, int]:
    if depth > MAX_DEPTH:
        raise _Malformed(f"values nest deeper than {MAX_DEPTH}")
    if text.startswith(QUOTE, pos):
        end = text.find(QUOTE, pos + len(QUOTE))
        if end < 0:
            raise _Malformed(f"unterminated string at {pos}")
        return text[pos + len(QUOTE):end], end + len(QUOTE)
    if text.startswith("{", pos):
        return _dict(text, pos, depth + 1)
    if text.startswith("[", pos):
        return _list(text, pos, depth + 1)
    for word, value in (("true", True), ("false", False), ("null", None)):
        if text.startswith(word, pos):
            return value, pos + len(word)
    number = NUMBER.match(text, pos)
    if number is None:
        raise _Malformed(f"no value at {pos}")
    return json_numbers.Number(number.group(0)), number.end()  # the literal, however large


def _dict(text: str, pos: int, depth: int) -> tuple[dict[str, Any], int]:
    out: dict[str, Any] = {}

    def member(pos: int) -> int:
        colon = pos
        while colon < len(text) and text[colon] not in ":}":
            colon += 1
        if colon == pos or not text.startswith(":", colon):
            raise _Malformed(f"no 'key:' at {pos}")
        key = text[pos:colon]
        if key.startswith(QUOTE) and key.endswith(QUOTE) and len(key) >= 2 * len(QUOTE):
            key = key[len(QUOTE):-len(QUOTE)]  # the template's escape_keys form
        out[key], pos = _value(text, _skip(text, colon + 1), depth)
        return pos

    return out, _items(text, pos, "}", member)


def _list(text: str, pos: int, depth: int) -> tuple[list[Any], int]:
    out: list[Any] = []

    def item(pos: int) -> int:
        value, pos = _value(text, pos, depth)
        out.append(value)
        return pos

    return out, _items(text, pos, "]", item)


def _items(text: str, pos: int, close: str, read: Callable[[int], int]) -> int:
    """Reads ``open item (, item)* close`` from the opening bracket at ``pos`` with ``read``
    (which returns where its item ends); returns the position after ``close``."""
    pos = _skip(text, pos + 1)
    if text.startswith(close, pos):
        return pos + 1
    while True:
        pos = _skip(text, read(pos))
        if text.startswith(close, pos):
            return pos + 1
        if not text.startswith(",", pos):
            raise _Malformed(f"no ',' or '{close}' at {pos}")
        pos = _skip(text, pos + 1)


__all__ = ["CALL_CLOSE", "CALL_OPEN", "CHANNEL_CLOSE", "CHANNEL_OPEN", "MAX_DEPTH", "NUMBER",
           "QUOTE", "RESPONSE_OPEN", "is_gemma4_template", "parse_gemma4_reply"]
