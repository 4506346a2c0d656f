"""The constraints the structured-output tests run on every backend: JSON schemas (nested
objects, enums, arrays, numbers, required and optional properties), regexes and grammars
(Lark and GBNF). Bounded (string lengths, array sizes, number ranges), so that even the tiny
model finishes each one inside the test budget; the text then must validate."""

from __future__ import annotations

import json
import re
from typing import Any

from eliza_backends.structured.constraint import Constraint

NAME = {"type": "string", "maxLength": 12}

SCHEMAS: dict[str, dict[str, Any]] = {
    "flat": {"type": "object", "properties": {"name": NAME, "age": {
        "type": "integer", "minimum": 0, "maximum": 120}},
        "required": ["name", "age"], "additionalProperties": False},
    "enum": {"type": "object", "properties": {"color": {"enum": ["red", "green", "blue"]},
                                              "size": {"enum": ["S", "M", "L"]}},
             "required": ["color", "size"], "additionalProperties": False},
    "array_of_strings": {"type": "object", "properties": {"tags": {
        "type": "array", "items": {"type": "string", "maxLength": 8}, "minItems": 1,
        "maxItems": 3}}, "required": ["tags"], "additionalProperties": False},
    "array_of_ints": {"type": "array", "items": {"type": "integer", "minimum": -50,
                                                 "maximum": 50}, "minItems": 2, "maxItems": 4},
    "numbers": {"type": "object", "properties": {
        "price": {"type": "number", "minimum": 0, "maximum": 1000},
        "count": {"type": "integer", "minimum": 1, "maximum": 9},
        "ratio": {"type": "number", "minimum": 0, "maximum": 1}},
        "required": ["price", "count", "ratio"], "additionalProperties": False},
    "nested": {"type": "object", "properties": {
        "user": {"type": "object", "properties": {
            "name": NAME, "address": {"type": "object", "properties": {
                "city": NAME, "zip": {"type": "string", "pattern": "^[0-9]{5}$"}},
                "required": ["city", "zip"], "additionalProperties": False}},
            "required": ["name", "address"], "additionalProperties": False}},
        "required": ["user"], "additionalProperties": False},
    "optional": {"type": "object", "properties": {
        "title": NAME, "subtitle": NAME, "year": {"type": "integer", "minimum": 1900,
                                                  "maximum": 2100}},
        "required": ["title"], "additionalProperties": False},
    "boolean_and_null": {"type": "object", "properties": {
        "done": {"type": "boolean"}, "note": {"type": ["string", "null"], "maxLength": 10}},
        "required": ["done", "note"], "additionalProperties": False},
    "array_of_objects": {"type": "object", "properties": {"items": {
        "type": "array", "minItems": 1, "maxItems": 2, "items": {
            "type": "object", "properties": {"id": {"type": "integer", "minimum": 1,
                                                    "maximum": 99},
                                             "kind": {"enum": ["a", "b"]}},
            "required": ["id", "kind"], "additionalProperties": False}}},
        "required": ["items"], "additionalProperties": False},
    "any_of": {"type": "object", "properties": {"value": {"anyOf": [
        {"type": "integer", "minimum": 0, "maximum": 9}, {"enum": ["none", "many"]}]}},
        "required": ["value"], "additionalProperties": False},
    "const_and_string_pattern": {"type": "object", "properties": {
        "version": {"const": 2}, "code": {"type": "string", "pattern": "^[A-Z]{3}-[0-9]{2}$"}},
        "required": ["version", "code"], "additionalProperties": False},
}

REGEXES: dict[str, str] = {
    "date": r"(19|20)[0-9]{2}-(0[1-9]|1[0-2])-(0[1-9]|[12][0-9])",
    "words": r"[a-z]{2,7}( [a-z]{2,7}){2,4}\.",
    "phone": r"\+1 [0-9]{3}-[0-9]{3}-[0-9]{4}",
}

LARK = """
start: sentence
sentence: subject " " verb " " object "."
subject: "the cat" | "a dog" | "my friend"
verb: "sees" | "likes" | "follows"
object: "the moon" | NUMBER " birds"
NUMBER: /[1-9][0-9]?/
"""

GBNF = r"""
root   ::= answer
answer ::= "yes" | "no" | "maybe (" digit digit? ")"
digit  ::= [0-9]
"""

LARK_RE = re.compile(r"(the cat|a dog|my friend) (sees|likes|follows) "
                     r"(the moon|[1-9][0-9]? birds)\.")
GBNF_RE = re.compile(r"yes|no|maybe \([0-9][0-9]?\)")

GRAMMARS: dict[str, tuple[str, re.Pattern[str]]] = {"lark": (LARK, LARK_RE),
                                                   "gbnf": (GBNF, GBNF_RE)}


def cases() -> dict[str, Constraint]:
    """Every constraint by test id."""
    out = {f"schema-{k}": Constraint.json_schema(v) for k, v in SCHEMAS.items()}
    out.update({f"regex-{k}": Constraint.regex(v) for k, v in REGEXES.items()})
    out.update({f"grammar-{k}": Constraint.grammar(v[0]) for k, v in GRAMMARS.items()})
    return out


def check(case: str, text: str) -> None:
    """Assert ``text`` satisfies the constraint ``case`` (jsonschema for the schemas)."""
    import jsonschema

    kind, _, name = case.partition("-")
    if kind == "schema":
        jsonschema.validate(json.loads(text), SCHEMAS[name])
    elif kind == "regex":
        assert re.fullmatch(REGEXES[name], text), (case, text)
    else:
        assert GRAMMARS[name][1].fullmatch(text), (case, text)
