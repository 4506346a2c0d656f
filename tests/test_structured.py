"""Structured output on the tiny bundle through every backend with logits: each constraint of
:mod:`structured_cases` gives text that satisfies it (jsonschema for the JSON schemas) and the
same bytes on llama.cpp, MLX and LiteRT (interpreter and compiled); logprobs agree across them;
the engine session refuses; the OpenAI-shaped API serves response_format, logprobs and tools.

The tiny bundle's GGUF is f16 and its MLX and LiteRT artifacts f32, so logprobs agree to what
f16 weights allow here (measured max difference 0.03 nats); the 1e-3 agreement on identical f32
weights is checked on the real models (tests/test_structured_real.py). The prompt matters on a
model this small: constrained text is mostly text the model finds unlikely, and after "Once upon
a time" two of the sixteen cases reach near-ties between allowed tokens (a 0.002-nat gap,
within what f16 weights move) and part ways; after this prompt every case agrees."""

from __future__ import annotations

import importlib.util
import json
from typing import Any

import pytest
from conftest import TINY_BUNDLE
from structured_cases import cases, check

from eliza_backends import (
    InferenceContext,
    StreamConfig,
    UnsupportedOperationError,
    chat_completion,
    completion,
    open_stream,
)
from eliza_backends.structured.constraint import Constraint
from eliza_backends.structured.logits import OutputSpec

pytest.importorskip("llguidance")

BACKENDS: list[tuple[str, str, dict[str, Any]]] = [
    ("llama.cpp", "llama_cpp", {}),
    ("mlx", "mlx_lm", {}),
    ("litert-lm", "ai_edge_litert", {"litert-lm": {"session": "interpreter"}}),
    ("litert-lm", "ai_edge_litert", {"litert-lm": {"runtime": "compiled"}}),
]
CASES = cases()
PROMPT = "We the People of the United States"


def _installed() -> list[tuple[str, dict[str, Any]]]:
    return [(b, o) for b, m, o in BACKENDS if importlib.util.find_spec(m)]


@pytest.fixture(scope="module")
def outputs() -> dict[str, dict[str, tuple[str, str | None, list[int]]]]:
    """case -> backend label -> (text, finish reason, tokens), every case on every backend
    (one context per backend, one session per case)."""
    out: dict[str, dict[str, tuple[str, str | None, list[int]]]] = {c: {} for c in CASES}
    for backend, options in _installed():
        label = backend + "/" + "/".join(str(v) for o in options.values() for v in o.values())
        with InferenceContext(TINY_BUNDLE) as ctx:
            for case, constraint in CASES.items():
                with open_stream(ctx, backend=backend, options=options, threads=1,
                                 max_tokens=160, context_size=256, batch_size=32) as stream:
                    stream.session.set_output(OutputSpec(constraint))
                    stream.prefill(PROMPT)
                    steps = list(stream)
                out[case][label] = ("".join(s.text for s in steps), steps[-1].finish_reason,
                                    [t for s in steps for t in s.tokens])
    return out


@pytest.mark.parametrize("case", sorted(CASES))
def test_constrained_output_is_valid_and_identical_everywhere(
        case: str, outputs: dict[str, dict[str, tuple[str, str | None, list[int]]]]) -> None:
    got = outputs[case]
    assert len(got) >= 2, f"needs two backends with logits, got {sorted(got)}"
    texts = {label: text for label, (text, _, _) in got.items()}
    assert len(set(texts.values())) == 1, texts
    assert len({tuple(ids) for _, _, ids in got.values()}) == 1
    text, reason, _ = next(iter(got.values()))
    assert reason == "eos", f"{case}: the constraint should end the text ({reason}): {text!r}"
    check(case, text)


