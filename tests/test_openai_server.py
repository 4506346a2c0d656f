"""``eliza-backends serve`` against the official ``openai`` client on loopback, on every
installed backend: replies equal the in-process API's, streaming, stop, max_tokens, seed,
OpenAI-shaped errors; then (llama.cpp) the queue bound, disconnects, prefix routing, logs and a
graceful Ctrl-C."""

from __future__ import annotations

import importlib.util
import json
import threading
import time
from collections.abc import Iterator
from typing import Any

import httpx
import openai
import pytest
from conftest import TINY_BUNDLE
from server_process import ServerProcess

from eliza_backends import chat_completion, completion

MATH = [{"role": "user", "content": "What is two plus two?"}]
LONG = {"ignore_eos": True}  # an extension field: generate to max_tokens

BACKENDS = [("llama.cpp", "llama_cpp", ()),
            ("litert-lm", "ai_edge_litert", ()),
            ("litert-lm", "litert_lm", ("--option", "litert-lm:session=engine")),
            ("mlx", "mlx_lm", ())]


def _backends() -> list[Any]:
    out = []
    for backend, module, args in BACKENDS:
        marks = [] if importlib.util.find_spec(module) else [
            pytest.mark.skip(reason=f"{module} is not installed")]
        out.append(pytest.param((backend, args), marks=marks,
                                id=backend + ("/engine" if args else "")))
    return out


def client(server: ServerProcess, **kwargs: Any) -> openai.OpenAI:
    return openai.OpenAI(base_url=server.url, api_key="unused", max_retries=0, timeout=60,
                         **kwargs)


@pytest.fixture(scope="module", params=_backends())
def served(request: pytest.FixtureRequest) -> Iterator[tuple[ServerProcess, str, tuple[str, ...]]]:
    backend, args = request.param
    with ServerProcess(TINY_BUNDLE, "--backend", backend, "--sessions", "2", "--threads", "1",
                       *args) as server:
        yield server, backend, args


def _local_config(args: tuple[str, ...]) -> dict[str, Any]:
    options = {"litert-lm": {"session": "engine"}} if args else {}
    return {"threads": 1, "options": options}


def test_startup_line_models_and_health(served: Any) -> None:
    server, backend, _ = served
    assert f"model tiny on {backend if backend != 'mlx' else 'mlx-coreml'}" in \
        server.announcement
    models = client(server).models.list()
    assert [m.id for m in models.data] == ["tiny"]
    assert client(server).models.retrieve("tiny").id == "tiny"
    health = server.health()
    assert health["status"] == "ok" and health["sessions"] == 2 and health["model"] == "tiny"


def test_chat_equals_the_in_process_api(served: Any) -> None:
    server, backend, args = served
    got = client(server).chat.completions.create(model="tiny", messages=MATH, max_tokens=48)
    want = chat_completion(TINY_BUNDLE, MATH, max_tokens=48, backend=backend,
                           config=_local_config(args))
    assert got.choices[0].message.content == want.choices[0].message.content
    assert got.choices[0].finish_reason == want.choices[0].finish_reason == "stop"
    assert got.usage is not None and got.usage.completion_tokens == want.usage.completion_tokens
    assert got.usage.prompt_tokens == want.usage.prompt_tokens
    assert got.object == "chat.completion" and got.model == "tiny"


def test_streaming_gives_the_same_text_in_chunks(served: Any) -> None:
    server, _, _ = served
    c = client(server)
    whole = c.chat.completions.create(model="tiny", messages=MATH, max_tokens=48)
    chunks = list(c.chat.completions.create(model="tiny", messages=MATH, max_tokens=48,
                                            stream=True, stream_options={"include_usage": True}))
    assert chunks[0].choices[0].delta.role == "assistant"
    text = "".join(ch.choices[0].delta.content or "" for ch in chunks if ch.choices)
    assert text == whole.choices[0].message.content
    finishes = [ch.choices[0].finish_reason for ch in chunks if ch.choices]
    assert finishes[-1] == "stop" and set(finishes[:-1]) == {None}
    assert chunks[-1].choices == [] and chunks[-1].usage is not None
    assert chunks[-1].usage.completion_tokens == whole.usage.completion_tokens  # type: ignore[union-attr]
    assert len(text) > 3 and len(chunks) > 5  # really streamed, token by token


