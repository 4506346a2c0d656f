"""The ``/v1/responses`` front-end (OpenAI's Responses API): a :class:`ResponsesRequest` in the
core's terms.

A Responses request is a chat conversation said otherwise, so :func:`responses_plan` turns it
into the equivalent :class:`~.types.ChatCompletionRequest` and the core's job is that
request's (:func:`~.chat.chat_job`): the same prompt, sampling, constraint and tools, hence
the same text as ``/v1/chat/completions`` for the same conversation. The translation:

* ``input``: a string is one user message; items are ``message`` items (``input_text`` /
  ``output_text`` parts), ``function_call`` items (an assistant turn's tool calls; consecutive
  ones are one turn) and ``function_call_output`` items (tool results, by ``call_id``);
* ``instructions``: a system message first (not inherited by a continuation);
* ``previous_response_id``: the stored conversation of that response (:mod:`.response_store`)
  comes before ``input``;
* ``tools``: function tools (``{"type": "function", "name", "parameters"}``); built-in tools
  (web search, file search, ...) are refused by name;
* ``tool_choice``: ``auto`` / ``required`` / ``none`` / ``{"type": "function", "name"}``;
* ``text.format``: ``text``, ``json_object`` or ``json_schema`` (``name``, ``schema``);
* ``max_output_tokens``, ``temperature``, ``top_p`` and the sampling extensions as in chat.

Errors are :class:`~eliza_backends.errors.RequestError` s naming the Responses field
(``input.2.content``, ``text.format``, ``tools.0.type``). The answer's shapes are
:class:`~.responses_events.ResponsesFormatter`'s.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from ..errors import RequestError
from .chat import chat_job, chat_request_of
from .generation import GenerationJob
from .response_store import ResponseStore
from .responses_types import ResponsesRequest, unsupported_fields
from .types import ChatCompletionRequest

#: The request field a prompt error names.
PROMPT_PARAM = "input"

#: Chat request fields and the Responses fields they come from (for error messages).
_FIELD_NAMES = {"messages": "input", "response_format": "text.format",
                "max_completion_tokens": "max_output_tokens"}
#: Fields with the same name and meaning in both requests.
_SAME_FIELDS = ("temperature", "top_p", "seed", "top_k", "min_p", "repeat_penalty",
                "ignore_eos", "parallel_tool_calls")
_TEXT_PARTS = ("input_text", "output_text", "text")


@dataclass(frozen=True)
class ResponsesPlan:
    """What a Responses request runs: the core's ``job``; the equivalent ``chat`` request
    (its routing text and sampling); the ``conversation`` to store with the answer (the
    earlier conversation and this input, without ``instructions``)."""

    job: GenerationJob
    chat: ChatCompletionRequest
    conversation: list[dict[str, Any]]


def responses_plan(request: ResponsesRequest, store: ResponseStore | None) -> ResponsesPlan:
    """The plan of ``request``; ``store`` holds the responses that ``previous_response_id``
    may name. A field this server does not serve, a malformed item or an unknown previous
    response is a :class:`RequestError` naming the field."""
    problems = unsupported_fields(request)
    if problems:
        field, _ = problems[0]
        raise RequestError("; ".join(why for _, why in problems), param=field)
    earlier = _earlier_conversation(request, store)
    conversation = earlier + input_messages(request.input)
    messages = ([{"role": "system", "content": request.instructions}]
                if request.instructions else []) + conversation
    fields: dict[str, Any] = {"messages": messages}
    fields.update({k: getattr(request, k) for k in _SAME_FIELDS
                   if getattr(request, k) is not None})
    if request.max_output_tokens is not None:
        fields["max_completion_tokens"] = request.max_output_tokens
    if request.tools:
        fields["tools"] = chat_tools(request.tools)
    if request.tool_choice is not None:
        fields["tool_choice"] = chat_tool_choice(request.tool_choice)
    response_format = chat_response_format(request.text)
    if response_format is not None:
        fields["response_format"] = response_format
    chat = chat_request_of(fields, _FIELD_NAMES)
    return ResponsesPlan(chat_job(chat), chat, conversation)


def _earlier_conversation(request: ResponsesRequest, store: ResponseStore | None
                          ) -> list[dict[str, Any]]:
    """The conversation of ``previous_response_id`` (empty when none is named)."""
    if request.previous_response_id is None:
        return []
    entry = store.get(request.previous_response_id) if store is not None else None
    if entry is None:
        raise RequestError(f"previous response {request.previous_response_id!r} is not stored "
                           "here (it was made with store: false, deleted, evicted, or the "
                           "server restarted); send the whole conversation as input",
                           param="previous_response_id",
                           error_code="previous_response_not_found")
    return [dict(m) for m in entry.conversation]


def input_messages(data: str | list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Chat messages (template dicts) of a Responses ``input``."""
    if isinstance(data, str):
        return [{"role": "user", "content": data}]
    out: list[dict[str, Any]] = []
    for i, item in enumerate(data):
        kind = item.get("type", "message")
        if kind == "message":
            out.append(_message(item, f"input.{i}"))
        elif kind == "function_call":
            call = {"id": _text(item, "call_id", i), "type": "function",
                    "function": {"name": _text(item, "name", i),
                                 "arguments": _text(item, "arguments", i)}}
            last = out[-1] if out else None
            if last is not None and last["role"] == "assistant" and "tool_calls" in last:
                last["tool_calls"].append(call)
            else:
                out.append({"role": "assistant", "content": "", "tool_calls": [call]})
        elif kind == "function_call_output":
            output = item.get("output")
            text = output if isinstance(output, str) else _parts_text(output, f"input.{i}.output")
            out.append({"role": "tool", "tool_call_id": _text(item, "call_id", i),
                        "content": text})
        else:
            raise RequestError(f"input.{i}: items of type {kind!r} are not supported; send "
                               "message, function_call or function_call_output items",
                               param=f"input.{i}.type")
    if not out:
        raise RequestError("input is empty: send a string or at least one item",
                           param="input")
    return out


