"""Gemma 4 tool calls: Google's real Gemma 4 template (tests/fixtures/templates, from llama.cpp's
``models/templates``) renders ``tools``, assistant ``tool_calls`` and ``tool`` results in the
project's sandbox exactly as the template itself does outside it; Gemma 4's call syntax is parsed
into OpenAI ``tool_calls`` the way llama.cpp's Gemma 4 parser reads it (cases from its
``tests/test-chat.cpp``); the prompts equal what llama.cpp's own template engine renders
(tests/fixtures/templates/gemma4-llama-server.json); and the tiny Gemma 4 bundle, given the real
template, streams a tool request end to end on llama.cpp (its text is noise: the prompt and the
parse path are asserted).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from eliza_backends import open_stream, render_chat
from eliza_backends.openai.gemma4_calls import is_gemma4_template, parse_gemma4_reply
from eliza_backends.openai.generation import Generation
from eliza_backends.openai.local import chat_completion
from eliza_backends.openai.tools import parse_reply, parse_tools, prepare_messages

ROOT = Path(__file__).resolve().parent.parent
TEMPLATE = (ROOT / "tests" / "fixtures" / "templates" /
            "google-gemma-4-31B-it.jinja").read_text(encoding="utf-8")
BUNDLE = ROOT / "examples" / "bundles" / "gemma4-tiny"
Q = '<|"|>'

#: conversations and the prompts llama.cpp's template engine rendered for them
#: (tools/gemma4_template_reference.py)
LLAMA_SERVER = json.loads((ROOT / "tests" / "fixtures" / "templates" /
                           "gemma4-llama-server.json").read_text(encoding="utf-8"))
CASES = {c["name"]: c for c in LLAMA_SERVER["cases"]}
TOOLS: list[dict[str, Any]] = LLAMA_SERVER["tools"]
WEATHER = TOOLS[0]
#: system, user, an assistant turn calling get_weather and set_config (nested arguments), and
#: both results
CONVERSATION: list[dict[str, Any]] = CASES["calls_and_results"]["messages"]
NESTED = json.loads(CONVERSATION[2]["tool_calls"][1]["function"]["arguments"])


def _plain_jinja(template: str, messages: list[dict[str, Any]], **extra: Any) -> str:
    """The template rendered by jinja2 itself, as Hugging Face's ``apply_chat_template`` sets
    it up (no bounds): the reference the sandbox must agree with."""
    from jinja2.sandbox import ImmutableSandboxedEnvironment

    env = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True,
                                        extensions=["jinja2.ext.loopcontrols"])
    return env.from_string(template).render(messages=messages, **extra)


def _prepared() -> tuple[list[dict[str, Any]], dict[str, Any]]:
    return prepare_messages(CONVERSATION, parse_tools(TOOLS), "auto", TEMPLATE)


# --------------------------------------------------------------------------- rendering


def test_fixture_is_the_gemma4_template() -> None:
    assert is_gemma4_template(TEMPLATE)
    assert not is_gemma4_template((BUNDLE / "source" / "assistant" / "chat_template.jinja")
                                  .read_text(encoding="utf-8"))


def test_tools_calls_and_results_render_exactly() -> None:
    """The prompt the sandbox renders, spelled out from Gemma 4's format: declarations in the
    system turn, both calls in the model turn with their arguments in Gemma's notation (keys
    sorted, strings in <|"|>), each result as a tool response, and no new model turn after a
    tool response (the model continues its own turn)."""
    msgs, extra = _prepared()
    got = render_chat(TEMPLATE, msgs, bos_token="<bos>", **extra)
    weather_decl = (f"declaration:get_weather{{description:{Q}Weather for a city{Q},parameters:"
                    f"{{properties:{{city:{{description:{Q}City name{Q},type:{Q}STRING{Q}}},"
                    f"days:{{type:{Q}INTEGER{Q}}}}},required:[{Q}city{Q}],type:{Q}OBJECT{Q}}}}}")
    config_decl = (f"declaration:set_config{{description:{Q}Set options{Q},parameters:"
                   f"{{properties:{{config:{{properties:{{}},type:{Q}OBJECT{Q}}}}},type:{Q}OBJECT{Q}}}}}")
    want = (
        "<bos><|turn>system\nBe brief."
        f"<|tool>{weather_decl}<tool|><|tool>{config_decl}<tool|><turn|>\n"
        "<|turn>user\nWeather in Paris, and set dark mode?<turn|>\n"
        "<|turn>model\n"
        f"<|tool_call>call:get_weather{{city:{Q}Paris{Q},days:2}}<tool_call|>"
        f"<|tool_call>call:set_config{{config:{{on:true,sizes:[1,2.5,-3],"
        f"tags:[{Q}a b{Q},{Q}c{Q}],theme:{Q}dark{Q}}}}}<tool_call|>"
        f"<|tool_response>response:get_weather{{value:{Q}sunny{Q}}}<tool_response|>"
        f"<|tool_response>response:set_config{{value:{Q}ok{Q}}}<tool_response|>")
    assert got == want
    # and exactly what jinja2 renders with the template outside the sandbox
    assert got == _plain_jinja(TEMPLATE, msgs, bos_token="<bos>", add_generation_prompt=True,
                               **extra)


def test_final_answer_after_results_closes_the_model_turn() -> None:
    msgs, extra = prepare_messages(
        [*CONVERSATION, {"role": "assistant", "content": "Sunny; dark mode on."},
         {"role": "user", "content": "Thanks"}], parse_tools(TOOLS), "auto", TEMPLATE)
    got = render_chat(TEMPLATE, msgs, **extra)
    assert got.endswith(f"response:set_config{{value:{Q}ok{Q}}}<tool_response|>"
                        "Sunny; dark mode on.<turn|>\n<|turn>user\nThanks<turn|>\n"
                        "<|turn>model\n<|channel>thought\n<channel|>")
    assert got == _plain_jinja(TEMPLATE, msgs, add_generation_prompt=True, bos_token="",
                               **extra)


@pytest.mark.parametrize("case", LLAMA_SERVER["cases"], ids=[c["name"] for c in
                                                             LLAMA_SERVER["cases"]])
def test_prompt_is_what_llama_cpp_renders(case: dict[str, Any]) -> None:
    """The sandbox's prompt for each conversation equals the one llama.cpp's own template
    engine rendered (tools/gemma4_template_reference.py: llama-server ``/apply-template``,
    thinking on, BOS left to the tokenizer). One known difference, a template quirk: a ``null``
    argument is written ``{{ none }}``, which jinja2 (and Hugging Face) print as ``None`` and
    llama.cpp's engine as nothing."""
    tools = parse_tools(LLAMA_SERVER["tools"])
    msgs, extra = prepare_messages(case["messages"], tools, "auto", TEMPLATE)
    got = render_chat(TEMPLATE, msgs, enable_thinking=True, **extra)
    want = case["prompt"]
    if case["name"] == "null_float_json_result":
        assert "{config:{b:false,f:15000000000.0,x:}}" in want
        want = want.replace("x:}}", "x:None}}")
    assert got == want