def test_logprobs_agree_across_backends() -> None:
    rows: dict[str, list[tuple[int, float, tuple[tuple[int, float], ...]]]] = {}
    for backend, options in _installed():
        with open_stream(TINY_BUNDLE, backend=backend, options=options, threads=1,
                         max_tokens=24, ignore_eos=True, top_logprobs=5) as stream:
            stream.prefill(PROMPT)
            rows[backend + str(options)] = [
                (e.token, e.logprob, tuple((t.token, t.logprob) for t in e.top))
                for s in stream for e in (s.logprobs or ())]
    ref = next(iter(rows.values()))
    worst = 0.0
    for got in rows.values():
        assert [r[0] for r in got] == [r[0] for r in ref]
        for (_, lp, top), (_, lp0, top0) in zip(got, ref, strict=True):
            worst = max(worst, abs(lp - lp0), *(abs(a[1] - b[1]) for a, b in zip(top, top0,
                                                                                  strict=True)))
    assert worst < 0.05, f"max logprob difference {worst} (f16 GGUF vs f32 MLX/LiteRT)"


def test_logprobs_are_log_softmax_of_the_logits() -> None:
    import numpy as np

    with open_stream(TINY_BUNDLE, backend="litert-lm", threads=1, max_tokens=1,
                     top_logprobs=2) as stream:
        stream.prefill(PROMPT)
        logits = np.array(stream.session._logits, dtype=np.float64).reshape(-1)
        step = stream.next()
    expect = logits - (logits.max() + np.log(np.exp(logits - logits.max()).sum()))
    assert step.logprobs is not None
    (entry,) = step.logprobs
    assert abs(entry.logprob - expect[entry.token]) < 1e-9
    assert [t.token for t in entry.top] == list(np.argsort(-expect, kind="stable")[:2])


def test_engine_session_refuses_constraints_and_logprobs() -> None:
    if not importlib.util.find_spec("litert_lm"):
        pytest.skip("litert_lm is not installed")
    engine = {"litert-lm": {"session": "engine"}}
    for fields in ({"json_schema": True}, {"logprobs": True}, {"regex": "[a-z]+"}):
        with pytest.raises(UnsupportedOperationError, match=r"capabilities\.logits"):
            open_stream(TINY_BUNDLE, backend="litert-lm", options=engine, **fields)
    with pytest.raises(UnsupportedOperationError):
        chat_completion(TINY_BUNDLE, [{"role": "user", "content": "hi"}], backend="litert-lm",
                        config={"options": engine}, response_format={"type": "json_object"})


def test_constraint_and_drafter_refused_loudly() -> None:
    with pytest.raises(UnsupportedOperationError, match="speculative"):
        open_stream(TINY_BUNDLE, backend="llama.cpp", drafter="ngram", regex="[a-z]+")


def test_bad_constraints_are_invalid_arguments() -> None:
    from eliza_backends import InvalidArgumentError

    with pytest.raises(InvalidArgumentError, match="one output constraint"):
        open_stream(TINY_BUNDLE, regex="a", grammar="start: \"a\"")
    with pytest.raises(InvalidArgumentError, match="ignore_eos"):
        open_stream(TINY_BUNDLE, regex="a", ignore_eos=True)
    # a constraint that does not compile is refused before any model is loaded
    with pytest.raises(InvalidArgumentError, match="regex does not compile"):
        open_stream(TINY_BUNDLE, backend="llama.cpp", regex="(unclosed")
    with pytest.raises(InvalidArgumentError, match=r"grammar does not compile.*undefined_rule"):
        open_stream(TINY_BUNDLE, backend="llama.cpp", grammar="start: undefined_rule")
    with pytest.raises(InvalidArgumentError, match=r"GBNF.*'missing' not found"):
        StreamConfig(grammar='root ::= "a" missing')  # GBNF with an undefined rule
    with pytest.raises(InvalidArgumentError, match="json_schema does not compile"):
        OutputSpec(Constraint.json_schema({"type": "object", "properties": {
            "a": {"type": "string", "pattern": "(("}}}))
    with pytest.raises(InvalidArgumentError, match="json_schema does not compile"):
        StreamConfig(json_schema={"type": "strin"})
    with open_stream(TINY_BUNDLE, backend="llama.cpp") as stream:
        with pytest.raises(InvalidArgumentError, match="regex does not compile"):
            stream.session.set_output(OutputSpec(Constraint.regex("[a-")))
        stream.prefill(PROMPT)  # the session is untouched: it still generates
        assert next(iter(stream)).tokens


