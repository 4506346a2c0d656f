"""Hostile clients and careless users (issue 32): generated malformed requests, CLI arguments
and REPL commands. Each must be a typed error naming what is wrong (a 400 with OpenAI's error
shape on the wire, ``InvalidArgumentError`` in Python, one line and exit status 2 from the
CLI, a notice in the REPL), never an internal error, a traceback, a load, or a lost
conversation. The parts that need a model use the tiny bundle on llama.cpp."""

from __future__ import annotations

import importlib.util
import json
import os
import random
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
from conftest import TINY_BUNDLE
from server_process import ServerProcess

from eliza_backends import InvalidArgumentError, chat_completion, completion, open_stream
from eliza_backends.openai.types import (
    MAX_DEPTH,
    ChatCompletionRequest,
    CompletionRequest,
    RequestError,
    parse_request,
)

MSGS = [{"role": "user", "content": "hi"}]
GGUF = TINY_BUNDLE / "text" / "tiny-f16.gguf"

# --------------------------------------------------------------------------- request bodies

#: Per field of a chat request: values of the wrong JSON type (strict: never coerced).
WRONG_TYPES: dict[str, list[Any]] = {
    "max_tokens": ["16", 16.0, True, [16], {"n": 16}],
    "max_completion_tokens": ["16", 2.5, False],
    "stream": ["yes", "true", 1, 0, [True]],
    "n": ["2", 2.0, True],
    "seed": ["1", 1.5, True],
    "temperature": ["0.5", True, [0.5]],
    "top_p": ["1", False],
    "top_k": ["5", 5.5, True],
    "min_p": ["0.1", True],
    "repeat_penalty": ["1.1", True],
    "ignore_eos": ["yes", 1],
    "stop": [5, [5], [["x"]], {"s": "x"}],
    "user": [5, ["u"]],
    "model": [5, ["tiny"], {"id": "tiny"}],
    "logprobs": ["yes", [True]],
    "top_logprobs": ["5", 5.0, True],
    "stream_options": ["yes", {"include_usage": "yes"}, {"include_usage": 1}],
    "parallel_tool_calls": ["yes", 1],
    "messages": ["hi", {"role": "user"}, [5], [["user", "hi"]], [{"role": 5, "content": "hi"}],
                 [{"role": "user", "content": 5}], [{"role": "user", "content": [5]}],
                 [{"role": "user", "content": [{"type": "text", "text": 5}]}],
                 [{"role": "user", "content": "hi", "name": 5}]],
}


def _wrong_type_cases() -> Iterator[tuple[str, Any]]:
    for field, values in WRONG_TYPES.items():
        for value in values:
            yield field, value


@pytest.mark.parametrize(("field", "value"), list(_wrong_type_cases()),
                         ids=lambda v: repr(v)[:24])
def test_a_wrong_type_is_refused_naming_the_field(field: str, value: Any) -> None:
    body = {"messages": MSGS, field: value}
    with pytest.raises(RequestError) as info:
        parse_request(ChatCompletionRequest, body)
    assert info.value.param is not None and info.value.param.split(".")[0] == field, \
        (info.value.param, info.value.message)
    assert field in info.value.message
    # the same body as JSON text takes the same path
    with pytest.raises(RequestError):
        parse_request(ChatCompletionRequest, json.dumps(body).encode())


def test_text_completion_types_are_strict_too() -> None:
    for field, value in [("prompt", 5), ("prompt", [1, "a"]), ("prompt", [True]),
                         ("echo", "yes"), ("max_tokens", "16"), ("logprobs", "2")]:
        with pytest.raises(RequestError) as info:
            parse_request(CompletionRequest, {"prompt": "hi", field: value})
        assert info.value.param is not None and info.value.param.startswith(field)


def _nest(depth: int, leaf: Any, kind: str) -> Any:
    value = leaf
    for _ in range(depth):
        value = [value] if kind == "list" else {"a": value}
    return value