def test_the_templates_own_calls_parse_back() -> None:
    """What the template writes for the assistant's calls is read back by the parser into the
    same names and arguments (nested values included)."""
    msgs, extra = _prepared()
    text = render_chat(TEMPLATE, msgs[:3], add_generation_prompt=False, **extra)
    model_turn = text.split("<|turn>model\n", 1)[1]
    content, calls = parse_gemma4_reply(model_turn, {"get_weather", "set_config"})
    assert content is None
    assert [(c["function"]["name"], json.loads(c["function"]["arguments"])) for c in calls] == \
        [("get_weather", {"city": "Paris", "days": 2}), ("set_config", NESTED)]


# --------------------------------------------------------------------------- parsing

# (generated text, expected content, expected [(name, arguments)]): llama.cpp's test-chat.cpp
PARSED: list[tuple[str, str | None, list[tuple[str, Any]]]] = [
    (f"<|tool_call>call:get_time{{city:{Q}London{Q}}}<tool_call|>", None,
     [("get_time", {"city": "London"})]),
    ("<|tool_call>call:empty_args{}<tool_call|>", None, [("empty_args", {})]),
    (f"Hello, world!\nWhat's up?<|tool_call>call:get_time{{city:{Q}Paris{Q}}}<tool_call|>",
     "Hello, world!\nWhat's up?", [("get_time", {"city": "Paris"})]),
    (f"<|channel>thought\nI'm\nthinking<channel|><|tool_call>call:get_time{{city:{Q}Paris{Q}}}"
     "<tool_call|>", None, [("get_time", {"city": "Paris"})]),
    (f"<|tool_call>call:get_time{{city:{Q}London{Q}}}<tool_call|>"
     f"<|tool_call>call:get_weather{{city:{Q}Paris{Q}}}<tool_call|>", None,
     [("get_time", {"city": "London"}), ("get_weather", {"city": "Paris"})]),
    ("<|tool_call>call:special_function{arg1:-7}<tool_call|>", None,
     [("special_function", {"arg1": -7})]),
    ("<|tool_call>call:amount{orig:1.5e10}<tool_call|><|tool_response>", None,
     [("amount", {"orig": 1.5e10})]),
    ("<|tool_call>call:toggle{enabled:false}<tool_call|>", None, [("toggle", {"enabled": False})]),
    ("<|tool_call>call:set_nullable{value:null}<tool_call|>", None,
     [("set_nullable", {"value": None})]),
    (f"<|tool_call>call:todo_list{{todos:[{Q}buy milk{Q},{Q}walk dog{Q}]}}<tool_call|>", None,
     [("todo_list", {"todos": ["buy milk", "walk dog"]})]),
    (f"<|tool_call>call:set_config{{config:{{theme:{Q}dark{Q},count:3,deep:{{x:[{{y:[]}}]}}}}}}"
     "<tool_call|>", None,
     [("set_config", {"config": {"theme": "dark", "count": 3, "deep": {"x": [{"y": []}]}}})]),
    (f"<|tool_call>call:say{{text:{Q}a \"quoted\" {{brace}}: [x], y{Q}}}<tool_call|>", None,
     [("say", {"text": 'a "quoted" {brace}: [x], y'})]),
]


