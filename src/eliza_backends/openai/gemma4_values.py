"""Gemma 4 call arguments read the way a person would: the tolerant reader of one call's body.

Gemma 4 writes a call's arguments in its own notation (``{key:<|"|>text<|"|>,n:3}``, see
:mod:`.gemma4_calls`). Real models slip (the shapes collected in
``tests/data/gemma4_tool_calls.jsonl``, each with the public report it came from); this reader
accepts, and names in :attr:`ArgumentReader.repairs`:

* a string without its opening ``<|"|>`` (``query:Paris, France<|"|>``) or without any
  delimiter (``path:a.txt``, a raw value up to the next ``,key:`` of the tool's schema or the
  end of the object), a single-quoted string (``pattern:'\\s+'``, a dangling ``<|"|>`` after it
  dropped), a JSON-quoted one (``command:"ls"``, inner quotes unescaped or not);
* JSON-quoted or ``<|"|>``-quoted keys, ``=`` for ``:`` (Python keyword style);
* an unterminated string or unclosed ``{`` / ``[`` **only** when the model ended the call
  itself (``closed``: a ``<tool_call|>`` or another call follows), never at the end of a reply
  cut short: completing a call a token limit cut would invent its arguments.

Everything else raises :class:`Malformed`. Numbers keep their literals
(:class:`~eliza_backends.openai.json_numbers.Number`). Pure; any thread.
"""

from __future__ import annotations

import json
import re
from collections.abc import Collection, Mapping
from typing import Any

from . import json_numbers
from .gemma4_calls import MAX_DEPTH, NUMBER, QUOTE

_BARE_KEY = re.compile(r"[^:=,{}()\[\]<>\s\"']+")
_ANY_KEY = r"[A-Za-z_][A-Za-z0-9_.-]*"
_WS = " \t\r\n"
_CLOSERS = "}])"
_JSON = json.JSONDecoder(parse_int=json_numbers.Number, parse_float=json_numbers.Number,
                         parse_constant=lambda name: None)


class Malformed(Exception):
    """The text is not a call a reader could recognise (its message says where)."""


def properties(schema: Mapping[str, Any] | None) -> Mapping[str, Any]:
    """The ``properties`` of an object schema (empty when there are none)."""
    props = schema.get("properties") if isinstance(schema, Mapping) else None
    return props if isinstance(props, Mapping) else {}