def test_text_completion_stop_and_max_tokens(served: Any) -> None:
    server, backend, args = served
    c = client(server)
    prompt = "Four score and seven years ago"
    want = completion(TINY_BUNDLE, prompt, max_tokens=32, backend=backend,
                      config=_local_config(args)).choices[0].text
    full = c.completions.create(model="tiny", prompt=prompt, max_tokens=32)
    assert full.choices[0].text == want and full.choices[0].finish_reason == "length"
    stopped = c.completions.create(model="tiny", prompt=prompt, max_tokens=32, stop=["forth"])
    assert stopped.choices[0].text == want[:want.index("forth")]
    assert stopped.choices[0].finish_reason == "stop"
    short = c.completions.create(model="tiny", prompt=prompt, max_tokens=2)
    assert short.usage is not None and short.usage.completion_tokens == 2
    assert short.choices[0].finish_reason == "length"
    streamed = "".join(ch.choices[0].text for ch in c.completions.create(
        model="tiny", prompt=prompt, max_tokens=32, stream=True) if ch.choices)
    assert streamed == want


def _sampled(server: ServerProcess, seed: int | None, **extra: Any) -> str:
    kwargs: dict[str, Any] = {"temperature": 1.5, "seed": seed} if seed is not None else {}
    return client(server).completions.create(
        model="tiny", prompt="Once upon a time", max_tokens=24, **kwargs,
        extra_body=extra or None).choices[0].text


def test_seed_makes_sampling_repeatable(served: Any) -> None:
    server, _, _ = served
    runs = [_sampled(server, seed, top_k=40) for seed in (11, 11, 12)]
    assert runs[0] == runs[1]
    assert len({runs[0], runs[2], _sampled(server, None)}) > 1, runs


def test_temperature_alone_samples(served: Any) -> None:
    server, _, _ = served
    assert len({_sampled(server, 11), _sampled(server, 12), _sampled(server, None)}) > 1


@pytest.mark.parametrize(("body", "status", "needle"), [
    ({"messages": []}, 400, "send at least one message"),
    ({"messages": MATH, "max_tokens": 0}, 400, "max_tokens"),
    ({"messages": MATH, "temperature": "warm"}, 400, "temperature"),
    ({"messages": MATH, "frobnicate": True}, 400, "unknown field"),
    ({"messages": [{"role": "user"}], "tools": [{}]}, 400, "tools"),
    ({"messages": MATH, "max_tokens": 100000}, 400, "lower max_tokens"),
    ({"messages": MATH, "model": "gpt-4o"}, 404, "pass model='tiny'"),
])
def test_bad_requests_get_openai_errors(served: Any, body: dict[str, Any], status: int,
                                        needle: str) -> None:
    server, _, _ = served
    body = {"model": "tiny", **body}
    resp = httpx.post(f"{server.url}/chat/completions", json=body, timeout=30)
    assert resp.status_code == status, resp.text
    error = resp.json()["error"]
    assert set(error) == {"message", "type", "param", "code"}
    assert needle in error["message"]
    assert error["type"] == "invalid_request_error"
    # the same through the official client: its typed exceptions
    kind = openai.BadRequestError if status == 400 else openai.NotFoundError
    known = {"model", "messages", "max_tokens", "temperature", "tools"}
    args = {k: v for k, v in body.items() if k in known}
    with pytest.raises(kind) as info:
        client(server).chat.completions.create(
            **args, extra_body={k: v for k, v in body.items() if k not in known})
    assert needle in str(info.value)


STRUCT_SCHEMA = {"type": "object", "properties": {"answer": {"enum": ["four", "five"]}},
                 "required": ["answer"], "additionalProperties": False}
ADD_TOOL = [{"type": "function", "function": {
    "name": "add", "description": "Add two integers", "parameters": {
        "type": "object", "properties": {"a": {"type": "integer", "minimum": 0, "maximum": 9},
                                         "b": {"type": "integer", "minimum": 0, "maximum": 9}},
        "required": ["a", "b"], "additionalProperties": False}}}]


def test_structured_output_logprobs_and_tools_with_the_openai_client(served: Any) -> None:
    pytest.importorskip("llguidance")
    server, backend, args = served
    c = client(server)
    fmt = {"type": "json_schema", "json_schema": {"name": "answer", "schema": STRUCT_SCHEMA}}
    if args:  # the engine session has no logits: refused, OpenAI-shaped
        with pytest.raises(openai.BadRequestError) as info:
            c.chat.completions.create(model="tiny", messages=MATH, max_tokens=16,
                                      response_format=fmt)  # type: ignore[arg-type]
        assert "logits" in info.value.message
        return
    reply = c.chat.completions.create(model="tiny", messages=MATH, max_tokens=32,
                                      response_format=fmt,  # type: ignore[arg-type]
                                      logprobs=True, top_logprobs=2)
    local = chat_completion(TINY_BUNDLE, MATH, backend=backend, config=_local_config(args),
                            max_tokens=32, response_format=fmt, logprobs=True, top_logprobs=2)
    choice = reply.choices[0]
    assert choice.message.content == local.choices[0].message.content
    assert json.loads(choice.message.content or "")["answer"] in ("four", "five")
    assert choice.logprobs is not None and choice.logprobs.content
    assert [i.token for i in choice.logprobs.content] == \
        [i.token for i in local.choices[0].logprobs.content]  # type: ignore[union-attr]
    assert all(len(i.top_logprobs) == 2 for i in choice.logprobs.content)
    tool_reply = c.chat.completions.create(model="tiny", messages=MATH, max_tokens=64,
                                           tools=ADD_TOOL,  # type: ignore[arg-type]
                                           tool_choice="required", parallel_tool_calls=False)
    (call,) = tool_reply.choices[0].message.tool_calls or []
    assert tool_reply.choices[0].finish_reason == "tool_calls"
    assert call.function.name == "add"  # type: ignore[union-attr]
    assert set(json.loads(call.function.arguments)) == {"a", "b"}  # type: ignore[union-attr]
    streamed = list(c.chat.completions.create(
        model="tiny", messages=MATH, max_tokens=64, tools=ADD_TOOL,  # type: ignore[arg-type]
        tool_choice="required", parallel_tool_calls=False, stream=True))
    calls = [tc for ch in streamed if ch.choices for tc in ch.choices[0].delta.tool_calls or []]
    assert [tc.function.arguments for tc in calls] == \
        [call.function.arguments]  # type: ignore[union-attr]