#: Where a client can put nesting: each maps a nested value to a request body.
PLACES = {
    "response_format": lambda v: {"messages": MSGS, "response_format": {
        "type": "json_schema", "json_schema": {"name": "x", "schema": {"properties": v}}}},
    "tools": lambda v: {"messages": MSGS, "tools": [{"type": "function", "function": {
        "name": "f", "parameters": {"type": "object", "properties": {"p": v}}}}]},
    "tool_calls": lambda v: {"messages": [{"role": "assistant", "content": None, "tool_calls": [
        {"id": "1", "type": "function", "function": {"name": "f", "arguments": v}}]}, *MSGS]},
    "logit_bias": lambda v: {"messages": MSGS, "logit_bias": v},
    "messages": lambda v: {"messages": v},
    "stop": lambda v: {"messages": MSGS, "stop": v},
}


@pytest.mark.parametrize("place", list(PLACES))
@pytest.mark.parametrize("depth", [MAX_DEPTH + 1, 2_000, 200_000])
def test_deep_nesting_is_refused_before_anything_walks_it(place: str, depth: int) -> None:
    for kind in ("list", "dict"):
        body = PLACES[place](_nest(depth, 1, kind))
        if depth < 2_000:  # a decoded object (deeper ones cannot be built by json.dumps)
            with pytest.raises(RequestError) as info:
                parse_request(ChatCompletionRequest, body)
            prefix = "messages" if place == "tool_calls" else place
            assert info.value.param is not None and info.value.param.startswith(prefix)
            assert len(info.value.message) < 200
        opener, closer = ("[", "]") if kind == "list" else ('{"a":', "}")
        nested = opener * depth + "1" + closer * depth
        text = json.dumps(PLACES[place]("NESTED")).replace('"NESTED"', nested)
        with pytest.raises(RequestError) as info:
            parse_request(ChatCompletionRequest, text.encode())
        assert "deeper than" in info.value.message


def test_nesting_inside_a_string_argument_is_kept_as_text() -> None:
    """tool_calls arguments are JSON *text*: nesting inside a string is not a body's nesting,
    and the prompt keeps the text when it does not decode (no RecursionError)."""
    from eliza_backends.openai.tools import parse_tools, prepare_messages

    deep = "[" * 100_000 + "]" * 100_000
    req = parse_request(ChatCompletionRequest, {"messages": [
        {"role": "assistant", "content": None, "tool_calls": [
            {"id": "1", "type": "function", "function": {"name": "f", "arguments": deep}}]},
        *MSGS]})
    tools = parse_tools([{"type": "function", "function": {"name": "f"}}])
    msgs, _ = prepare_messages([m.for_template() for m in req.messages], tools, None, "")
    assert deep in msgs[1]["content"]


MALFORMED_TOOL_CALLS: list[Any] = [
    "call", 5, None, [], {}, ["x"], [5], [None], [{}], [{"id": "1"}], [{"function": None}],
    [{"function": "f"}], [{"function": {}}], [{"function": {"name": 5}}],
    [{"function": {"name": "f", "arguments": 5}}],
    [{"function": {"name": "f", "arguments": ["a"]}}], [{"type": "tool", "function": {
        "name": "f"}}], [{"id": 5, "function": {"name": "f"}}],
]


@pytest.mark.parametrize("calls", MALFORMED_TOOL_CALLS, ids=lambda v: repr(v)[:30])
def test_malformed_earlier_tool_calls_are_refused(calls: Any) -> None:
    body = {"messages": [{"role": "assistant", "content": "x", "tool_calls": calls}, *MSGS],
            "tools": [{"type": "function", "function": {"name": "f"}}]}
    if calls in (None, []):  # no calls: a valid plain assistant turn
        parse_request(ChatCompletionRequest, body)
        return
    with pytest.raises(RequestError) as info:
        parse_request(ChatCompletionRequest, body)
    assert info.value.param is not None and info.value.param.startswith("messages.0.tool_calls")


NOT_MESSAGES: list[Any] = [None, "hi", b"hi", 5, 1.5, [1, 2], [["user", "hi"]], ["hi"],
                           [None], {"role": "user", "content": "hi"},
                           [{"role": "robot", "content": "hi"}], [{"content": "hi"}],
                           iter(MSGS), object()]


@pytest.mark.parametrize("messages", NOT_MESSAGES, ids=lambda v: repr(v)[:24])
def test_chat_completion_given_non_messages_is_an_invalid_argument_error(messages: Any) -> None:
    # checked before the bundle is opened: a missing path proves nothing loaded
    with pytest.raises(InvalidArgumentError):
        chat_completion("/nonexistent/bundle", messages)


