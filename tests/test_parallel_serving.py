"""``eliza-backends serve --parallel N`` on the tiny bundle, a real server over loopback: every
one of 8 concurrent streaming clients gets exactly the reply it gets alone (greedy); a client
that hangs up mid-stream frees its slot within one step; ``/health`` shows the batching, active
sequences, queued requests and tokens/s; a backend that does not batch runs independent
sessions and says so; ``--parallel`` is validated with the other arguments. (Batched, a reply
may leave the solo one only at a near-tie: see near_ties.py.)"""

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
from near_ties import assert_same_or_near_tie
from server_process import ServerProcess

from eliza_backends import InferenceContext, chat_completion, completion, open_stream
from eliza_backends.batch import DEFAULT_PARALLEL
from eliza_backends.cli import main

QUESTIONS = ["What is two plus two?", "Where do fish live?", "What is four plus four?",
             "Hello", "Why is the sky blue?", "Tell me about the river."]
TEXTS = ["Once upon a time", "The river does not hurry", "In summer the garden is"]
LOCAL: dict[str, Any] = {"threads": 1}


def _llama_batches() -> bool:
    """Whether llama.cpp batches sessions that share a parallel context."""
    with InferenceContext(TINY_BUNDLE, parallel=2) as context, \
            open_stream(context, LOCAL, backend="llama.cpp") as stream:
        return stream.session.capabilities.batched


@pytest.fixture(scope="module")
def server() -> Iterator[ServerProcess]:
    # the steps shared by several sequences (batch_invariant=false) are what this file checks
    with ServerProcess(TINY_BUNDLE, "--backend", "llama.cpp", "--parallel", "4", "--threads",
                       "1", "--queue", "16", "--grace", "1",
                       "--option", "llama.cpp:batch_invariant=false") as proc:
        yield proc


def test_health_shows_the_batching_and_the_load(server: ServerProcess) -> None:
    health = server.health()
    assert health["sessions"] == 4 and health["parallel"] == 4
    assert health["active_sequences"] == 0 and health["queued"] == 0
    assert {"tokens_per_second", "tokens_window_s", "completion_tokens"} <= set(health)
    assert health["batched"] == _llama_batches()
    if health["batched"]:
        assert "continuous batching: 4 sequences share one llama.cpp context" in \
            health["batching"]
        assert health["batch"] is not None and health["batch"]["failed"] == 0
    else:  # never silently different: the line says the sessions are independent
        assert "llama.cpp does not batch: parallel 4 runs 4 independent sessions" in \
            health["batching"]
    assert health["batching"] in server.announcement


def _one_client(server: ServerProcess, i: int, out: dict[int, tuple[str, int]],
                errors: list[BaseException]) -> None:
    api = openai.OpenAI(base_url=server.url, api_key="unused", max_retries=0, timeout=120)
    try:
        if i % 3 == 2:
            chunks = list(api.completions.create(
                model="tiny", prompt=TEXTS[i % len(TEXTS)], max_tokens=20 + i, stream=True,
                stream_options={"include_usage": True}))
            text = "".join(c.choices[0].text for c in chunks if c.choices)
        else:
            chunks = list(api.chat.completions.create(
                model="tiny", messages=[{"role": "user", "content": QUESTIONS[i % 6]}],
                max_tokens=20 + i, stream=True, stream_options={"include_usage": True}))
            text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
        usage = chunks[-1].usage
        assert usage is not None
        out[i] = (text, usage.completion_tokens)
    except BaseException as exc:  # reported by the test
        errors.append(exc)


def _alone(i: int) -> str:
    if i % 3 == 2:
        return completion(TINY_BUNDLE, TEXTS[i % len(TEXTS)], max_tokens=20 + i,
                          backend="llama.cpp", config=LOCAL).choices[0].text
    reply = chat_completion(TINY_BUNDLE, [{"role": "user", "content": QUESTIONS[i % 6]}],
                            max_tokens=20 + i, backend="llama.cpp", config=LOCAL)
    return reply.choices[0].message.content or ""


