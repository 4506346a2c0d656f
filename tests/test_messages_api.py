"""``POST /v1/messages`` (Anthropic's Messages API) driven by the official ``anthropic`` SDK (2.x)
against the real server on the tiny bundle (llama.cpp): plain, streamed, a tools round trip
(``tool_use`` then ``tool_result``), stop sequences, ``count_tokens``; each answer the same text
as ``/v1/chat/completions`` gives for the same conversation (greedy); errors in Anthropic's
shape, refused fields named."""

from __future__ import annotations

import importlib.util
import json
from collections.abc import Iterator
from typing import Any

import httpx
import openai
import pytest
from conftest import TINY_BUNDLE
from server_process import ServerProcess

anthropic = pytest.importorskip("anthropic")
pytestmark = pytest.mark.skipif(importlib.util.find_spec("llama_cpp") is None,
                                reason="llama_cpp is not installed")

QUESTION = "What is two plus two?"
SYSTEM = "Answer briefly."
SCHEMA = {"type": "object", "properties": {"a": {"type": "integer", "minimum": 0, "maximum": 9},
                                           "b": {"type": "integer", "minimum": 0, "maximum": 9}},
          "required": ["a", "b"], "additionalProperties": False}
ADD = {"name": "add", "description": "Add two integers", "input_schema": SCHEMA}
CHAT_ADD = {"type": "function", "function": {"name": "add", "description": "Add two integers",
                                             "parameters": SCHEMA}}


@pytest.fixture(scope="module")
def server() -> Iterator[ServerProcess]:
    with ServerProcess(TINY_BUNDLE, "--backend", "llama.cpp", "--sessions", "1",
                       "--threads", "1") as served:
        yield served


@pytest.fixture(scope="module")
def client(server: ServerProcess) -> Any:
    return anthropic.Anthropic(base_url=server.root, api_key="unused", max_retries=0,
                               timeout=120)


def chat_text(server: ServerProcess, messages: list[dict[str, Any]], **kwargs: Any) -> str:
    chat = openai.OpenAI(base_url=server.url, api_key="unused", max_retries=0, timeout=120)
    reply = chat.chat.completions.create(model="tiny", messages=messages,  # type: ignore[arg-type]
                                         **kwargs)
    return reply.choices[0].message.content or ""


def test_plain_and_streamed_equal_chat(client: Any, server: ServerProcess) -> None:
    message = client.messages.create(model="tiny", max_tokens=12, system=SYSTEM,
                                     messages=[{"role": "user", "content": QUESTION}])
    chat = chat_text(server, [{"role": "system", "content": SYSTEM},
                              {"role": "user", "content": QUESTION}], max_tokens=12)
    (block,) = message.content
    assert block.type == "text" and block.text == chat and chat
    assert message.stop_reason == "max_tokens" and message.usage.output_tokens == 12
    assert message.id.startswith("msg_") and message.role == "assistant"

    with client.messages.stream(model="tiny", max_tokens=12, system=SYSTEM,
                                messages=[{"role": "user", "content": QUESTION}]) as stream:
        raw = [event.type for event in stream if event.type != "text"]  # (the SDK's own)
        final = stream.get_final_message()
    assert raw[:2] == ["message_start", "content_block_start"]
    assert raw[-3:] == ["content_block_stop", "message_delta", "message_stop"]
    assert set(raw[2:-3]) == {"content_block_delta"}
    assert final.content[0].text == chat and final.stop_reason == "max_tokens"
    # the usage, Anthropic's way: prefilled input plus cache reads is the whole prompt
    count = client.messages.count_tokens(model="tiny", system=SYSTEM,
                                         messages=[{"role": "user", "content": QUESTION}])
    assert count.input_tokens == final.usage.input_tokens + final.usage.cache_read_input_tokens
    assert count.input_tokens == message.usage.input_tokens + \
        message.usage.cache_read_input_tokens


def test_a_tool_use_and_its_result_round_trip(client: Any, server: ServerProcess) -> None:
    pytest.importorskip("llguidance")
    question = [{"role": "user", "content": QUESTION}]
    message = client.messages.create(model="tiny", max_tokens=64, messages=question,
                                     tools=[ADD], tool_choice={
                                         "type": "any", "disable_parallel_tool_use": True})
    (use,) = message.content
    assert use.type == "tool_use" and use.name == "add" and set(use.input) == {"a", "b"}
    assert message.stop_reason == "tool_use"
    with client.messages.stream(model="tiny", max_tokens=64, messages=question, tools=[ADD],
                                tool_choice={"type": "tool", "name": "add",
                                             "disable_parallel_tool_use": True}) as stream:
        deltas = [e.delta.partial_json for e in stream if e.type == "content_block_delta"]
        streamed = stream.get_final_message()
    assert [json.loads(d) for d in deltas] == [use.input]
    assert streamed.content[0].input == use.input and streamed.stop_reason == "tool_use"

    result = client.messages.create(model="tiny", max_tokens=12, tools=[ADD],
                                    tool_choice={"type": "none"}, messages=[
        *question,
        {"role": "assistant", "content": [{"type": "tool_use", "id": use.id, "name": "add",
                                           "input": use.input}]},
        {"role": "user", "content": [{"type": "tool_result", "tool_use_id": use.id,
                                      "content": "4"}]}])
    chat = chat_text(server, [
        *question,
        {"role": "assistant", "content": None, "tool_calls": [
            {"id": use.id, "type": "function",
             "function": {"name": "add", "arguments": json.dumps(use.input)}}]},
        {"role": "tool", "tool_call_id": use.id, "content": "4"}],
        tools=[CHAT_ADD], tool_choice="none", max_tokens=12)
    assert result.content[0].text == chat and chat