@pytest.mark.parametrize("kwargs", [{"max_tokens": "16"}, {"stream": "yes"}, {"n": 1.0},
                                    {"stop": 5}, {"temperature": "0"}, {"seed": True}])
def test_python_api_arguments_are_strict(kwargs: dict[str, Any]) -> None:
    with pytest.raises(InvalidArgumentError):
        chat_completion("/nonexistent/bundle", MSGS, **kwargs)
    with pytest.raises(InvalidArgumentError):
        completion("/nonexistent/bundle", "hi", **kwargs)


# --------------------------------------------------------------------------- the server


@pytest.fixture(scope="module")
def server() -> Iterator[ServerProcess]:
    with ServerProcess(TINY_BUNDLE, "--backend", "llama.cpp", "--threads", "1") as proc:
        yield proc


def _generated_bodies(rng: random.Random, n: int) -> Iterator[tuple[str, bytes]]:
    """(expected param prefix or "", body) pairs: wrong types, deep nesting, bad tool calls."""
    cases = list(_wrong_type_cases())
    for _ in range(n):
        pick = rng.random()
        if pick < 0.5:
            field, value = rng.choice(cases)
            yield field, json.dumps({"messages": MSGS, field: value}).encode()
        elif pick < 0.8:
            place = rng.choice(list(PLACES))
            depth = rng.choice([MAX_DEPTH + 1, 500, 5_000, 100_000])
            opener, closer = rng.choice([("[", "]"), ('{"a":', "}")])
            text = json.dumps(PLACES[place]("N")).replace(
                '"N"', opener * depth + "1" + closer * depth)
            yield "", text.encode()
        else:
            calls = rng.choice([c for c in MALFORMED_TOOL_CALLS if c not in (None, [])])
            yield "messages", json.dumps({"messages": [
                {"role": "assistant", "content": "x", "tool_calls": calls}, *MSGS]}).encode()


def test_generated_bad_bodies_are_400s_in_openai_shape(server: ServerProcess) -> None:
    rng = random.Random(32)
    statuses: dict[int, int] = {}
    with httpx.Client(base_url=server.url, timeout=30) as http:
        for param, body in _generated_bodies(rng, 60):
            resp = http.post("/chat/completions", content=body,
                             headers={"Content-Type": "application/json"})
            statuses[resp.status_code] = statuses.get(resp.status_code, 0) + 1
            assert resp.status_code == 400, (body[:200], resp.text[:300])
            error = resp.json()["error"]
            assert set(error) == {"message", "type", "param", "code"}
            assert error["type"] == "invalid_request_error"
            if param:
                assert error["param"] and error["param"].startswith(param), (error, body[:200])
    assert server.health()["status"] == "ok"


def test_a_schema_beyond_the_constraint_engine_is_a_400_and_keeps_the_session(
        server: ServerProcess) -> None:
    schema = {"anyOf": [{"type": "object", "properties": {
        f"k{i}": {"anyOf": [{"type": "string"}, {"type": "number"},
                            {"type": "array", "items": {"type": "string"}}]}
        for i in range(50)}} for _ in range(20)]}
    before = server.health()
    with httpx.Client(base_url=server.url, timeout=60) as http:
        resp = http.post("/chat/completions", json={
            "messages": MSGS, "max_tokens": 16,
            "response_format": {"type": "json_schema", "json_schema": {"name": "x",
                                                                       "schema": schema}}})
        assert resp.status_code == 400, resp.text
        assert "constraint" in resp.json()["error"]["message"]
        after = server.wait_idle()
        assert after["reopened"] == before["reopened"] and after["failed"] == before["failed"]
        ok = http.post("/chat/completions", json={"messages": MSGS, "max_tokens": 4})
        assert ok.status_code == 200, ok.text