def test_eight_concurrent_clients_each_get_their_reply_alone(server: ServerProcess) -> None:
    before = server.health()
    out: dict[int, tuple[str, int]] = {}
    errors: list[BaseException] = []
    clients = [threading.Thread(target=_one_client, args=(server, i, out, errors))
               for i in range(8)]
    seen: list[dict[str, Any]] = []
    for t in clients:
        t.start()
    while any(t.is_alive() for t in clients):
        seen.append(server.health())
        time.sleep(0.01)
    for t in clients:
        t.join()
    assert not errors, errors
    assert sorted(out) == list(range(8))
    prompts: list[Any] = [TEXTS[i % len(TEXTS)] if i % 3 == 2 else
                          [{"role": "user", "content": QUESTIONS[i % 6]}] for i in range(8)]
    for i in range(8):  # (each its own budget)
        assert_same_or_near_tie(TINY_BUNDLE, [prompts[i]], [out[i][0]], [_alone(i)],
                                max_tokens=20 + i, config=LOCAL, at_most=1)
    assert max(h["active_sequences"] for h in seen) <= 4
    assert all(h["active_sequences"] == h["busy"] for h in seen)
    after = server.wait_idle()
    generated = sum(n for _, n in out.values())
    assert after["completion_tokens"] - before["completion_tokens"] == generated
    assert after["tokens_per_second"] > 0 and after["active_sequences"] == 0
    assert after["served"] - before["served"] == 8
    if after["batched"]:  # the steps really carried several sequences
        steps = after["batch"]["steps"] - before["batch"]["steps"]
        tokens = after["batch"]["tokens"] - before["batch"]["tokens"]
        assert steps > 0 and tokens / steps > 1.5, after["batch"]
        assert after["batch"]["mean_sequences_per_step"] > 1
        assert after["batch"]["resubmit_lag_ms_p50"] is not None


def test_a_client_that_hangs_up_frees_its_slot(server: ServerProcess) -> None:
    before = server.wait_idle()
    got = []
    with httpx.stream("POST", f"{server.url}/completions", timeout=60, json={
            "model": "tiny", "prompt": "Once upon a time", "max_tokens": 200, "stream": True,
            "ignore_eos": True}) as resp:
        for line in resp.iter_lines():
            if line.startswith("data: {"):
                got.append(json.loads(line[6:]))
                if len(got) >= 3:
                    break
    health = server.wait_idle(10)
    assert health["busy"] == 0 and health["active_sequences"] == 0, health
    assert health["cancelled"] == before["cancelled"] + 1
    assert health["steps_after_cancel"][-1] <= 1, health
    again = openai.OpenAI(base_url=server.url, api_key="unused", max_retries=0).completions.create(
        model="tiny", prompt="Four score and seven years ago", max_tokens=8)
    assert again.choices[0].text == completion(
        TINY_BUNDLE, "Four score and seven years ago", max_tokens=8, backend="llama.cpp",
        config=LOCAL).choices[0].text


def test_without_parallel_or_sessions_the_default_follows_the_backend() -> None:
    with ServerProcess(TINY_BUNDLE, "--backend", "llama.cpp", "--threads", "1") as proc:
        health = proc.health()
    want = DEFAULT_PARALLEL if _llama_batches() else 1
    assert health["sessions"] == want and health["parallel"] == want
    assert health["queued"] == 0


@pytest.mark.skipif(importlib.util.find_spec("ai_edge_litert") is None,
                    reason="ai_edge_litert is not installed")
def test_litert_falls_back_to_independent_sessions_and_says_so() -> None:
    with ServerProcess(TINY_BUNDLE, "--backend", "litert-lm", "--parallel", "2",
                       "--threads", "1") as proc:
        health = proc.health()
        reply = openai.OpenAI(base_url=proc.url, api_key="unused").completions.create(
            model="tiny", prompt="Once upon a time", max_tokens=8)
        logged = [json.loads(line) for line in proc.stderr if line.startswith("{")]
    assert health["batched"] is False and health["parallel"] == 2 and health["sessions"] == 2
    assert health["batch"] is None
    assert "litert-lm does not batch: parallel 2 runs 2 independent sessions" in \
        health["batching"]
    assert any(r["level"] == "WARNING" and "does not batch" in r["message"] for r in logged)
    assert reply.choices[0].text == completion(
        TINY_BUNDLE, "Once upon a time", max_tokens=8, backend="litert-lm",
        config=LOCAL).choices[0].text


@pytest.mark.parametrize("argv, message", [
    (["--parallel", "2", "--sessions", "2"], "give one of them"),
    (["--parallel", "0"], "--parallel"),
    (["--parallel", "abc"], "--parallel"),
    (["--parallel", "2000"], "--parallel"),
])
def test_parallel_is_checked_before_anything_loads(
        argv: list[str], message: str, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["serve", str(TINY_BUNDLE), *argv]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "ELIZA_ERR_INVALID_ARG" in err[0] and message in err[0], err


def test_the_help_states_the_default_parallel(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit):
        main(["serve", "--help"])
    assert f"default: {DEFAULT_PARALLEL} on a batching backend" in \
        " ".join(capsys.readouterr().out.split())
