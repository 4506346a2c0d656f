"""Tool calls, OpenAI-style: ``tools`` / ``tool_choice`` in, ``tool_calls`` out, on every backend.

The model is told about the tools through its own chat template when the template renders a
``tools`` variable (it then gets ``tools=`` as Hugging Face templates expect); otherwise a
system message lists them (name, description, parameter schema) and says how to answer. Either
way the reply is **constrained** (:mod:`eliza_backends.structured.constraint`) to one JSON object:

* ``{"tool_calls": [{"name": <tool>, "arguments": {...}}, ...]}``, each item valid against its
  tool's ``parameters`` schema (the ``name`` picks the schema); or, with ``tool_choice="auto"``,
* ``{"content": "<text>"}`` for a plain answer.

:func:`parse_reply` turns that JSON back into OpenAI ``tool_calls`` (``arguments`` as JSON text)
or content. Tool results come back as ``{"role": "tool", "tool_call_id", "content"}`` messages,
and earlier assistant turns with ``tool_calls`` as the JSON the model wrote
(:func:`prepare_messages`), so the conversation the model sees is the one it produced.

Gemma 4 is the exception (:mod:`eliza_backends.openai.gemma4_calls`): with its own template
the reply is written and read in Gemma 4's trained syntax
(``<|tool_call>call:name{key:<|"|>text<|"|>}<tool_call|>``, read as it streams and repaired
where a model slips: :mod:`eliza_backends.openai.gemma4_reader`), and earlier calls are
rendered by the template in that syntax. ``"auto"`` leaves the reply unconstrained;
``"required"`` or a named tool constrain it to calls in that syntax
(:mod:`eliza_backends.openai.gemma4_grammar`).

Limit: for other models the answer format is this JSON, not their own trained call syntax
(Hermes ``<tool_call>`` tags, Llama 3.1's ``<|python_tag|>``).
"""

from __future__ import annotations

import json
import re
import uuid
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from ..errors import InvalidArgumentError
from ..structured.constraint import Constraint
from . import json_numbers
from .gemma4_calls import is_gemma4_template
from .gemma4_grammar import gemma4_call_constraint
from .gemma4_reader import ToolSchemas, read_gemma4_reply

_NAME = re.compile(r"^[A-Za-z0-9_-]{1,64}$")


@dataclass(frozen=True)
class Tool:
    """One function tool: ``name``, ``description`` and ``parameters`` (a JSON schema)."""

    name: str
    description: str
    parameters: Mapping[str, Any]

    def openai(self) -> dict[str, Any]:
        """The OpenAI ``{"type": "function", "function": {...}}`` form (what templates get)."""
        return {"type": "function", "function": {"name": self.name,
                                                 "description": self.description,
                                                 "parameters": dict(self.parameters)}}


def parse_tools(tools: Sequence[Mapping[str, Any]]) -> list[Tool]:
    """Validate OpenAI ``tools``: ``[{"type": "function", "function": {"name", "description",
    "parameters"}}]``; names unique, ``[A-Za-z0-9_-]{1,64}``."""
    out: list[Tool] = []
    for i, item in enumerate(tools):
        fn = item.get("function") if isinstance(item, Mapping) else None
        if not isinstance(item, Mapping) or item.get("type", "function") != "function" or \
                not isinstance(fn, Mapping):
            raise InvalidArgumentError(f"tools[{i}] must be {{'type': 'function', 'function': "
                                       "{'name': ..., 'parameters': {...}}}")
        name = fn.get("name")
        if not isinstance(name, str) or not _NAME.match(name):
            raise InvalidArgumentError(f"tools[{i}].function.name must match "
                                       f"[A-Za-z0-9_-]{{1,64}}, got {name!r}")
        if any(t.name == name for t in out):
            raise InvalidArgumentError(f"tools[{i}]: the name {name!r} is used twice")
        params = fn.get("parameters", {"type": "object", "properties": {}})
        if not isinstance(params, Mapping):
            raise InvalidArgumentError(f"tools[{i}].function.parameters must be a JSON schema "
                                       "object")
        desc = fn.get("description", "")
        out.append(Tool(name, desc if isinstance(desc, str) else "", params))
    if not out:
        raise InvalidArgumentError("tools is empty: send at least one tool, or leave it out")
    return out