def test_shutdown_drops_a_client_that_stopped_reading_after_grace() -> None:
    with ServerProcess(TINY_BUNDLE, "--backend", "llama.cpp", "--threads", "1",
                       "--grace", "0.5") as proc:
        host, port = proc.root.removeprefix("http://").split(":")
        sock = socket.socket()
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 2048)
        sock.connect((host, int(port)))
        # each event carries 20 alternatives per token (~2 KB): the stream outgrows the
        # socket buffers and uvicorn's write buffer within a second, then the server waits
        body = json.dumps({"messages": MSGS, "max_tokens": 1900, "stream": True,
                           "ignore_eos": True, "logprobs": True, "top_logprobs": 20}).encode()
        sock.sendall(b"POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nContent-Type: "
                     b"application/json\r\nContent-Length: " + str(len(body)).encode()
                     + b"\r\n\r\n" + body)
        time.sleep(4.0)
        t0 = time.monotonic()
        status = proc.stop(timeout=15)
        took = time.monotonic() - t0
        sock.close()
        assert status == 0 and took < 10, (status, took, "".join(proc.stderr[-5:]))


# --------------------------------------------------------------------------- the CLI

#: A valid command line per command, with the flag values the fuzzer replaces.
BASES: dict[str, list[str]] = {
    "generate": ["generate", str(TINY_BUNDLE), "hi", "--max-tokens", "4", "--temperature",
                 "0.5", "--top-k", "5", "--top-p", "0.9", "--min-p", "0.1", "--seed", "1",
                 "--threads", "1", "--context-size", "256", "--repeat-penalty", "1.1",
                 "--batch-size", "32", "--tokens-per-step", "1", "--draft-length", "2"],
    "chat": ["chat", str(TINY_BUNDLE), "--max-tokens", "4", "--temperature", "0.5"],
    "serve": ["serve", str(TINY_BUNDLE), "--port", "8000", "--sessions", "1", "--queue", "2",
              "--grace", "1", "--log-level", "info", "--threads", "1", "--context-size",
              "256", "--temperature", "0.5"],
    "bench": ["bench", str(TINY_BUNDLE), "--prompt-tokens", "8", "--gen-tokens", "8",
              "--repeat", "1", "--threads", "1"],
    "select": ["select", str(TINY_BUNDLE)],
    "create": ["bundle", "create", "OUT", str(GGUF), "--name", "ok"],
    "verify": ["bundle", "verify", str(TINY_BUNDLE)],
    "convert": ["bundle", "convert", str(GGUF), "OUT", "--cache-length", "64",
                "--prefill-lengths", "8", "--threads", "1"],
}
#: Values no flag of BASES takes (every numeric flag has a lower bound >= 0 and an upper one
#: below inf; "--" and "" are never a value).
ALWAYS_BAD = ["-1", "nan", "inf", "-inf", "1e309", "", " ", "abc", "0x10", "bogus", "--", "-"]
#: Values that some flags take and others refuse: either outcome, never a traceback.
SOMETIMES = ["0", "1.5", "70000", "9" * 40]
#: Flags whose value is free text (only "" and "--" are bad).
TEXT_FLAGS = {"--name"}


class Reached(Exception):
    """The command's work was reached (the arguments were accepted)."""


def _cli_cases(tmp: Path) -> Iterator[tuple[list[str], bool]]:
    """(argv, must be refused)."""
    loop = tmp / "loop"
    if not loop.is_symlink():
        os.symlink(loop, loop)
    a_file = tmp / "a-file"
    a_file.write_text("x")
    bad_paths = [str(loop), str(loop / "x"), str(a_file / "x")]
    for template in BASES.values():
        base = [str(tmp / "out") if a == "OUT" else a for a in template]
        for i, arg in enumerate(base):
            if arg.startswith("--") and i + 1 < len(base):
                for value in ALWAYS_BAD + SOMETIMES:
                    bad = value in ("", "--") if arg in TEXT_FLAGS else value in ALWAYS_BAD
                    yield [*base[:i + 1], value, *base[i + 2:]], bad
        for i, arg in enumerate(base):
            if os.sep not in arg:
                continue
            for path in bad_paths:  # (a missing input is the command's error: exit 1)
                yield [*base[:i], path, *base[i + 1:]], True
        yield [*base, "--no-such-flag"], True
    yield ["bundle", "create", str(a_file), str(GGUF)], True
    yield ["bundle", "create", str(tmp / "b"), str(GGUF), "--name", "n" * 201], True
    yield ["serve", str(TINY_BUNDLE), "--log-level", "bogus"], True
    yield ["serve", str(TINY_BUNDLE), "--port", "70000"], True
    yield ["serve", str(TINY_BUNDLE), "--threads", "70000"], True
    yield ["serve", str(TINY_BUNDLE), "--parallel", "0"], True
    yield ["serve", str(TINY_BUNDLE), "--parallel", "4", "--sessions", "2"], True
    yield ["serve", str(TINY_BUNDLE), "--parallel", "4", "--sessions", "1"], False
    yield ["generate", str(TINY_BUNDLE), "hi", "--option", "nocolon"], True
    yield ["generate", str(TINY_BUNDLE), "hi", "--temperature", "-3"], True
    yield ["generate", str(TINY_BUNDLE), "hi", "--top-p", "1.5"], True
    yield ["frobnicate"], True
    yield [], True


