"""``POST /v1/responses`` (OpenAI's Responses API) driven by the official ``openai`` SDK against
the real server on the tiny bundle (llama.cpp): plain, streamed, tools with a
``function_call_output`` round trip, ``text.format`` json_schema, ``previous_response_id`` with
the store (``GET`` / ``DELETE``), refused fields; each answer the same text as
``/v1/chat/completions`` gives for the same conversation (greedy). Then the store's bounds."""

from __future__ import annotations

import importlib.util
import json
from collections.abc import Iterator
from typing import Any

import openai
import pytest
from conftest import TINY_BUNDLE
from server_process import ServerProcess

from eliza_backends.openai.response_store import ResponseStore
from eliza_backends.openai.responses_types import Response

pytestmark = pytest.mark.skipif(importlib.util.find_spec("llama_cpp") is None,
                                reason="llama_cpp is not installed")

QUESTION = "What is two plus two?"
SYSTEM = "Answer briefly."
ADD = {"type": "function", "name": "add", "description": "Add two integers", "parameters": {
    "type": "object", "properties": {"a": {"type": "integer", "minimum": 0, "maximum": 9},
                                     "b": {"type": "integer", "minimum": 0, "maximum": 9}},
    "required": ["a", "b"], "additionalProperties": False}}
CHAT_ADD = {"type": "function", "function": {k: v for k, v in ADD.items() if k != "type"}}
SCHEMA = {"type": "object", "properties": {"answer": {"enum": ["four", "five"]}},
          "required": ["answer"], "additionalProperties": False}


@pytest.fixture(scope="module")
def server() -> Iterator[ServerProcess]:
    with ServerProcess(TINY_BUNDLE, "--backend", "llama.cpp", "--sessions", "1",
                       "--threads", "1") as served:
        yield served


@pytest.fixture(scope="module")
def client(server: ServerProcess) -> openai.OpenAI:
    return openai.OpenAI(base_url=server.url, api_key="unused", max_retries=0, timeout=120)


def chat_text(client: openai.OpenAI, messages: list[dict[str, Any]], **kwargs: Any) -> str:
    reply = client.chat.completions.create(model="tiny", messages=messages,  # type: ignore[arg-type]
                                           **kwargs)
    return reply.choices[0].message.content or ""


def test_plain_equals_chat_and_streaming_has_the_event_sequence(client: openai.OpenAI) -> None:
    reply = client.responses.create(model="tiny", input=QUESTION, instructions=SYSTEM,
                                    max_output_tokens=12)
    chat = chat_text(client, [{"role": "system", "content": SYSTEM},
                              {"role": "user", "content": QUESTION}], max_tokens=12)
    assert reply.output_text == chat and chat
    assert reply.object == "response" and reply.id.startswith("resp_")
    assert reply.usage is not None and reply.usage.output_tokens == 12
    assert reply.usage.total_tokens == reply.usage.input_tokens + 12
    assert reply.status == "incomplete"  # it stopped at max_output_tokens
    assert reply.incomplete_details is not None
    assert reply.incomplete_details.reason == "max_output_tokens"

    events = list(client.responses.create(model="tiny", input=QUESTION, instructions=SYSTEM,
                                          max_output_tokens=12, stream=True))
    kinds = [e.type for e in events]
    assert kinds[:4] == ["response.created", "response.in_progress",
                         "response.output_item.added", "response.content_part.added"]
    assert kinds[-4:] == ["response.output_text.done", "response.content_part.done",
                          "response.output_item.done", "response.incomplete"]
    assert set(kinds[4:-4]) == {"response.output_text.delta"}
    assert [e.sequence_number for e in events] == list(range(len(events)))
    deltas = "".join(e.delta for e in events if e.type == "response.output_text.delta")
    assert deltas == chat
    last = events[-1].response  # type: ignore[union-attr]
    assert last.output_text == chat and last.usage is not None


def test_a_tool_call_and_its_output_round_trip(client: openai.OpenAI) -> None:
    pytest.importorskip("llguidance")
    call_reply = client.responses.create(model="tiny", input=QUESTION, tools=[ADD],  # type: ignore[list-item]
                                         tool_choice="required", parallel_tool_calls=False,
                                         max_output_tokens=64)
    (call,) = call_reply.output
    assert call.type == "function_call" and call.name == "add"
    assert set(json.loads(call.arguments)) == {"a", "b"}
    # the same call streamed: the arguments events carry the same text
    events = list(client.responses.create(
        model="tiny", input=QUESTION, tools=[ADD], tool_choice="required",  # type: ignore[list-item]
        parallel_tool_calls=False, max_output_tokens=64, stream=True))
    args = [e for e in events if e.type.startswith("response.function_call_arguments")]
    assert [e.type for e in args] == ["response.function_call_arguments.delta",
                                      "response.function_call_arguments.done"]
    assert args[0].delta == call.arguments  # type: ignore[union-attr]
    assert args[1].arguments == call.arguments  # type: ignore[union-attr]

    result = client.responses.create(model="tiny", input=[
        {"role": "user", "content": QUESTION},
        {"type": "function_call", "call_id": call.call_id, "name": "add",
         "arguments": call.arguments},
        {"type": "function_call_output", "call_id": call.call_id, "output": "4"}],
        tools=[ADD], tool_choice="none", max_output_tokens=12)  # type: ignore[list-item]
    chat = chat_text(client, [
        {"role": "user", "content": QUESTION},
        {"role": "assistant", "content": None, "tool_calls": [
            {"id": call.call_id, "type": "function",
             "function": {"name": "add", "arguments": call.arguments}}]},
        {"role": "tool", "tool_call_id": call.call_id, "content": "4"}],
        tools=[CHAT_ADD], tool_choice="none", max_tokens=12)
    assert result.output_text == chat and chat