class ArgumentReader:
    """Reads one call's arguments from ``text`` up to ``limit`` (where the call's region
    ends). ``closed``: the model ended the call there (so unclosed brackets may be closed).
    :attr:`repairs` lists what was repaired, in order."""

    def __init__(self, text: str, limit: int, *, closed: bool) -> None:
        self.text = text
        self.limit = limit
        self.closed = closed
        self.repairs: list[str] = []

    def skip(self, pos: int) -> int:
        """The first position at or after ``pos`` that is not whitespace (at most limit)."""
        while pos < self.limit and self.text[pos] in _WS:
            pos += 1
        return pos

    def at(self, pos: int, word: str) -> bool:
        """True when ``word`` starts at ``pos`` inside the region."""
        return pos + len(word) <= self.limit and self.text.startswith(word, pos)

    def json_value(self, pos: int) -> tuple[Any, int]:
        """A JSON value at ``pos`` (numbers as literals); :class:`Malformed` if none."""
        try:
            value, end = _JSON.raw_decode(self.text[:self.limit], pos)
        except (ValueError, RecursionError):
            raise Malformed(f"no JSON value at {pos}") from None
        return value, end

    def object(self, pos: int, close: str, schema: Mapping[str, Any] | None,
               stack: tuple[str, ...]) -> tuple[dict[str, Any], int]:
        """The members from the bracket at ``pos`` to ``close`` (``}``, or ``)`` for the
        parenthesised call form); returns the value and the position after ``close``."""
        if len(stack) > MAX_DEPTH:
            raise Malformed(f"values nest deeper than {MAX_DEPTH}")
        out: dict[str, Any] = {}
        props = properties(schema)
        stack = (*stack, close)
        pos = self.skip(pos + 1)
        while True:
            if pos >= self.limit:
                return out, self._unclosed(close)
            if self.at(pos, close):
                return out, pos + 1
            key, pos = self._key(pos)
            pos = self.skip(pos)
            if not (self.at(pos, ":") or self.at(pos, "=")):
                raise Malformed(f"no ':' after the key {key!r} at {pos}")
            if self.at(pos, "="):
                self._note("'=' between a key and its value")
            pos = self.skip(pos + 1)
            out[key], pos = self.value(pos, props.get(key), stack, props)
            pos = self._after_value(pos)
            if self.at(pos, ","):
                pos = self.skip(pos + 1)
            elif not (self.at(pos, close) or pos >= self.limit):
                raise Malformed(f"no ',' or {close!r} at {pos}")

    def array(self, pos: int, schema: Mapping[str, Any] | None,
              stack: tuple[str, ...]) -> tuple[list[Any], int]:
        """The items of the ``[`` at ``pos``; returns them and the position after ``]``."""
        if len(stack) > MAX_DEPTH:
            raise Malformed(f"values nest deeper than {MAX_DEPTH}")
        items = schema.get("items") if isinstance(schema, Mapping) else None
        out: list[Any] = []
        stack = (*stack, "]")
        pos = self.skip(pos + 1)
        while True:
            if pos >= self.limit:
                return out, self._unclosed("]")
            if self.at(pos, "]"):
                return out, pos + 1
            value, pos = self.value(pos, items if isinstance(items, Mapping) else None, stack,
                                    ())
            out.append(value)
            pos = self._after_value(pos)
            if self.at(pos, ","):
                pos = self.skip(pos + 1)
            elif not (self.at(pos, "]") or pos >= self.limit):
                raise Malformed(f"no ',' or ']' at {pos}")

    def value(self, pos: int, schema: Mapping[str, Any] | None, stack: tuple[str, ...],
              siblings: Collection[str]) -> tuple[Any, int]:
        """One value at ``pos`` inside the brackets ``stack`` (closers, outermost first);
        ``siblings``: the other keys of the enclosing object's schema (where a raw value
        ends)."""
        if pos >= self.limit:
            raise Malformed(f"no value at {pos}")
        text = self.text
        if self.at(pos, QUOTE):
            end = text.find(QUOTE, pos + len(QUOTE), self.limit)
            if end >= 0:
                return text[pos + len(QUOTE):end], end + len(QUOTE)
            if not self.closed:
                raise Malformed(f"unterminated string at {pos}")
            self._note("closed an unterminated <|\"|> string")
            end = self._peel(stack)
            return text[pos + len(QUOTE):end], end
        if text[pos] == "{":
            return self.object(pos, "}", schema, stack)
        if text[pos] == "[":
            return self.array(pos, schema, stack)
        if text[pos] in "\"'":
            return self._quoted(pos, text[pos])
        for word, literal in (("true", True), ("false", False), ("null", None)):
            if self.at(pos, word) and self._ends_value(pos + len(word)):
                return literal, pos + len(word)
        number = NUMBER.match(text, pos, self.limit)
        if number is not None and self._ends_value(number.end()):
            return json_numbers.Number(number.group(0)), number.end()
        return self._raw(pos, stack, siblings)

    # ------------------------------------------------------------------ helpers

    def _note(self, repair: str) -> None:
        if repair not in self.repairs:
            self.repairs.append(repair)

    def _unclosed(self, close: str) -> int:
        if not self.closed:
            raise Malformed(f"{close!r} missing: the call is cut short")
        self._note(f"added a missing {close!r}")
        return self.limit

    def _ends_value(self, pos: int) -> bool:
        pos = self.skip(pos)
        return pos >= self.limit or self.text[pos] in ",}])" or self.at(pos, QUOTE)

    def _after_value(self, pos: int) -> int:
        pos = self.skip(pos)
        if self.at(pos, QUOTE):  # a dangling delimiter after a value that had none
            self._note("dropped a stray <|\"|>")
            pos = self.skip(pos + len(QUOTE))
        return pos

    def _key(self, pos: int) -> tuple[str, int]:
        if self.at(pos, QUOTE):
            end = self.text.find(QUOTE, pos + len(QUOTE), self.limit)
            if end < 0:
                raise Malformed(f"unterminated key at {pos}")
            return self.text[pos + len(QUOTE):end], end + len(QUOTE)
        if self.text[pos] in "\"'":  # a JSON or single-quoted key: to its closing mark
            end = self.text.find(self.text[pos], pos + 1, self.limit)
            if end < 0:
                raise Malformed(f"unterminated key at {pos}")
            if self.text[pos] == '"':
                value, end = self.json_value(pos)
                return str(value), end
            return self.text[pos + 1:end], end + 1
        bare = _BARE_KEY.match(self.text, pos, self.limit)
        if bare is None:
            raise Malformed(f"no key at {pos}")
        return bare.group(0), bare.end()

    def _quoted(self, pos: int, mark: str) -> tuple[str, int]:
        """A string in ``"`` (JSON escapes, or inner quotes left unescaped) or ``'``: it ends
        at a closing mark followed by the end of the value."""
        if mark == '"':
            try:
                value, end = self.json_value(pos)
                if isinstance(value, str) and self._ends_value(end):
                    self._note('a JSON-quoted string')
                    return value, end
            except Malformed:
                pass
        end = pos + 1
        while True:
            end = self.text.find(mark, end, self.limit)
            if end < 0:
                raise Malformed(f"unterminated {mark}-quoted string at {pos}")
            if self._ends_value(end + 1):
                self._note("a single-quoted string" if mark == "'" else
                           "unescaped quotes in a JSON-quoted string")
                return self.text[pos + 1:end], end + 1
            end += 1

    def _raw(self, pos: int, stack: tuple[str, ...],
             siblings: Collection[str]) -> tuple[str, int]:
        """Text with no string delimiters: it ends at a dangling ``<|"|>`` (consumed), before
        ``,key:`` (a sibling key of the schema; any identifier when there is no schema), at
        a ``,`` or ``]`` in an array, or else where the enclosing brackets close at the end
        of the call."""
        text = self.text
        ends: list[int] = []
        quote = text.find(QUOTE, pos, self.limit)
        if quote >= 0:
            ends.append(quote)
        if stack and stack[-1] == "]":
            found = re.compile(r"[,\]]").search(text, pos, self.limit)
            if found is not None:
                ends.append(found.start())
        else:
            names = "|".join(re.escape(k) for k in siblings) if siblings else _ANY_KEY
            found = re.compile(rf",\s*(?:{names})\s*[:=]").search(text, pos, self.limit)
            if found is not None:
                ends.append(found.start())
        end = min(ends) if ends else self._peel(stack)
        value = text[pos:end].strip(_WS)
        if not value:
            raise Malformed(f"no value at {pos}")
        self._note("a string without <|\"|> delimiters")
        if quote >= 0 and end == quote:
            end += len(QUOTE)
        return value, end

    def _peel(self, stack: tuple[str, ...]) -> int:
        """Where the closers of ``stack`` begin at the end of the region (each one that is
        there; the missing ones are added when the call was closed)."""
        end = self.limit
        for close in reversed(stack):
            at = end
            while at > 0 and self.text[at - 1] in _WS:
                at -= 1
            if at > 0 and self.text[at - 1] == close:
                end = at - 1
        return end


def closers_only(text: str) -> bool:
    """True when ``text`` holds nothing but whitespace and closing brackets (the extra
    ``}`` a model may add after a call's arguments)."""
    return all(c in _WS or c in _CLOSERS for c in text)


__all__ = ["ArgumentReader", "Malformed", "closers_only", "properties"]