@pytest.mark.parametrize(("body", "param", "needle"), [
    ({"response_format": {"type": "json_schema", "json_schema": {"name": "x", "schema": {
        "type": "object", "properties": {"a": {"type": "string", "pattern": "(("}}}}}},
     "response_format", "does not compile"),
    ({"response_format": {"type": "xml"}}, "response_format", "'xml'"),
    ({"tools": [{"type": "function", "function": {"name": "f", "parameters": {
        "type": "object", "properties": {"a": {"type": "strin"}}}}}]}, "tools",
     "does not compile"),
    ({"tools": [{"type": "function", "function": {"name": "bad name"}}]}, "tools", "name"),
    ({"tools": [{"type": "function", "function": {"name": "f"}}],
      "tool_choice": {"type": "function", "function": {"name": "g"}}}, "tool_choice", "'g'"),
    ({"tools": [{"type": "function", "function": {"name": "f"}}], "tool_choice": "always"},
     "tool_choice", "'always'"),
])
def test_bad_structured_requests_name_the_field(body: dict[str, Any], param: str,
                                                needle: str) -> None:
    from eliza_backends.openai.types import ChatCompletionRequest, RequestError, parse_request

    with pytest.raises(RequestError) as info:
        parse_request(ChatCompletionRequest, {"messages": [{"role": "user", "content": "hi"}],
                                              **body})
    assert info.value.param == param and needle in info.value.message
    assert info.value.code.symbol == "ELIZA_ERR_INVALID_ARG"


def test_openai_response_format_and_logprobs_in_process() -> None:
    schema = {"type": "object", "properties": {"answer": {"enum": ["four", "five"]}},
              "required": ["answer"], "additionalProperties": False}
    reply = chat_completion(TINY_BUNDLE, [{"role": "user", "content": "What is two plus two?"}],
                            response_format={"type": "json_schema", "json_schema": {
                                "name": "answer", "schema": schema}},
                            logprobs=True, top_logprobs=2, max_tokens=32)
    choice = reply.choices[0]
    assert json.loads(choice.message.content or "") in ({"answer": "four"}, {"answer": "five"})
    assert choice.logprobs is not None and choice.logprobs.content
    assert "".join(i.token for i in choice.logprobs.content) == choice.message.content
    assert all(len(i.top_logprobs) == 2 for i in choice.logprobs.content)
    text = completion(TINY_BUNDLE, PROMPT, logprobs=3, max_tokens=6)
    lp = text.choices[0].logprobs
    assert lp is not None and len(lp.tokens) == 6 and lp.top_logprobs is not None
    assert lp.text_offset[0] == 0 and "".join(lp.tokens) == text.choices[0].text


def test_openai_tools_in_process_and_streamed() -> None:
    import jsonschema

    tools = [{"type": "function", "function": {"name": "add", "description": "Add numbers",
              "parameters": {"type": "object", "properties": {
                  "a": {"type": "integer", "minimum": 0, "maximum": 9},
                  "b": {"type": "integer", "minimum": 0, "maximum": 9}},
                  "required": ["a", "b"], "additionalProperties": False}}}]
    msgs = [{"role": "user", "content": "What is two plus two?"}]
    reply = chat_completion(TINY_BUNDLE, msgs, tools=tools, tool_choice="required",
                            parallel_tool_calls=False, max_tokens=64)
    choice = reply.choices[0]
    assert choice.finish_reason == "tool_calls" and choice.message.content is None
    (call,) = choice.message.tool_calls or []
    assert call.function.name == "add" and call.id.startswith("call_")
    jsonschema.validate(json.loads(call.function.arguments),
                        tools[0]["function"]["parameters"])
    chunks = list(chat_completion(TINY_BUNDLE, msgs, tools=tools, tool_choice="required",
                                  parallel_tool_calls=False, max_tokens=64, stream=True))
    last = [c for c in chunks if c.choices][-1].choices[0]
    assert last.finish_reason == "tool_calls" and last.delta.tool_calls
    assert last.delta.tool_calls[0].function.arguments == call.function.arguments
    # the reply turn: the call and its result go back in; the answer is text
    follow = [*msgs, {"role": "assistant", "content": None, "tool_calls": [call.model_dump()]},
              {"role": "tool", "tool_call_id": call.id, "content": "4"}]
    again = chat_completion(TINY_BUNDLE, follow, tools=tools, tool_choice="none",
                            max_tokens=8)
    assert again.choices[0].message.tool_calls is None
    assert isinstance(again.choices[0].message.content, str)


