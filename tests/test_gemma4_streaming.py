"""Gemma 4 tool calls through the real generation path, on the tiny Gemma 4 bundle with Google's
Gemma 4 template.

* The corpus (tests/data/gemma4_tool_calls.jsonl): each case's text is what the model writes
  (a grammar in the stream's config forces that exact text, token by token through the real
  session and its tokenizer's pieces), and the reply is read as it streams: the core's steps,
  ``chat_completion`` streamed and not, ``/v1/responses`` and ``/v1/messages`` streamed and not
  all give the corpus' content and calls.
* ``tool_choice`` ``"required"`` or a named tool constrain the reply to Gemma 4's own call
  syntax: a well-formed call (the strict parser reads it, no repair) to the tool asked for,
  with arguments valid against its schema, on llama.cpp and on MLX (the same text on both).
"""

from __future__ import annotations

import itertools
import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from test_gemma4_repair import CORPUS, _expected, _named

from eliza_backends import open_stream
from eliza_backends.openai.gemma4_calls import parse_gemma4_reply
from eliza_backends.openai.generation import Generation
from eliza_backends.openai.local import chat_completion
from eliza_backends.openai.local_fronts import messages, responses
from eliza_backends.openai.tools import parse_tools
from eliza_backends.stream import Stream

pytest.importorskip("llguidance")

ROOT = Path(__file__).resolve().parent.parent
TEMPLATE = (ROOT / "tests" / "fixtures" / "templates" /
            "google-gemma-4-31B-it.jinja").read_text(encoding="utf-8")
BUNDLE = ROOT / "examples" / "bundles" / "gemma4-tiny"
ASK = [{"role": "user", "content": "Go ahead."}]


def _openai_tools(tools: dict[str, Any]) -> list[dict[str, Any]]:
    return [{"type": "function", "function": {"name": n, "parameters": p}}
            for n, p in tools.items()]


def _forced(text: str, backend: str = "llama.cpp") -> Stream:
    """A stream whose model writes ``text`` exactly (a grammar of that one string)."""
    return open_stream(BUNDLE, backend=backend, chat_template=TEMPLATE, temperature=0.0,
                       threads=1, context_size=1024,
                       grammar="start: " + json.dumps(text, ensure_ascii=False))


def _core(stream: Stream, case: dict[str, Any]) -> tuple[str | None, list[tuple[str, Any]]]:
    """The core's steps: content deltas and each step's finished calls, as they come."""
    gen = Generation(stream, ASK, tools=parse_tools(_openai_tools(case["tools"])),
                     tool_choice="auto", max_tokens=len(case["text"].encode()) + 8)
    gen.start()
    deltas: list[str] = []
    calls: list[dict[str, Any]] = []
    steps_with_calls = 0
    while not gen.done:
        deltas.append(gen.step())
        calls += gen.step_tool_calls
        steps_with_calls += bool(gen.step_tool_calls)
    assert gen.text == case["text"]  # the forced text, token by token
    assert calls == gen.tool_calls
    content = "".join(deltas)
    assert (content or None if calls else content) == gen.content
    if len(calls) > 1 and case["text"].count("<tool_call|>") >= len(calls):
        assert steps_with_calls > 1  # closed calls go out as they finish, not all at the end
    return gen.content, _named(calls)


def _chat(stream: Stream, case: dict[str, Any]) -> Iterator[tuple[str | None, Any]]:
    """chat_completion whole, then streamed."""
    budget = len(case["text"].encode()) + 8
    reply = chat_completion(stream, ASK, tools=_openai_tools(case["tools"]), tool_choice="auto",
                            max_tokens=budget)
    message = reply.choices[0].message
    yield message.content, [(c.function.name, json.loads(c.function.arguments))
                            for c in message.tool_calls or []]
    chunks = list(chat_completion(stream, ASK, tools=_openai_tools(case["tools"]),
                                  tool_choice="auto", max_tokens=budget, stream=True))
    deltas = [c.choices[0].delta for c in chunks if c.choices]
    calls = [call for d in deltas for call in d.tool_calls or []]
    assert [c.index for c in calls] == list(range(len(calls)))
    text = "".join(d.content or "" for d in deltas)
    yield (text or None) if calls else text, [(c.function.name, json.loads(c.function.arguments))
                                              for c in calls]


def _responses(stream: Stream, case: dict[str, Any]) -> Iterator[tuple[str | None, Any]]:
    tools = [{"type": "function", "name": n, "parameters": p} for n, p in case["tools"].items()]
    budget = len(case["text"].encode()) + 8
    whole = responses(stream, "Go ahead.", tools=tools, max_output_tokens=budget, store=False)
    texts = [p.text for item in whole.output if item.type == "message" for p in item.content]
    calls = [(i.name, json.loads(i.arguments)) for i in whole.output
             if i.type == "function_call"]
    yield ("".join(texts) if texts else None) if calls else "".join(texts), calls
    events = list(responses(stream, "Go ahead.", tools=tools, max_output_tokens=budget,
                            store=False, stream=True))
    text = "".join(e.delta for e in events if e.type == "response.output_text.delta")
    calls = [(e.name, json.loads(e.arguments)) for e in events
             if e.type == "response.function_call_arguments.done"]
    yield (text or None) if calls else text, calls