def test_context_overflow_has_openai_code(served: Any) -> None:
    server, _, _ = served
    with pytest.raises(openai.BadRequestError) as info:
        client(server).completions.create(model="tiny", prompt="word " * 5000, max_tokens=4)
    assert info.value.code == "context_length_exceeded"
    # and the server is fine afterwards
    assert client(server).completions.create(model="tiny", prompt="Hello", max_tokens=2)


# ------------------------------------------------------------------ llama.cpp only


@pytest.fixture(scope="module")
def server() -> Iterator[ServerProcess]:
    with ServerProcess(TINY_BUNDLE, "--sessions", "2", "--threads", "1", "--queue", "1",
                       "--grace", "1") as proc:
        yield proc


def test_transport_level_errors_are_openai_shaped(server: ServerProcess) -> None:
    resp = httpx.post(f"{server.url}/chat/completions", content=b"{not json",
                      headers={"content-type": "application/json"}, timeout=30)
    assert resp.status_code == 400 and "not valid JSON" in resp.json()["error"]["message"]
    resp = httpx.post(f"{server.url}/chat/completions", json=[1, 2], timeout=30)
    assert resp.status_code == 400 and "JSON object" in resp.json()["error"]["message"]
    resp = httpx.get(f"{server.url}/nope", timeout=30)
    assert resp.status_code == 404 and "/v1/chat/completions" in resp.json()["error"]["message"]
    resp = httpx.get(f"{server.url}/chat/completions", timeout=30)
    assert resp.status_code == 405 and resp.json()["error"]["message"]
    resp = httpx.post(f"{server.url}/completions", content=b"x" * (9 << 20), timeout=30)
    assert resp.status_code == 413


def _read_a_little_then_hang_up(server: ServerProcess, out: list[Any]) -> None:
    """Stream a long generation, read three chunks, close the connection mid-stream."""
    with httpx.stream("POST", f"{server.url}/completions", timeout=60, json={
            "model": "tiny", "prompt": "Once upon a time", "max_tokens": 1900, "stream": True,
            **LONG}) as resp:
        for line in resp.iter_lines():
            if line.startswith("data: {"):
                out.append(json.loads(line[6:]))
                if len(out) >= 3:
                    break


def test_a_disconnect_cancels_within_one_step_and_frees_the_session(
        server: ServerProcess) -> None:
    before = server.health()
    got: list[Any] = []
    _read_a_little_then_hang_up(server, got)
    t0 = time.monotonic()
    health = server.wait_idle(10)
    assert health["busy"] == 0, health
    assert time.monotonic() - t0 < 5
    assert len(got) == 3
    assert health["cancelled"] == before["cancelled"] + 1
    assert health["steps_after_cancel"][-1] <= 1, health
    assert max(s["n_past"] for s in health["slots"]) < 1900  # stopped, not run to the end
    # the session serves the next request
    again = client(server).completions.create(model="tiny", prompt="Four score and seven "
                                              "years ago", max_tokens=8)
    assert again.choices[0].text.startswith(" our fathers")


def test_past_the_queue_bound_requests_get_429(server: ServerProcess) -> None:
    results: list[Any] = []

    def long_request() -> None:  # about 3 s of generation on the tiny model
        results.append(client(server).completions.create(
            model="tiny", prompt="Once upon a time", max_tokens=1900, extra_body=LONG))

    holders = [threading.Thread(target=long_request) for _ in range(3)]  # 2 run, 1 waits
    for t in holders:
        t.start()
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline:
        health = server.health()
        if health["busy"] == 2 and health["queued"] == 1:
            break
        time.sleep(0.01)
    assert (health["busy"], health["queued"]) == (2, 1), health
    with pytest.raises(openai.RateLimitError) as info:
        client(server).completions.create(model="tiny", prompt="Hello", max_tokens=4)
    assert info.value.code == "rate_limit_exceeded"
    assert info.value.response.headers["retry-after"] == "1"
    assert "--sessions" in str(info.value)
    for t in holders:
        t.join(60)
    assert len(results) == 3  # the queued one was served too
    assert all(r.usage.completion_tokens == 1900 for r in results)
    assert server.wait_idle()["busy"] == 0


