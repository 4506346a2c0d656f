"""Gemma 4 tool calls that survive a sloppy model: the corpus of real malformed call texts from
the public trackers (tests/data/gemma4_tool_calls.jsonl, each case with the repository, issue or
pull request and URL it came from) read by :mod:`eliza_backends.openai.gemma4_reader`.

Every call a reader would recognise comes back with its name and arguments, nothing that is
not a call becomes one (prose quoting call syntax, a call to a tool not offered, a call cut
short), the repairs are logged at DEBUG on ``eliza_backends.openai.tool_calls``, well-formed
replies read exactly as the strict parser reads them, and the text read in pieces (one
character at a time, every cut in two, the real tokenizer's pieces of the tiny Gemma 4 bundle
in test_gemma4_streaming.py) gives what the whole text gives.
"""

from __future__ import annotations

import json
import logging
from pathlib import Path
from typing import Any

import pytest
from test_gemma4_tools import MALFORMED, PARSED

from eliza_backends.openai.gemma4_calls import parse_gemma4_reply
from eliza_backends.openai.gemma4_reader import Gemma4Reader, read_gemma4_reply

ROOT = Path(__file__).resolve().parent.parent
CORPUS: list[dict[str, Any]] = [
    json.loads(line) for line in
    (ROOT / "tests" / "data" / "gemma4_tool_calls.jsonl").read_text(encoding="utf-8").splitlines()
    if line.strip()]
Q = '<|"|>'


def _named(calls: list[dict[str, Any]]) -> list[tuple[str, Any]]:
    return [(c["function"]["name"], json.loads(c["function"]["arguments"])) for c in calls]


def _expected(case: dict[str, Any]) -> tuple[str | None, list[tuple[str, Any]]]:
    want = case["expect"]
    if want.get("not_a_call"):
        return want["content"], []
    return want["content"], [(c["name"], c["arguments"]) for c in want["calls"]]


def _read_in_pieces(text: str, pieces: list[str], tools: dict[str, Any]
                    ) -> tuple[str | None, list[tuple[str, Any]]]:
    assert "".join(pieces) == text
    reader = Gemma4Reader(tools)
    content: list[str] = []
    calls: list[dict[str, Any]] = []
    for piece in pieces:
        got = reader.feed(piece)
        content += got.content
        calls += got.calls
    got = reader.finish()
    content += got.content
    calls += got.calls
    joined = "".join(content)
    return (joined or None) if calls else joined, _named(calls)


# --------------------------------------------------------------------------- the corpus


def test_corpus_has_every_reported_shape_with_provenance() -> None:
    """Each case names its source (repository, number, URL on github.com); the shapes the
    issue lists are all there; calls and non-calls both."""
    for case in CORPUS:
        src = case["source"]
        assert src["url"] == f"https://github.com/{src['repository']}/" \
            f"{'pull' if '/pull/' in src['url'] else 'issues'}/{src['number']}", case["id"]
    shapes = " ".join(c["shape"] for c in CORPUS).lower()
    for shape in ("missing closing brace", "quote", "stray", "duplicated", "json",
                  "<tool_call|>", "nested", "numbers", "several calls", "prose",
                  "parentheses", "thought"):
        assert shape in shapes, shape
    assert sum(bool(c["expect"].get("not_a_call")) for c in CORPUS) >= 5
    assert len({c["source"]["repository"] for c in CORPUS}) >= 10
    assert len(CORPUS) == len({c["id"] for c in CORPUS})


@pytest.mark.parametrize("case", CORPUS, ids=[c["id"] for c in CORPUS])
def test_corpus_case_reads_as_a_person_would(case: dict[str, Any]) -> None:
    content, calls = read_gemma4_reply(case["text"], case["tools"])
    assert (content, _named(calls)) == _expected(case)
    assert all(c["type"] == "function" and c["id"].startswith("call_") for c in calls)


@pytest.mark.parametrize("case", CORPUS, ids=[c["id"] for c in CORPUS])
def test_corpus_case_streamed_agrees_with_whole(case: dict[str, Any]) -> None:
    """One character at a time, and every cut of the text in two."""
    text, tools = case["text"], case["tools"]
    want = _expected(case)
    assert _read_in_pieces(text, list(text), tools) == want
    for cut in range(1, len(text)):
        assert _read_in_pieces(text, [text[:cut], text[cut:]], tools) == want, cut


def test_repairs_are_logged(caplog: pytest.LogCaptureFixture) -> None:
    case = next(c for c in CORPUS if c["id"] == "sglang-39240-missing-open-quote-comma")
    with caplog.at_level(logging.DEBUG, logger="eliza_backends.openai.tool_calls"):
        read_gemma4_reply(case["text"], case["tools"])
    lines = [r.getMessage() for r in caplog.records
             if r.name == "eliza_backends.openai.tool_calls"]
    assert lines == ["gemma4 tool call web_search repaired: a string without <|\"|> "
                     "delimiters"]
    caplog.clear()
    with caplog.at_level(logging.DEBUG, logger="eliza_backends.openai.tool_calls"):
        read_gemma4_reply(f"<|tool_call>call:f{{a:{Q}x{Q}}}<tool_call|>", {"f": {}})
    assert not caplog.records  # a well-formed call repairs nothing