def chosen_tools(tools: Sequence[Tool], tool_choice: str | Mapping[str, Any] | None
                 ) -> tuple[list[Tool], bool]:
    """The tools the reply may call and whether it must call one, for OpenAI's
    ``tool_choice``: ``"auto"`` (default: any tool, or a plain answer), ``"required"`` (any
    tool), ``{"type": "function", "function": {"name": X}}`` (tool X), ``"none"`` (no call)."""
    if tool_choice is None or tool_choice == "auto":
        return list(tools), False
    if tool_choice == "required":
        return list(tools), True
    if tool_choice == "none":
        return [], False
    if isinstance(tool_choice, Mapping):
        fn = tool_choice.get("function")
        name = fn.get("name") if isinstance(fn, Mapping) else None
        picked = [t for t in tools if t.name == name]
        if not picked:
            raise InvalidArgumentError(f"tool_choice names {name!r}, which is not in tools "
                                       f"({', '.join(t.name for t in tools)})")
        return picked, True
    raise InvalidArgumentError(f"tool_choice must be 'auto', 'required', 'none' or "
                               f"{{'type': 'function', 'function': {{'name': ...}}}}, got "
                               f"{tool_choice!r}")


def reply_schema(tools: Sequence[Tool], *, required: bool, parallel: bool = True
                 ) -> dict[str, Any]:
    """The JSON schema of a reply that calls ``tools`` (one call when not ``parallel``), or
    also answers in plain text when not ``required``."""
    calls: dict[str, Any] = {
        "type": "array", "minItems": 1,
        "items": {"anyOf": [{
            "type": "object",
            "properties": {"name": {"const": t.name}, "arguments": dict(t.parameters)},
            "required": ["name", "arguments"], "additionalProperties": False} for t in tools]}}
    if not parallel:
        calls["maxItems"] = 1
    call = {"type": "object", "properties": {"tool_calls": calls}, "required": ["tool_calls"],
            "additionalProperties": False}
    if required:
        return call
    answer = {"type": "object", "properties": {"content": {"type": "string"}},
              "required": ["content"], "additionalProperties": False}
    return {"anyOf": [call, answer]}


def reply_constraint(tools: Sequence[Tool], tool_choice: str | Mapping[str, Any] | None,
                     parallel: bool | None = None) -> Constraint | None:
    """The constraint on the reply for ``tools`` and ``tool_choice`` (None for ``"none"``)."""
    allowed, required = chosen_tools(tools, tool_choice)
    if not allowed:
        return None
    return Constraint.json_schema(reply_schema(allowed, required=required,
                                               parallel=parallel is not False))


def template_renders_tools(template: str) -> bool:
    """Whether a chat template reads a ``tools`` variable (Hugging Face tool templates)."""
    return re.search(r"\btools\b", template) is not None


def instructions(tools: Sequence[Tool], *, required: bool) -> str:
    """The system text that describes ``tools`` to a model whose template does not."""
    lines = ["You can call these tools:"]
    for t in tools:
        lines.append(f"- {t.name}: {t.description}".rstrip(": ")
                     + f" Parameters (JSON schema): {json.dumps(t.parameters)}")
    lines.append('To call tools, answer with JSON: {"tool_calls": [{"name": "<tool>", '
                 '"arguments": {...}}]}.')
    if not required:
        lines.append('To answer without a tool, answer with JSON: {"content": "<answer>"}.')
    return "\n".join(lines)


def prepare_messages(messages: Sequence[Mapping[str, Any]], tools: Sequence[Tool],
                     tool_choice: str | Mapping[str, Any] | None, template: str
                     ) -> tuple[list[dict[str, Any]], dict[str, Any]]:
    """The messages (and extra template variables) a chat template renders for a request with
    ``tools``: earlier assistant ``tool_calls`` become the JSON the model wrote (for a Gemma 4
    template, :func:`is_gemma4_template`, they stay ``tool_calls`` with ``arguments`` decoded,
    for the template to write in Gemma's own syntax); ``tool`` results are kept as ``tool``
    messages when the template renders tools, else become user messages naming the call;
    without template support, a system message lists the tools."""
    allowed, required = chosen_tools(tools, tool_choice)
    native = template_renders_tools(template)
    gemma4 = is_gemma4_template(template)
    out: list[dict[str, Any]] = []
    for m in messages:
        msg = dict(m)
        calls = msg.pop("tool_calls", None)
        if msg.get("role") == "assistant" and calls and gemma4:
            msg["tool_calls"] = [{**c, "function": {
                **c["function"], "arguments": _arguments(c["function"].get("arguments", "{}"))}}
                for c in calls]  # the template writes a mapping in its own call syntax
        elif msg.get("role") == "assistant" and calls:
            msg["content"] = json.dumps({"tool_calls": [
                {"name": c["function"]["name"],
                 "arguments": _arguments(c["function"].get("arguments", "{}"))}
                for c in calls]}, separators=(",", ":"))
            if native:
                msg["tool_calls"] = calls
        elif msg.get("role") == "tool" and not native:
            call_id = msg.get("tool_call_id")
            label = f"Result of tool call {call_id}" if call_id else "Tool result"
            msg = {"role": "user", "content": f"{label}: {msg.get('content') or ''}"}
        msg.setdefault("content", "")
        if msg["content"] is None:
            msg["content"] = ""
        out.append(msg)
    if native or not allowed:
        return out, {"tools": [t.openai() for t in tools]} if native else {}
    text = instructions(allowed, required=required)
    if out and out[0].get("role") == "system":
        out[0] = {**out[0], "content": f"{out[0]['content']}\n\n{text}".lstrip()}
    else:
        out.insert(0, {"role": "system", "content": text})
    return out, {}