@pytest.mark.parametrize(("text", "content", "calls"), PARSED)
def test_parse_gemma4_calls(text: str, content: str | None,
                            calls: list[tuple[str, Any]]) -> None:
    got_content, got = parse_gemma4_reply(text)
    assert got_content == content
    assert [(c["function"]["name"], json.loads(c["function"]["arguments"])) for c in got] == \
        calls
    assert all(c["type"] == "function" and c["id"].startswith("call_") for c in got)


MALFORMED = [
    f"<|tool_call>call:get_time{{city:{Q}London}}<tool_call|>",  # unterminated string
    f"<|tool_call>call:get_time{{city:{Q}London{Q}}}",  # cut short by max_tokens
    "<|tool_call>call:get_time{city:London}<tool_call|>",  # bare word is no value
    "<|tool_call>call:{a:1}<tool_call|>",  # no name
    f"<|tool_call>call:get_time{{city:{Q}x{Q}}}<tool_call|> and then more text",
    "<|tool_call>call:f{a:" + "[" * 100 + "]" * 100 + "}<tool_call|>",  # nested too deep
]


@pytest.mark.parametrize("text", MALFORMED)
def test_malformed_calls_come_back_as_content(text: str) -> None:
    """The strict parser's rule for a reply that is not a well-formed call: the whole text is
    content and there are no calls (as for JSON replies cut short). Replies are read by the
    tolerant reader (test_gemma4_repair.py), which recovers the calls a person would recognise
    among these and keeps the rest as content."""
    assert parse_gemma4_reply(text) == (text, [])


def test_plain_answer_and_unknown_tool() -> None:
    assert parse_gemma4_reply("<|channel>thought\n<channel|>Hello!") == ("Hello!", [])
    call = f"<|tool_call>call:rm_rf{{path:{Q}/{Q}}}<tool_call|>"
    assert parse_gemma4_reply(call, {"get_weather"}) == (call, [])
    tools = parse_tools([WEATHER])
    content, calls = parse_reply(f"<|tool_call>call:get_weather{{city:{Q}Oslo{Q}}}<tool_call|>",
                                 native=tools)
    assert content is None and json.loads(calls[0]["function"]["arguments"]) == {"city": "Oslo"}


# --------------------------------------------------------------------------- end to end


def test_tiny_gemma4_streams_a_tool_request_through_the_real_template() -> None:
    """The tiny Gemma 4 bundle with the real template (StreamConfig.chat_template): the prompt
    is the rendered conversation with tools (Gemma's control tokens as single special tokens),
    the reply is unconstrained and read by the Gemma 4 parser; the same through
    ``chat_completion``."""
    tools = parse_tools(TOOLS)
    messages = CONVERSATION[:2]
    with open_stream(BUNDLE, backend="llama.cpp", chat_template=TEMPLATE, temperature=0.0,
                     threads=1, context_size=1024) as stream:
        msgs, extra = prepare_messages(messages, tools, "auto", TEMPLATE)
        text = render_chat(TEMPLATE, msgs, bos_token="<bos>", **extra)
        assert text.count("<|tool>") == 2 and text.endswith("<|turn>model\n<|channel>thought"
                                                            "\n<channel|>")
        gen = Generation(stream, messages, tools=tools, tool_choice="auto", max_tokens=24)
        gen.start()
        assert gen.native_calls and gen.holds_reply
        ids = stream.chat_tokens(msgs, tools=extra["tools"])
        session = stream.session
        assert gen.prompt_tokens == len(ids) and ids == session.tokenize(text, add_special=False)
        for marker in ("<|tool>", "<tool|>", "<|turn>", '<|"|>'):
            assert len(session.tokenize(marker, add_special=False)) == 1, marker
        while not gen.done:
            gen.step()
        assert gen.completion_tokens > 0
        assert (gen.content, [c["function"] for c in gen.tool_calls]) == \
            (lambda r: (r[0], [c["function"] for c in r[1]]))(
                parse_gemma4_reply(gen.text, {"get_weather", "set_config"}))
        assert gen.finish_reason == ("tool_calls" if gen.tool_calls else gen.finish_reason)
        reply = chat_completion(stream, messages, tools=TOOLS, tool_choice="auto",
                                max_tokens=24, temperature=0.0)
        message = reply.choices[0].message
        assert message.content == gen.content
        assert [c.function.model_dump() for c in message.tool_calls or []] == \
            [c["function"] for c in gen.tool_calls]
        chunks = list(chat_completion(stream, messages, tools=TOOLS, tool_choice="auto",
                                      max_tokens=24, temperature=0.0, stream=True))
        deltas = [c.choices[0].delta for c in chunks if c.choices]
        assert "".join(d.content or "" for d in deltas) == (gen.content or "")
        assert [c.function.model_dump() for d in deltas for c in d.tool_calls or []] == \
            [c["function"] for c in gen.tool_calls]