def test_a_continuing_conversation_goes_back_to_its_session(server: ServerProcess) -> None:
    c = client(server)
    other = [{"role": "user", "content": "Where do fish live?"}]
    c.chat.completions.create(model="tiny", messages=other, max_tokens=24)
    messages: list[Any] = list(MATH)
    first = c.chat.completions.create(model="tiny", messages=messages, max_tokens=24)
    c.chat.completions.create(model="tiny", messages=other, max_tokens=24)
    messages += [{"role": "assistant", "content": first.choices[0].message.content},
                 {"role": "user", "content": "And three plus three?"}]
    second = c.chat.completions.create(model="tiny", messages=messages, max_tokens=24)
    assert first.usage is not None and second.usage is not None
    cached = second.usage.prompt_tokens_details.cached_tokens  # type: ignore[union-attr]
    assert cached >= first.usage.prompt_tokens + first.usage.completion_tokens - 1
    want = chat_completion(TINY_BUNDLE, messages, max_tokens=24, config={"threads": 1})
    assert second.choices[0].message.content == want.choices[0].message.content


def test_a_prompt_asked_again_goes_back_to_the_session_that_answered_it(
        server: ServerProcess) -> None:
    """A repeated prompt (a "regenerate", a retry) is routed by the share of the request it
    covers too, not only of what the slot holds: the slot that answered it holds the prompt
    and a long reply (most of its text), and the request finds its whole prompt cached there
    instead of going to the least recently used slot."""
    c = client(server)
    asked = [{"role": "user", "content": "Name a color, then count upwards."}]
    c.chat.completions.create(model="tiny", messages=MATH, max_tokens=8)  # the LRU slot next
    first = c.chat.completions.create(model="tiny", messages=asked, max_tokens=96,
                                      extra_body=LONG)
    again = c.chat.completions.create(model="tiny", messages=asked, max_tokens=96,
                                      extra_body=LONG)
    assert first.usage is not None and again.usage is not None
    cached = again.usage.prompt_tokens_details.cached_tokens  # type: ignore[union-attr]
    assert cached == again.usage.prompt_tokens - 1
    assert again.choices[0].message.content == first.choices[0].message.content


def test_every_request_is_in_the_structured_access_log(server: ServerProcess) -> None:
    def chats() -> list[dict[str, Any]]:
        return [r for r in server.access_records() if r["path"] == "/v1/chat/completions"]

    before = len(chats())
    client(server).chat.completions.create(model="tiny", messages=MATH, max_tokens=8)
    deadline = time.monotonic() + 5
    while len(chats()) == before and time.monotonic() < deadline:
        time.sleep(0.05)
    record = chats()[-1]
    for key in ("client", "method", "duration_ms", "slot", "prompt_tokens", "cached_tokens",
                "completion_tokens", "finish", "ttft_ms", "outcome"):
        assert key in record, record
    assert record["status"] == 200 and record["outcome"] == "ok"
    assert record["completion_tokens"] == 8 and record["finish"] == "length"
    assert record["level"] == "INFO" and record["time"].endswith("Z")


def test_ctrl_c_ends_running_streams_cleanly_and_exits_0() -> None:
    with ServerProcess(TINY_BUNDLE, "--threads", "1", "--grace", "0.5") as proc:
        events: list[Any] = []
        error: list[BaseException] = []

        def stream_long() -> None:
            try:
                for chunk in client(proc).completions.create(
                        model="tiny", prompt="Once upon a time", max_tokens=1900, stream=True,
                        extra_body=LONG):
                    events.append(chunk)
            except openai.APIError as exc:
                error.append(exc)

        t = threading.Thread(target=stream_long)
        t.start()
        deadline = time.monotonic() + 30
        while len(events) < 3 and time.monotonic() < deadline:
            time.sleep(0.01)
        t0 = time.monotonic()
        status = proc.stop(30)
        t.join(30)
        assert status == 0, "".join(proc.stderr[-20:])
        assert time.monotonic() - t0 < 15
        assert proc.stdout[-1].strip() == "eliza-backends serve: stopped"
        # the stream ended with an error event the client understood (or finished first)
        finished = events and events[-1].choices and events[-1].choices[0].finish_reason
        assert finished or (error and "shutting down" in str(error[0])), (error, events[-3:])