def test_a_stop_sequence_ends_the_text_and_is_named(client: Any, server: ServerProcess) -> None:
    full = client.messages.create(model="tiny", max_tokens=12,
                                  messages=[{"role": "user", "content": QUESTION}])
    word = full.content[0].text.split()[2]  # "Two plus two is ...": stop at the third word
    cut = client.messages.create(model="tiny", max_tokens=12, stop_sequences=[word],
                                 messages=[{"role": "user", "content": QUESTION}])
    assert cut.stop_reason == "stop_sequence" and cut.stop_sequence == word
    assert cut.content[0].text == full.content[0].text.split(word)[0]


@pytest.mark.parametrize(("body", "needle"), [
    ({"messages": [{"role": "user", "content": "hi"}]}, "max_tokens is required"),
    ({"max_tokens": 4, "messages": [{"role": "user", "content": [
        {"type": "image", "source": {"type": "base64", "media_type": "image/png",
                                     "data": "AA=="}}]}]}, "messages.0.content.0"),
    ({"max_tokens": 4, "messages": [{"role": "user", "content": "hi"}],
      "tools": [{"type": "web_search_20250305", "name": "web_search"}]}, "tools.0"),
    ({"max_tokens": 4, "messages": [{"role": "user", "content": "hi"}],
      "thinking": {"type": "enabled", "budget_tokens": 1024}}, "thinking"),
    ({"max_tokens": 4, "messages": [{"role": "user", "content": "hi"}], "frobnicate": 1},
     "frobnicate"),
    ({"max_tokens": 4, "messages": []}, "messages"),
    ({"max_tokens": 4, "messages": [{"role": "user", "content": "hi"},
                                    {"role": "assistant", "content": "Hel"}]}, "prefilling"),
    ({"max_tokens": 4, "messages": [{"role": "user", "content": "hi"}],
      "stop_sequences": ["a", "b", "c", "d", "e"]}, "stop_sequences"),
])
def test_errors_have_anthropics_shape(server: ServerProcess, body: dict[str, Any],
                                      needle: str) -> None:
    reply = httpx.post(server.root + "/v1/messages", json={"model": "tiny", **body}, timeout=60)
    assert reply.status_code == 400
    data = reply.json()
    assert data["type"] == "error" and data["error"]["type"] == "invalid_request_error"
    assert needle in data["error"]["message"]


def test_the_sdk_raises_its_typed_errors(client: Any) -> None:
    with pytest.raises(anthropic.NotFoundError) as info:
        client.messages.create(model="not-this-one", max_tokens=4,
                               messages=[{"role": "user", "content": "hi"}])
    assert info.value.body["error"]["type"] == "not_found_error"
    with pytest.raises(anthropic.BadRequestError):
        client.messages.create(model="tiny", max_tokens=4, extra_body={"temperature": 1.5},
                               messages=[{"role": "user", "content": "hi"}])


def test_the_in_process_api_answers_as_the_server(client: Any) -> None:
    from eliza_backends import messages
    from eliza_backends.openai.anthropic_types import Message

    question = [{"role": "user", "content": QUESTION}]
    local = messages(TINY_BUNDLE, question, max_tokens=8, system=SYSTEM,
                     backend="llama.cpp", config={"threads": 1})
    served = client.messages.create(model="tiny", max_tokens=8, system=SYSTEM,
                                    messages=question)
    assert isinstance(local, Message)
    assert local.content[0].text == served.content[0].text  # type: ignore[union-attr]
    events = [e.model_dump() for e in messages(TINY_BUNDLE, question, max_tokens=8,
                                               system=SYSTEM, stream=True,
                                               backend="llama.cpp", config={"threads": 1})]
    assert events[0]["type"] == "message_start" and events[-1]["type"] == "message_stop"
    text = "".join(e["delta"]["text"] for e in events if e["type"] == "content_block_delta")
    assert text == served.content[0].text