@pytest.fixture
def no_work(monkeypatch: pytest.MonkeyPatch) -> None:
    """Every command's work raises :class:`Reached`: bad arguments must stop before it."""
    import importlib

    def reached(*_a: Any, **_k: Any) -> Any:
        raise Reached

    for module, name in [("stream", "open_stream"), ("server.serve", "serve"),
                         ("bench", "bench"), ("selector", "explain"),
                         ("manifest", "create_bundle"), ("manifest", "verify_bundle"),
                         ("convert.pipeline", "convert")]:
        monkeypatch.setattr(importlib.import_module(f"eliza_backends.{module}"), name, reached)


def test_cli_argument_fuzzer_one_line_no_traceback_exit_2(
        tmp_path: Path, no_work: None, capsys: pytest.CaptureFixture[str]) -> None:
    from eliza_backends.cli import main

    tried = refused = 0
    for argv, must_refuse in _cli_cases(tmp_path):
        tried += 1
        try:
            status = main(argv)
        except Reached:
            assert not must_refuse, f"{argv}: accepted, the command ran"
            capsys.readouterr()
            continue
        out = capsys.readouterr()
        lines = out.err.strip().splitlines()
        assert status == 2, (argv, status, out.err[-500:])
        assert len(lines) == 1 and lines[0].startswith("error: "), (argv, out.err)
        assert "ELIZA_ERR_INVALID_ARG" in lines[0] and "Traceback" not in out.err, argv
        refused += 1
    assert tried > 400 and refused > 300, (tried, refused)


@pytest.mark.parametrize("argv", [
    ["bundle", "verify", "LOOP"], ["bundle", "create", "FILE", str(GGUF)],
    ["bundle", "create", "NEW", str(GGUF), "--name", "n" * 300],
    ["serve", str(TINY_BUNDLE), "--port", "70000"],
    ["serve", str(TINY_BUNDLE), "--log-level", "bogus"]])
def test_the_reported_cli_cases_in_a_real_process(tmp_path: Path, argv: list[str]) -> None:
    loop = tmp_path / "loop"
    os.symlink(loop, loop)
    (tmp_path / "file").write_text("x")
    swap = {"LOOP": str(loop), "FILE": str(tmp_path / "file"), "NEW": str(tmp_path / "new")}
    t0 = time.monotonic()
    out = subprocess.run([sys.executable, "-m", "eliza_backends", *[swap.get(a, a) for a in argv]],
                         capture_output=True, text=True, timeout=120)
    assert out.returncode == 2, out.stderr
    assert len(out.stderr.strip().splitlines()) == 1 and "ELIZA_ERR_INVALID_ARG" in out.stderr
    assert not (tmp_path / "new").exists()  # refused before the copy
    assert time.monotonic() - t0 < 30


# --------------------------------------------------------------------------- the chat REPL


