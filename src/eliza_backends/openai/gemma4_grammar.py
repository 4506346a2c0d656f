"""The grammar of a Gemma 4 reply that must call a tool, in Gemma 4's own call syntax.

With ``tool_choice`` ``"required"`` or a named tool, a Gemma 4 model (its own template,
:func:`~eliza_backends.openai.gemma4_calls.is_gemma4_template`) is constrained to what it was
trained to write rather than to JSON: one call (or several, when parallel calls are allowed) of
the form its template renders for earlier calls::

    <|tool_call>call:get_weather{city:<|"|>Paris<|"|>,days:3}<tool_call|>

:func:`gemma4_call_grammar` turns the tools' ``parameters`` schemas into an llguidance Lark
grammar (:class:`~eliza_backends.structured.constraint.Constraint`): members in the template's
order (keys sorted case-insensitively, as Jinja's ``dictsort``), required ones always, optional
ones maybe; strings in ``<|"|>`` (never containing it); ``enum`` / ``const``; integers and
numbers (at most 19 digits before the point); booleans, null; arrays (``minItems`` 0 or more);
nested objects; ``anyOf`` / ``oneOf`` / a list of types. A schema this does not cover (``$ref``,
``allOf``, an object with no ``properties``) accepts any Gemma 4 value. Lengths
(``minLength`` / ``maxLength``) bound strings. The markers are written as text: on every
backend they are text tokens of the vocabulary (llama.cpp's converter makes them so, and the
Hugging Face vocabularies keep their text, :data:`~eliza_backends.runtime.text.RENDERED_SPECIAL`).

Pure; any thread.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from typing import Any

from ..structured.constraint import Constraint
from .gemma4_calls import QUOTE

_GENERIC = r"""
gv: gstr | GNUM | "true" | "false" | "null" | gobj | garr
gstr: STR
gobj: "{" (GKEY ":" gv ("," GKEY ":" gv)*)? "}"
garr: "[" (gv ("," gv)*)? "]"
GKEY: /[A-Za-z_][A-Za-z0-9_]*/
GNUM: /-?(0|[1-9][0-9]{0,18})(\.[0-9]{1,18})?([eE][+-]?[0-9]{1,3})?/
INT: /-?(0|[1-9][0-9]{0,18})/
STR: /<\|"\|>(?s:.*)<\|"\|>/ & ~/(?s:.+)<\|"\|>(?s:.+)/
"""


def _literal(text: str) -> str:
    """``text`` as a Lark string literal."""
    return json.dumps(text, ensure_ascii=False)


class _Rules:
    """The rules of one grammar, named as they are made."""

    def __init__(self) -> None:
        self.lines: list[str] = [f"QT: {_literal(QUOTE)}"]
        self.count = 0

    def add(self, body: str) -> str:
        self.count += 1
        name = f"r{self.count}"
        self.lines.append(f"{name}: {body}")
        return name

    def value(self, schema: Any) -> str:
        """A rule (or expression) for a value valid against ``schema``."""
        if not isinstance(schema, Mapping):
            return "gv"
        if "const" in schema:
            return self._constant(schema["const"])
        if isinstance(schema.get("enum"), list) and schema["enum"]:
            return self.add(" | ".join(self._constant(v) for v in schema["enum"]))
        for key in ("anyOf", "oneOf"):
            options = schema.get(key)
            if isinstance(options, list) and options:
                return self.add(" | ".join(self.value(o) for o in options))
        kind = schema.get("type")
        if isinstance(kind, list) and kind:
            return self.add(" | ".join(self.value({**schema, "type": k}) for k in kind))
        return self._typed(kind, schema)

    def _typed(self, kind: Any, schema: Mapping[str, Any]) -> str:
        if kind == "string":
            return self._string(schema)
        if kind == "integer":
            return "INT"
        if kind == "number":
            return "GNUM"
        if kind == "boolean":
            return self.add('"true" | "false"')
        if kind == "null":
            return '"null"'
        if kind == "array":
            item = self.value(schema.get("items"))
            least = schema.get("minItems")
            some = f"{item} (\",\" {item})*"
            return self.add(f'"[" {some} "]"' if isinstance(least, int) and least > 0
                            else f'"[" ({some})? "]"')
        props = schema.get("properties")
        if kind in ("object", None) and isinstance(props, Mapping) and props:
            return self.add(f'"{{" {self.members(schema)} "}}"')
        return "gobj" if kind == "object" else "gv"

    def _string(self, schema: Mapping[str, Any]) -> str:
        low, high = schema.get("minLength"), schema.get("maxLength")
        if not isinstance(low, int) and not isinstance(high, int):
            return "gstr"
        low = low if isinstance(low, int) and low > 0 else 0
        bound = f"{low},{high}" if isinstance(high, int) else f"{low},"
        self.count += 1
        term = f"S{self.count}"
        self.lines.append(f'{term}: /<\\|"\\|>(?s:.{{{bound}}})<\\|"\\|>/ & '
                          '~/(?s:.+)<\\|"\\|>(?s:.+)/')
        return term

    def _constant(self, value: Any) -> str:
        if isinstance(value, str):
            return f"QT {_literal(value)} QT" if value else "QT QT"
        if isinstance(value, bool):
            return '"true"' if value else '"false"'
        if value is None:
            return '"null"'
        if isinstance(value, int | float):
            return _literal(json.dumps(value))
        return "gv"

    def members(self, schema: Mapping[str, Any]) -> str:
        """The members of an object schema in the template's order (keys sorted without
        case), each optional one maybe left out, commas only between the ones written."""
        props: Mapping[str, Any] = schema.get("properties") or {}
        need = schema.get("required")
        required = set(need) if isinstance(need, list) else set()
        keys = sorted(props, key=lambda k: (k.lower(), k))
        parts = [(f'{_literal(k + ":")} {self.value(props[k])}', k in required) for k in keys]
        # rest[i]: the members from i on, after one was written (each with its comma);
        # first[i]: the members from i on, none written yet
        rest, first = "", ""
        for i in range(len(parts) - 1, -1, -1):
            member, needed = parts[i]
            tail = rest
            if i:  # (the first member is never after another)
                rest = self.add(f'"," {member} {tail}'.strip()) if needed else \
                    self.add(f'("," {member})? {tail}'.strip())
            first = self.add(f"{member} {tail}".strip()) if needed else \
                self.add(f"{member} {tail} | {first}".strip(" |") if first
                         else f"({member} {tail})?".strip())
        return first


def gemma4_call_grammar(tools: Sequence[tuple[str, Mapping[str, Any]]], *, parallel: bool
                        ) -> str:
    """The Lark grammar of a reply that calls one of ``tools`` ((name, parameters schema)
    pairs): one call, or one or more when ``parallel``."""
    rules = _Rules()
    calls = []
    for name, schema in tools:
        args = rules.members(schema) if isinstance(schema.get("properties"), Mapping) \
            and schema["properties"] else '(GKEY ":" gv ("," GKEY ":" gv)*)?'
        calls.append(rules.add(f'"<|tool_call>" {_literal("call:" + name + "{")} {args} '
                               '"}<tool_call|>"'))
    call = rules.add(" | ".join(calls))
    start = f"{call}+" if parallel else call
    return "\n".join([f"start: {start}", *rules.lines, _GENERIC])


def gemma4_call_constraint(tools: Sequence[tuple[str, Mapping[str, Any]]], *, parallel: bool
                           ) -> Constraint:
    """:func:`gemma4_call_grammar` as a :class:`Constraint`."""
    return Constraint.grammar(gemma4_call_grammar(tools, parallel=parallel))


__all__ = ["gemma4_call_constraint", "gemma4_call_grammar"]