def _arguments(raw: Any) -> Any:
    if isinstance(raw, str):
        try:
            return json.loads(raw)
        except (ValueError, RecursionError):  # kept as the text the client sent
            return raw
    return raw


def native_calls(template: str, tool_choice: str | Mapping[str, Any] | None) -> bool:
    """Whether the reply is written and read in the model's own call syntax: a Gemma 4
    template (:func:`is_gemma4_template`) and a ``tool_choice`` other than ``"none"``
    (:func:`native_constraint` says how it is constrained)."""
    return is_gemma4_template(template) and tool_choice != "none"


def native_tools(tools: Sequence[Tool], tool_choice: str | Mapping[str, Any] | None
                 ) -> ToolSchemas:
    """The tools a reply in the model's own syntax may call (name -> parameters schema)."""
    return {t.name: t.parameters for t in chosen_tools(tools, tool_choice)[0]}


def native_constraint(tools: Sequence[Tool], tool_choice: str | Mapping[str, Any] | None,
                      parallel: bool = True) -> Constraint | None:
    """The constraint on a reply in Gemma 4's own syntax: none for ``"auto"`` (the model may
    answer in text), calls in that syntax for ``"required"`` or a named tool (one call when
    not ``parallel``)."""
    allowed, required = chosen_tools(tools, tool_choice)
    if not required:
        return None
    return gemma4_call_constraint([(t.name, t.parameters) for t in allowed], parallel=parallel)


def parse_reply(text: str, *, native: Sequence[Tool] | None = None
                ) -> tuple[str | None, list[dict[str, Any]]]:
    """(content, tool_calls) of a constrained reply: OpenAI ``tool_calls`` items (``id``,
    ``type``, ``function: {name, arguments}``, arguments as JSON text), or the ``content``.
    Text that is not such JSON (a reply cut short by ``max_tokens``) is returned as content.
    ``native``: the tools a Gemma 4 reply may call (:func:`native_calls`); the text is then
    read in Gemma 4's own syntax, repairing what a person would
    (:func:`~eliza_backends.openai.gemma4_reader.read_gemma4_reply`).
    ``arguments`` are always JSON text: numbers keep the literals the model wrote
    (:mod:`eliza_backends.openai.json_numbers`), however large."""
    if native is not None:
        return read_gemma4_reply(text, {t.name: t.parameters for t in native})
    try:
        data = json_numbers.loads(text)  # numbers keep their literals (1e999, huge ints)
    except (ValueError, RecursionError):
        return text, []
    if isinstance(data, dict) and isinstance(data.get("tool_calls"), list):
        calls = []
        for item in data["tool_calls"]:
            if isinstance(item, dict) and isinstance(item.get("name"), str):
                calls.append({"id": f"call_{uuid.uuid4().hex[:24]}", "type": "function",
                              "function": {"name": item["name"], "arguments":
                                           json_numbers.dumps(item.get("arguments", {}))}})
        return None, calls
    if isinstance(data, dict) and isinstance(data.get("content"), str):
        return data["content"], []
    return text, []


__all__ = ["Tool", "chosen_tools", "instructions", "native_calls", "native_constraint",
           "native_tools", "parse_reply", "parse_tools", "prepare_messages", "reply_constraint",
           "reply_schema", "template_renders_tools"]