def test_what_is_not_a_call_is_logged(caplog: pytest.LogCaptureFixture) -> None:
    text = f"<|tool_call>call:rm_rf{{path:{Q}/{Q}}}<tool_call|>"
    with caplog.at_level(logging.DEBUG, logger="eliza_backends.openai.tool_calls"):
        assert read_gemma4_reply(text, {"terminal": {}}) == (text, [])
    assert "not a tool offered" in caplog.text


# --------------------------------------------------------------------------- the strict path


@pytest.mark.parametrize(("text", "content", "calls"), PARSED)
def test_well_formed_replies_read_as_the_strict_parser(
        text: str, content: str | None, calls: list[tuple[str, Any]]) -> None:
    """llama.cpp's cases (test_gemma4_tools.PARSED): the same content and calls, the same
    ``arguments`` text, and the same in pieces."""
    got_content, got = read_gemma4_reply(text)
    strict_content, strict = parse_gemma4_reply(text)
    assert (got_content, _named(got)) == (content, calls) == (strict_content, _named(strict))
    assert [c["function"]["arguments"] for c in got] == \
        [c["function"]["arguments"] for c in strict]
    assert _read_in_pieces(text, list(text), {n: {} for n, _ in calls}) == (content, calls)


def test_the_strict_parsers_malformed_cases() -> None:
    """What the tolerant reader makes of the texts the strict parser refuses: an unterminated
    string closed by the call's own brace, a call missing only its close tag, a bare word
    value, a call followed by text are recovered; a call with no name and one nested past the
    limit stay content."""
    got = [read_gemma4_reply(t) for t in MALFORMED]
    london = [("get_time", {"city": "London"})]
    assert [_named(calls) for _, calls in got] == \
        [london, london, london, [], [("get_time", {"city": "x"})], []]
    assert [content for content, _ in got] == \
        [None, None, None, MALFORMED[3], "and then more text", MALFORMED[5]]


def test_plain_answers_stream_as_they_are_written() -> None:
    """Content is released as soon as it cannot start a call: only a marker's first
    characters (and a thought channel still open) are held."""
    reader = Gemma4Reader({"f": {}})
    assert reader.feed("ca").content == []  # may be 'call:' at the reply's start
    assert reader.feed("t").content == ["cat"]
    reader = Gemma4Reader({"f": {}})
    assert reader.feed("Sure, ").content == ["Sure, "]
    assert reader.feed("the answer <|tool").content == ["the answer "]
    assert reader.feed("_call>call:f{").content == []
    got = reader.feed("a:1}<tool_call|>")
    assert got.content == [] and _named(got.calls) == [("f", {"a": 1})]
    reader = Gemma4Reader({"f": {}})
    assert reader.feed("<|channel>thought\nhmm").content == []
    assert reader.feed("<channel|>It is 4.").content == ["It is 4."]


def test_repaired_shapes_beyond_the_corpus() -> None:
    tools = {"f": {"type": "object", "properties": {"a": {"type": "string"},
                                                    "b": {"type": "integer"}}}}
    cases = [
        # a thought, then a call whose opener is repeated
        (f"<|channel>thought\nx<channel|><|tool_call><|tool_call>call:f{{a:{Q}y{Q}}}"
         "<tool_call|>", None, [("f", {"a": "y"})]),
        # quoted keys (the template's escape_keys form and JSON's)
        (f'<|tool_call>call:f{{{Q}a{Q}:{Q}y{Q},"b":2}}<tool_call|>', None,
         [("f", {"a": "y", "b": 2})]),
        # an extra closing brace before the close tag
        (f"<|tool_call>call:f{{a:{Q}y{Q}}}}}<tool_call|>", None, [("f", {"a": "y"})]),
        # the JSON call object inside the markers
        ('<|tool_call>{"name": "f", "arguments": {"b": 1e999}}<tool_call|>', None,
         [("f", {"b": float("inf")})]),
        # text after a call with no close tag: the call, then content
        ("<|tool_call>call:f{b:1} Done.", "Done.", [("f", {"b": 1})]),
        # a fenced JSON call as the whole reply
        ('```json\n{"name": "f", "arguments": {"a": "z"}}\n```', None, [("f", {"a": "z"})]),
    ]
    for text, content, calls in cases:
        assert read_gemma4_reply(text, tools)[0] == content, text
        assert _named(read_gemma4_reply(text, tools)[1]) == calls, text
    # the literal as written: 1e999 stays 1e999 in the arguments' JSON text
    assert read_gemma4_reply('<|tool_call>{"name": "f", "arguments": {"b": 1e999}}'
                             '<tool_call|>', tools)[1][0]["function"]["arguments"] == \
        '{"b": 1e999}'


def test_never_a_call_from_prose_or_a_cut() -> None:
    tools = {"f": {"type": "object", "properties": {"a": {"type": "string"}}}}
    for text in [
        f"I would call:f{{a:{Q}x{Q}}} now",  # bare call syntax inside prose
        "Use {\"name\": \"f\", \"arguments\": {}} like this",  # JSON inside prose
        f"<|tool_call>call:f{{a:{Q}half",  # cut short inside a string
        "<|tool_call>call:f{a:[1,2",  # cut short inside an array
        f"<|tool_call>call:g{{a:{Q}x{Q}}}<tool_call|>",  # a tool not offered
        '{"name": "g", "arguments": {}}',  # JSON naming a tool not offered
        "<|tool_call>call:f<tool_call|>",  # no arguments at all
    ]:
        assert read_gemma4_reply(text, tools)[1] == [], text