def test_repl_reports_a_failed_save_or_load_and_keeps_the_conversation(tmp_path: Path) -> None:
    from eliza_backends.cli import _chat_command

    nested = tmp_path / "nested"
    (tmp_path / "nested.messages.json").write_text("[" * 200_000 + "]" * 200_000)
    (tmp_path / "dir.messages.json").mkdir()
    (tmp_path / "bad.messages.json").write_bytes(b"\xff\xfe not utf-8")
    (tmp_path / "shape.messages.json").write_text(json.dumps([{"role": 5}]))
    conversation = [{"role": "user", "content": "hi"}, {"role": "assistant", "content": "yo"}]
    with open_stream(TINY_BUNDLE, backend="llama.cpp", threads=1, context_size=512) as stream:
        stream.prefill("hi there")
        for line in [f"/load {nested}", f"/load {tmp_path / 'dir'}", f"/save {tmp_path / 'dir'}",
                     f"/load {tmp_path / 'bad'}", f"/load {tmp_path / 'shape'}",
                     f"/save {tmp_path / 'a-file' / 'below'}", f"/load {tmp_path}",
                     f"/save {tmp_path}", f"/load {tmp_path / 'missing'}"]:
            outcome = _chat_command(stream, line, list(conversation), [])
            assert outcome is not None, line
            messages, notice = outcome
            assert messages == conversation, line
            assert notice.startswith(f"[{line.split()[0]} failed: "), (line, notice)
        # and the REPL still works: save and load round-trip
        messages, notice = _chat_command(stream, f"/save {tmp_path / 'ok'}", conversation, [])
        assert notice.startswith("[saved"), notice
        messages, notice = _chat_command(stream, f"/load {tmp_path / 'ok'}", [], [])
        assert messages == conversation, notice


@pytest.mark.skipif(importlib.util.find_spec("ai_edge_litert") is None,
                    reason="ai-edge-litert is not installed")
@pytest.mark.parametrize("session", ["interpreter", "engine"])
def test_litert_native_lines_at_exit_are_behind_verbose(session: str) -> None:
    """LiteRT's DestroyAccelerator lines (printed as its runtime is freed, some by C++ static
    destructors after Python is gone) are native log output: hidden by default, shown with
    -v, as the lines it prints during calls."""
    base = [sys.executable, "-m", "eliza_backends", "generate", str(TINY_BUNDLE), "Hello",
            "--backend", "litert-lm", "--max-tokens", "4", "--threads", "1", "--option",
            f"litert-lm:session={session}"]
    quiet = subprocess.run(base, capture_output=True, text=True, timeout=120)
    assert quiet.returncode == 0, quiet.stderr
    assert "DestroyAccelerator" not in quiet.stderr and "INFO:" not in quiet.stderr, \
        quiet.stderr
    assert "[litert-lm]" in quiet.stderr  # the CLI's own stats line is still there
    loud = subprocess.run([*base[:3], "-v", *base[3:]], capture_output=True, text=True,
                          timeout=120)
    assert loud.returncode == 0, loud.stderr
    if session == "interpreter":  # (the engine session prints none of them)
        assert "DestroyAccelerator" in loud.stderr, loud.stderr[-2000:]


@pytest.mark.parametrize("show", [False, True])
def test_convert_stages_keep_the_tools_noise_behind_verbose(
        tmp_path: Path, capfd: pytest.CaptureFixture[str], show: bool) -> None:
    """``bundle convert`` prints its own stage lines; the progress bars and warnings of the
    tools a stage runs in-process (Python or native, stdout or stderr) go to the stage's
    tools.log unless -v (``tool_output``); a failing stage shows their last lines."""
    from eliza_backends.convert.stages import StageRunner

    runner = StageRunner(tmp_path / "work", sys.stderr, tool_output=show)

    def noisy(out: Path) -> None:
        print("Converting: 100%|####| 12/12 [00:01<00:00]", flush=True)
        print("tqdm-bar 50%", file=sys.stderr, flush=True)
        sys.stderr.write("FutureWarning: a tool's deprecation warning\n")
        os.write(2, b"native tool line\n")
        runner.say("a line of our own from inside the stage")

    runner.run("noisy", ("k",), noisy)
    out, err = capfd.readouterr()
    noise = ["Converting: 100%", "tqdm-bar", "deprecation warning", "native tool line"]
    assert "noisy: started" in err and "noisy: done" in err
    assert "a line of our own from inside the stage" in err
    shown = [n for n in noise if n in out + err]
    assert shown == (noise if show else []), (out, err)
    if not show:
        log = next((tmp_path / "work").glob("noisy-*/tools.log")).read_text()
        assert all(n in log for n in noise), log

    def failing(out: Path) -> None:
        print("the tool's reason for failing", file=sys.stderr, flush=True)
        raise RuntimeError("stage failed")

    with pytest.raises(RuntimeError):
        runner.run("failing", ("k",), failing)
    err = capfd.readouterr().err
    assert "failing: failed after" in err and "the tool's reason for failing" in err