def _message(item: Mapping[str, Any], where: str) -> dict[str, Any]:
    role = item.get("role")
    if role not in ("user", "system", "developer", "assistant"):
        raise RequestError(f"{where}.role must be 'user', 'assistant', 'system' or "
                           f"'developer', got {role!r}", param=f"{where}.role")
    content = item.get("content")
    text = content if isinstance(content, str) else _parts_text(content, f"{where}.content")
    return {"role": "system" if role == "developer" else role, "content": text}


def _parts_text(parts: Any, where: str) -> str:
    """The text of a list of content parts; a part that is not text is refused by name."""
    if not isinstance(parts, list):
        raise RequestError(f"{where} must be a string or a list of text parts", param=where)
    texts = []
    for j, part in enumerate(parts):
        kind = part.get("type") if isinstance(part, Mapping) else None
        if kind not in _TEXT_PARTS or not isinstance(part.get("text"), str):
            raise RequestError(f"{where}.{j}: content parts of type {kind!r} are not supported "
                               "(this server takes text: input_text / output_text)",
                               param=f"{where}.{j}")
        texts.append(part["text"])
    return "".join(texts)


def _text(item: Mapping[str, Any], key: str, index: int) -> str:
    value = item.get(key)
    if not isinstance(value, str):
        raise RequestError(f"input.{index}.{key} must be a string", param=f"input.{index}.{key}")
    return value


def chat_tools(tools: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Chat ``tools`` of Responses function tools; a built-in tool is refused by name."""
    out = []
    for i, tool in enumerate(tools):
        kind = tool.get("type")
        if kind != "function":
            raise RequestError(f"tools.{i}: the tool type {kind!r} is not supported: this "
                               "server runs no built-in tools (web search, file search, code "
                               "interpreter, MCP, ...); declare function tools",
                               param=f"tools.{i}.type")
        function = {k: tool[k] for k in ("name", "description", "parameters") if k in tool}
        out.append({"type": "function", "function": function})
    return out


def chat_tool_choice(choice: str | dict[str, Any]) -> str | dict[str, Any]:
    """The chat ``tool_choice`` of a Responses one (``{"type": "function", "name": X}``)."""
    if isinstance(choice, str):
        return choice
    if choice.get("type") == "function" and isinstance(choice.get("name"), str):
        return {"type": "function", "function": {"name": choice["name"]}}
    raise RequestError(f"tool_choice {choice!r} is not supported; use 'auto', 'required', "
                       "'none' or {'type': 'function', 'name': ...}", param="tool_choice")


def chat_response_format(text: Mapping[str, Any] | None) -> dict[str, Any] | None:
    """The chat ``response_format`` of a Responses ``text`` setting (None: plain text)."""
    if not text:
        return None
    extra = set(text) - {"format", "verbosity"}
    if extra:
        raise RequestError(f"text.{sorted(extra)[0]} is not a known field; text takes format",
                           param=f"text.{sorted(extra)[0]}")
    if text.get("verbosity") not in (None, "medium"):
        raise RequestError("text.verbosity is not supported (the model's length is set by "
                           "max_output_tokens)", param="text.verbosity")
    fmt = text.get("format")
    if fmt is None:
        return None
    if not isinstance(fmt, Mapping):
        raise RequestError("text.format must be an object such as {'type': 'json_schema', "
                           "'name': ..., 'schema': {...}}", param="text.format")
    if fmt.get("type") == "json_schema":
        spec = {k: fmt[k] for k in ("name", "schema", "strict", "description") if k in fmt}
        return {"type": "json_schema", "json_schema": spec}
    return dict(fmt)


def conversation_reply(content: str | None, tool_calls: list[dict[str, Any]]) -> dict[str, Any]:
    """The assistant message (template dict) of a response's output, as a continuation sees
    it: its text, and its tool calls."""
    message: dict[str, Any] = {"role": "assistant", "content": content or ""}
    if tool_calls:
        message["tool_calls"] = [dict(c) for c in tool_calls]
    return message


__all__ = ["PROMPT_PARAM", "ResponsesPlan", "chat_response_format", "chat_tool_choice",
           "chat_tools", "conversation_reply", "input_messages", "responses_plan"]
