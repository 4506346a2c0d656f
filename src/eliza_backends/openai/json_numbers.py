"""JSON whose numbers keep their literals: tool-call ``arguments`` that are always JSON text.

A model's tool call may hold any number the JSON grammar allows. Python's :mod:`json` reads
``1e999`` as ``inf`` and writes it back as ``Infinity`` (not JSON: every strict client refuses
it), and refuses an integer longer than 4,300 digits (an untyped ``ValueError``). Here every
number stays the text the model wrote (:class:`Number`), so what goes out is what came in:
:func:`loads` reads JSON text keeping the literals, :func:`dumps` writes such a value back in
:func:`json.dumps`'s layout (``", "`` and ``": "`` separators, non-ASCII kept), so ordinary
arguments come out exactly as ``json.dumps`` of the parsed value would write them.

Pure functions; any thread.
"""

from __future__ import annotations

import json
from typing import Any


class Number(str):
    """A JSON number as written (its literal matches the JSON number grammar); written back
    unchanged by :func:`dumps`. A client reads it with its own number type."""

    __slots__ = ()


def _refuse_constant(name: str) -> Any:
    raise ValueError(f"{name} is not JSON")


def loads(text: str) -> Any:
    """``text`` parsed as JSON with every number a :class:`Number` (its literal). Raises
    ``ValueError`` for text that is not JSON (``NaN`` and ``Infinity`` included) and
    ``RecursionError`` for nesting deeper than Python's recursion limit."""
    return json.loads(text, parse_int=Number, parse_float=Number,
                      parse_constant=_refuse_constant)


def dumps(value: Any) -> str:
    """JSON text of ``value``: dicts (string keys), lists, strings, :class:`Number`, bools,
    None, and finite ints and floats. Raises ``ValueError`` for anything else (a non-finite
    float included), so the text is always JSON."""
    if isinstance(value, Number):
        return str(value)
    if isinstance(value, str):
        return json.dumps(value, ensure_ascii=False)
    if value is None or isinstance(value, bool | int | float):
        return json.dumps(value, allow_nan=False)
    if isinstance(value, dict):
        return "{" + ", ".join(f"{dumps(str(k))}: {dumps(v)}" for k, v in value.items()) + "}"
    if isinstance(value, list | tuple):
        return "[" + ", ".join(dumps(v) for v in value) + "]"
    raise ValueError(f"{type(value).__name__} is not a JSON value")


__all__ = ["Number", "dumps", "loads"]