def test_json_schema_output_equals_chat_response_format(client: openai.OpenAI) -> None:
    pytest.importorskip("llguidance")
    reply = client.responses.create(model="tiny", input=QUESTION, max_output_tokens=32,
                                    text={"format": {"type": "json_schema", "name": "answer",
                                                     "schema": SCHEMA, "strict": True}})
    chat = chat_text(client, [{"role": "user", "content": QUESTION}], max_tokens=32,
                     response_format={"type": "json_schema", "json_schema": {
                         "name": "answer", "schema": SCHEMA}})
    assert reply.output_text == chat
    assert json.loads(reply.output_text)["answer"] in ("four", "five")


def test_previous_response_id_continues_the_stored_conversation(
        client: openai.OpenAI, server: ServerProcess) -> None:
    first = client.responses.create(model="tiny", input=QUESTION, instructions=SYSTEM,
                                    max_output_tokens=8)
    second = client.responses.create(model="tiny", input="And three plus three?",
                                     previous_response_id=first.id, max_output_tokens=8)
    chat = chat_text(client, [{"role": "user", "content": QUESTION},  # (no instructions:
                              {"role": "assistant", "content": first.output_text},  # not
                              {"role": "user", "content": "And three plus three?"}],  # inherited)
                     max_tokens=8)
    assert second.output_text == chat and chat
    assert second.previous_response_id == first.id
    assert client.responses.retrieve(first.id).output_text == first.output_text
    client.responses.delete(first.id)
    with pytest.raises(openai.NotFoundError):
        client.responses.retrieve(first.id)
    with pytest.raises(openai.BadRequestError) as info:
        client.responses.create(model="tiny", input="Go on.", previous_response_id=first.id,
                                max_output_tokens=4)
    assert info.value.code == "previous_response_not_found"
    unstored = client.responses.create(model="tiny", input=QUESTION, store=False,
                                       max_output_tokens=2)
    assert server.get(f"/v1/responses/{unstored.id}")[0] == 404


@pytest.mark.parametrize(("extra", "param"), [
    ({"tools": [{"type": "web_search"}]}, "tools.0.type"),
    ({"background": True}, "background"),
    ({"reasoning": {"effort": "high"}}, "reasoning"),
    ({"truncation": "auto"}, "truncation"),
    ({"input": [{"role": "user", "content": [{"type": "input_image", "image_url": "x"}]}]},
     "input.0.content.0"),
    ({"text": {"format": {"type": "xml"}}}, "text.format"),
    ({"frobnicate": 1}, "frobnicate"),
])
def test_unsupported_fields_get_a_400_naming_them(client: openai.OpenAI, extra: dict[str, Any],
                                                  param: str) -> None:
    body = {"input": QUESTION, "max_output_tokens": 4, **extra}
    with pytest.raises(openai.BadRequestError) as info:
        client.responses.create(model="tiny", extra_body=body)  # type: ignore[call-overload]
    assert info.value.param == param, info.value.message


def _response(rid: str, text: str) -> Response:
    return Response(id=rid, created_at=0, status="completed", model="m",
                    metadata={"pad": text})


def test_the_store_is_bounded_by_count_and_bytes_least_recently_used_first() -> None:
    store = ResponseStore(max_responses=2, max_bytes=10_000)
    store.put(_response("a", ""), [])
    store.put(_response("b", ""), [])
    assert store.get("a") is not None  # a is now the most recently used
    store.put(_response("c", ""), [])
    assert store.get("b") is None and store.get("a") is not None and len(store) == 2
    small = ResponseStore(max_responses=100, max_bytes=2_000)
    for rid in "defg":
        small.put(_response(rid, "x" * 600), [{"role": "user", "content": "hi"}])
    assert small.bytes <= 2_000 and small.get("g") is not None and small.get("d") is None
    small.put(_response("huge", "x" * 5_000), [])
    assert small.get("huge") is None  # larger than the whole store: not kept
    assert small.delete("g") and not small.delete("g")


def test_the_in_process_api_answers_as_the_server(client: openai.OpenAI) -> None:
    from eliza_backends import responses

    store = ResponseStore()
    local = responses(TINY_BUNDLE, QUESTION, instructions=SYSTEM, max_output_tokens=8,
                      backend="llama.cpp", config={"threads": 1}, response_store=store)
    served = client.responses.create(model="tiny", input=QUESTION, instructions=SYSTEM,
                                     max_output_tokens=8)
    assert isinstance(local, Response) and local.output_text == served.output_text
    events = list(responses(TINY_BUNDLE, "And three plus three?", stream=True,
                            previous_response_id=local.id, max_output_tokens=8,
                            backend="llama.cpp", config={"threads": 1},
                            response_store=store))
    again = client.responses.create(model="tiny", input="And three plus three?",
                                    previous_response_id=served.id, max_output_tokens=8)
    last = events[-1].model_dump()
    assert last["type"] == "response.incomplete"
    assert Response.model_validate(last["response"]).output_text == again.output_text
    assert len(store) == 2