def _messages(stream: Stream, case: dict[str, Any]) -> Iterator[tuple[str | None, Any]]:
    tools = [{"name": n, "input_schema": p} for n, p in case["tools"].items()]
    budget = len(case["text"].encode()) + 8
    whole = messages(stream, ASK, max_tokens=budget, tools=tools)
    text = "".join(b.text for b in whole.content if b.type == "text")
    calls = [(b.name, b.input) for b in whole.content if b.type == "tool_use"]
    yield (text or None) if calls else text, calls
    events = list(messages(stream, ASK, max_tokens=budget, tools=tools, stream=True))
    text = "".join(e.delta["text"] for e in events if e.type == "content_block_delta"
                   and e.delta["type"] == "text_delta")
    calls = [(e.content_block["name"], json.loads(d.delta["partial_json"]))
             for e, d in itertools.pairwise(events)
             if e.type == "content_block_start" and e.content_block["type"] == "tool_use"]
    yield (text or None) if calls else text, calls


@pytest.mark.parametrize("case", CORPUS, ids=[c["id"] for c in CORPUS])
def test_corpus_through_the_real_streaming_path(case: dict[str, Any]) -> None:
    """Every API, streamed and whole, gives the corpus' content and calls."""
    want = _expected(case)
    with _forced(case["text"]) as stream:
        assert _core(stream, case) == want
        for got in (*_chat(stream, case), *_responses(stream, case), *_messages(stream, case)):
            assert got == want


# --------------------------------------------------------------------------- the grammar

WEATHER = {"type": "object", "required": ["city"], "properties": {
    "city": {"type": "string", "minLength": 1, "maxLength": 16},
    "unit": {"enum": ["celsius", "fahrenheit"]},
    "days": {"type": "integer"}}}
CONFIG = {"type": "object", "properties": {
    "theme": {"type": "string", "maxLength": 8}, "sizes": {"type": "array",
                                                          "items": {"type": "number"}},
    "on": {"type": "boolean"}}}
TOOLS = [{"type": "function", "function": {"name": "get_weather", "parameters": WEATHER}},
         {"type": "function", "function": {"name": "set_config", "parameters": CONFIG}}]
SCHEMAS = {"get_weather": WEATHER, "set_config": CONFIG}
CHOICES: list[Any] = ["required", {"type": "function", "function": {"name": "get_weather"}},
                      {"type": "function", "function": {"name": "set_config"}}]


def _constrained(backend: str, choice: Any) -> str:
    """The text the tiny model writes under the Gemma 4 call grammar; checked to be one
    well-formed call to an allowed tool with schema-valid arguments."""
    import jsonschema

    with open_stream(BUNDLE, backend=backend, chat_template=TEMPLATE, temperature=0.0,
                     threads=1, context_size=1024) as stream:
        gen = Generation(stream, ASK, tools=parse_tools(TOOLS), tool_choice=choice,
                         parallel_tool_calls=False, max_tokens=200)
        gen.start()
        while not gen.done:
            gen.step()
        assert gen.native_calls and gen.finish_reason == "tool_calls", gen.text
        content, strict = parse_gemma4_reply(gen.text, set(SCHEMAS))  # no repair needed
        assert content is None and len(strict) == 1, gen.text
        name, args = _named(strict)[0]
        assert _named(gen.tool_calls) == [(name, args)]
        if isinstance(choice, dict):
            assert name == choice["function"]["name"]
        jsonschema.validate(args, SCHEMAS[name])
        assert gen.text.startswith(f"<|tool_call>call:{name}{{") and \
            gen.text.endswith("}<tool_call|>")
        reply = chat_completion(stream, ASK, tools=TOOLS, tool_choice=choice,
                                parallel_tool_calls=False, max_tokens=200)
        call = reply.choices[0].message.tool_calls
        assert reply.choices[0].finish_reason == "tool_calls" and call is not None
        assert [(c.function.name, json.loads(c.function.arguments)) for c in call] == \
            [(name, args)]
        return gen.text


@pytest.mark.parametrize("choice", CHOICES, ids=["required", "get_weather", "set_config"])
def test_required_and_named_tool_choice_write_gemma4_syntax(choice: Any) -> None:
    _constrained("llama.cpp", choice)


@pytest.mark.parametrize("choice", CHOICES, ids=["required", "get_weather", "set_config"])
def test_mlx_writes_the_same_constrained_call(choice: Any) -> None:
    """MLX applies the same grammar over the same vocabulary (Gemma 4's markers are text on
    both) and, with identical weights, writes the same call."""
    pytest.importorskip("mlx.core")
    pytest.importorskip("mlx_lm")
    assert _constrained("mlx", choice) == _constrained("llama.cpp", choice)