def test_set_output_validates() -> None:
    from eliza_backends import InvalidArgumentError

    with open_stream(TINY_BUNDLE, backend="llama.cpp") as stream:
        with pytest.raises(InvalidArgumentError):
            stream.session.set_output("json")  # type: ignore[arg-type]
        with pytest.raises(InvalidArgumentError):
            OutputSpec(top_logprobs=21)
        stream.session.set_output(OutputSpec(Constraint.json_schema(True)))
        stream.prefill(PROMPT)
        json.loads(stream.text())


TWO_TOOLS = [
    {"type": "function", "function": {"name": "add", "description": "Add numbers",
     "parameters": {"type": "object", "properties": {
         "a": {"type": "integer", "minimum": 0, "maximum": 9},
         "b": {"type": "integer", "minimum": 0, "maximum": 9}},
         "required": ["a", "b"], "additionalProperties": False}}},
    {"type": "function", "function": {"name": "echo", "description": "Echo text",
     "parameters": {"type": "object", "properties": {"text": {"type": "string", "maxLength": 8}},
                    "required": ["text"], "additionalProperties": False}}},
]


@pytest.mark.parametrize("tool_choice", ["auto", "required", "echo", "add"])
def test_tool_choice_variants_give_valid_calls(tool_choice: str) -> None:
    """Each tool_choice constrains the reply: a named function is the only one called,
    ``required`` calls some tool, ``auto`` calls one or answers in text; every call's
    arguments validate against its tool's schema. With parallel_tool_calls the reply may
    carry several calls (the tiny model keeps calling until max_tokens: a cut reply is
    returned as its text, finish_reason length)."""
    import jsonschema

    params = {t["function"]["name"]: t["function"]["parameters"] for t in TWO_TOOLS}
    choice: Any = tool_choice if tool_choice in ("auto", "required") else \
        {"type": "function", "function": {"name": tool_choice}}
    msgs = [{"role": "user", "content": "What is two plus two?"}]
    for parallel in (False, True):
        reply = chat_completion(TINY_BUNDLE, msgs, tools=TWO_TOOLS, tool_choice=choice,
                                parallel_tool_calls=parallel, max_tokens=64,
                                backend="llama.cpp")
        got = reply.choices[0]
        calls = got.message.tool_calls or []
        if got.finish_reason == "length":  # only a run of parallel calls runs this long
            assert parallel and not calls and got.message.content
            assert got.message.content.startswith('{"tool_calls":[{"name":')
            continue
        if tool_choice == "auto" and not calls:
            assert got.finish_reason == "stop" and isinstance(got.message.content, str)
            continue
        assert got.finish_reason == "tool_calls" and got.message.content is None
        assert calls and (parallel or len(calls) == 1)
        for call in calls:
            assert tool_choice in ("auto", "required", call.function.name)
            jsonschema.validate(json.loads(call.function.arguments),
                                params[call.function.name])


def test_structured_output_streams_token_by_token() -> None:
    """A response_format reply streams as it is generated (not held to the end), and the
    chunks add up to the non-streamed JSON."""
    schema = {"type": "object", "properties": {"tags": {
        "type": "array", "items": {"type": "string", "maxLength": 6}, "maxItems": 2}},
        "required": ["tags"], "additionalProperties": False}
    fmt = {"type": "json_schema", "json_schema": {"name": "tags", "schema": schema}}
    msgs = [{"role": "user", "content": "Give tags."}]
    whole = chat_completion(TINY_BUNDLE, msgs, response_format=fmt, max_tokens=48,
                            backend="llama.cpp").choices[0].message.content
    parts = [c.choices[0].delta.content for c in chat_completion(
        TINY_BUNDLE, msgs, response_format=fmt, max_tokens=48, backend="llama.cpp",
        stream=True) if c.choices and c.choices[0].delta.content]
    assert len(parts) > 3 and "".join(parts) == whole
    assert isinstance(json.loads(whole or "")["tags"], list)
