"""The ``/v1/messages`` front-end (Anthropic's Messages API): a :class:`MessagesRequest` in the
core's terms.

Like the Responses front-end, it turns the request into the equivalent
:class:`~.types.ChatCompletionRequest` and runs that request's job (:func:`~.chat.chat_job`),
so the text equals ``/v1/chat/completions``' for the same conversation. The translation:

* ``system`` (text or text blocks): a system message first;
* ``messages``: ``text`` blocks are the message's text; an assistant turn's ``tool_use`` blocks
  are its tool calls (``input`` as the arguments); a user turn's ``tool_result`` blocks are
  tool results (by ``tool_use_id``; ``is_error`` results start with ``Error:``), before the
  turn's text; images, documents and thinking blocks are refused by name;
* ``tools`` (``name``, ``description``, ``input_schema``): function tools; Anthropic's server
  tools (web search, bash, text editor, ...) are refused by name;
* ``tool_choice``: ``auto``, ``any`` (a call is required), ``tool`` (that one), ``none``;
  ``disable_parallel_tool_use``: at most one call;
* ``max_tokens`` (required on ``/v1/messages``), ``stop_sequences`` (at most 4),
  ``temperature``, ``top_p``, ``top_k`` and the sampling extensions as in chat.

Errors are :class:`~eliza_backends.errors.RequestError` s naming the Messages field. The
answer's shapes are :class:`~.anthropic_events.MessagesFormatter`'s.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import Any

from ..errors import RequestError
from .anthropic_types import MessagesRequest, unsupported_fields
from .chat import chat_request_of
from .types import ChatCompletionRequest

#: The request field a prompt error names.
PROMPT_PARAM = "messages"

#: Chat request fields and the Messages fields they come from (for error messages).
_FIELD_NAMES = {"max_completion_tokens": "max_tokens", "stop": "stop_sequences"}
_SAMPLING = ("temperature", "top_p", "top_k", "seed", "min_p", "repeat_penalty", "ignore_eos")


def chat_request(request: MessagesRequest, *, need_budget: bool = True
                 ) -> ChatCompletionRequest:
    """The chat request equivalent to ``request`` (its job is the core's job); a field this
    server does not serve, a malformed block, or a missing ``max_tokens`` (``need_budget``)
    is a :class:`RequestError` naming the field."""
    problems = unsupported_fields(request)
    if problems:
        raise RequestError("; ".join(why for _, why in problems), param=problems[0][0])
    last = len(request.messages) - 1
    if request.messages[last].role == "assistant":
        raise RequestError(f"messages.{last}: the last message is the assistant's; prefilling "
                           "the assistant's reply is not supported: end with a user message",
                           param=f"messages.{last}")
    if need_budget and request.max_tokens is None:
        raise RequestError("max_tokens is required: the most tokens to generate",
                           param="max_tokens")
    messages = ([{"role": "system", "content": system_text(request.system)}]
                if request.system else []) + chat_messages(request)
    fields: dict[str, Any] = {"messages": messages}
    fields.update({k: getattr(request, k) for k in _SAMPLING if getattr(request, k) is not None})
    if request.max_tokens is not None:
        fields["max_completion_tokens"] = request.max_tokens
    if request.stop_sequences:
        fields["stop"] = request.stop_sequences
    if request.tools:
        fields["tools"] = chat_tools(request.tools)
    if request.tool_choice is not None:
        fields["tool_choice"], parallel = chat_tool_choice(request.tool_choice)
        if not parallel:
            fields["parallel_tool_calls"] = False
    return chat_request_of(fields, _FIELD_NAMES)


def system_text(system: str | list[dict[str, Any]] | None) -> str:
    """The text of ``system`` (a string, or text blocks)."""
    if system is None or isinstance(system, str):
        return system or ""
    return "".join(_block_text(b, f"system.{i}") for i, b in enumerate(system))


def _block_text(block: Mapping[str, Any], where: str) -> str:
    if block.get("type") != "text" or not isinstance(block.get("text"), str):
        raise RequestError(f"{where}: blocks of type {block.get('type')!r} are not supported "
                           "here (this server takes text)", param=where)
    return str(block["text"])


def chat_messages(request: MessagesRequest) -> list[dict[str, Any]]:
    """Chat messages (template dicts) of the request's ``messages``."""
    out: list[dict[str, Any]] = []
    for i, message in enumerate(request.messages):
        where = f"messages.{i}.content"
        if isinstance(message.content, str):
            out.append({"role": message.role, "content": message.content})
            continue
        texts, calls, results = [], [], []
        for j, block in enumerate(message.content):
            kind = block.get("type")
            if kind == "tool_use" and message.role == "assistant":
                calls.append({"id": str(block.get("id")), "type": "function", "function": {
                    "name": str(block.get("name")),
                    "arguments": json.dumps(block.get("input", {}), ensure_ascii=False)}})
            elif kind == "tool_result" and message.role == "user":
                results.append(_tool_result(block, f"{where}.{j}"))
            else:
                texts.append(_block_text(block, f"{where}.{j}"))
        out.extend(results)
        if texts or not results:
            reply: dict[str, Any] = {"role": message.role, "content": "".join(texts)}
            if calls:
                reply["tool_calls"] = calls
            out.append(reply)
    return out


def _tool_result(block: Mapping[str, Any], where: str) -> dict[str, Any]:
    content = block.get("content", "")
    text = content if isinstance(content, str) else "".join(
        _block_text(b, f"{where}.content.{k}") for k, b in enumerate(content or []))
    if block.get("is_error"):
        text = f"Error: {text}"
    return {"role": "tool", "tool_call_id": str(block.get("tool_use_id")), "content": text}


def chat_tools(tools: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Chat ``tools`` of Anthropic tools; a server tool is refused by name."""
    out = []
    for i, tool in enumerate(tools):
        kind = tool.get("type")
        if kind not in (None, "custom"):
            raise RequestError(f"tools.{i}: the tool type {kind!r} is not supported: this "
                               "server runs no server tools (web search, bash, text editor, "
                               "...); declare custom tools (name, input_schema)",
                               param=f"tools.{i}.type")
        function = {"name": tool.get("name"), "description": tool.get("description", ""),
                    "parameters": tool.get("input_schema", {"type": "object"})}
        out.append({"type": "function", "function": function})
    return out


def chat_tool_choice(choice: Mapping[str, Any]) -> tuple[str | dict[str, Any], bool]:
    """The chat ``tool_choice`` of an Anthropic one, and whether parallel calls are allowed."""
    parallel = not choice.get("disable_parallel_tool_use", False)
    kind = choice.get("type")
    if kind in ("auto", "none"):
        return str(kind), parallel
    if kind == "any":
        return "required", parallel
    if kind == "tool" and isinstance(choice.get("name"), str):
        return {"type": "function", "function": {"name": choice["name"]}}, parallel
    raise RequestError(f"tool_choice {dict(choice)!r} is not one of {{'type': 'auto'}}, "
                       "{'type': 'any'}, {'type': 'tool', 'name': ...}, {'type': 'none'}",
                       param="tool_choice")


__all__ = ["PROMPT_PARAM", "chat_messages", "chat_request", "chat_tool_choice", "chat_tools",
           "system_text"]
