"""A bounded load test: 12 concurrent streaming clients send a fixed 48 requests per round
(chat and text, different budgets and stop strings, conversations that continue) to a server
with 4 sessions. Every response must equal the same request run alone in process (greedy):
no lost, mixed or reordered tokens. Three rounds; the server's memory must be flat after the
first."""

from __future__ import annotations

import threading
from collections.abc import Iterator
from typing import Any

import openai
import pytest
from conftest import TINY_BUNDLE
from server_process import ServerProcess, backend_params

from eliza_backends import InferenceContext, chat_completion, completion

CLIENTS = 12
PER_CLIENT = 4
QUESTIONS = ["What is two plus two?", "Where do fish live?", "What is four plus four?",
             "Name the colors of the flag.", "Hello", "Tell me about the river.",
             "What does the baker do?", "Why is the sky blue?"]
TEXTS = ["Four score and seven years ago", "We hold these truths to be self-evident,",
         "In summer the garden is", "The river does not hurry", "Once upon a time",
         "Every morning before the sun came up, the baker"]


def requests_of(client: int) -> list[dict[str, Any]]:
    """The fixed requests one client sends, in order (turn 2 of a conversation continues
    turn 1, whose reply the client fills in)."""
    out: list[dict[str, Any]] = []
    for k in range(PER_CLIENT):
        i = client * PER_CLIENT + k
        if i % 3 == 2:
            out.append({"kind": "text", "prompt": TEXTS[i % len(TEXTS)],
                        "max_tokens": 8 + i % 24, "stop": ["the"] if i % 2 else None})
        elif k % 2 == 1 and out and out[-1]["kind"] == "chat":
            out.append({"kind": "chat", "continues": True, "question": "And then?",
                        "max_tokens": 24})
        else:
            out.append({"kind": "chat", "question": QUESTIONS[i % len(QUESTIONS)],
                        "max_tokens": 16 + i % 32})
    return out


def messages_for(req: dict[str, Any], previous: list[dict[str, str]]) -> list[dict[str, str]]:
    if req.get("continues"):
        return [*previous, {"role": "user", "content": req["question"]}]
    return [{"role": "user", "content": req["question"]}]


def run_client(server: ServerProcess, client: int, out: dict[int, list[Any]],
               errors: list[BaseException]) -> None:
    api = openai.OpenAI(base_url=server.url, api_key="unused", max_retries=0, timeout=120)
    conversation: list[dict[str, str]] = []
    results = []
    try:
        for req in requests_of(client):
            if req["kind"] == "chat":
                messages = messages_for(req, conversation)
                chunks = list(api.chat.completions.create(
                    model="tiny", messages=messages, max_tokens=req["max_tokens"], stream=True,
                    stream_options={"include_usage": True}))
                text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
                conversation = [*messages, {"role": "assistant", "content": text}]
                results.append((messages, text, chunks))
            else:
                chunks = list(api.completions.create(
                    model="tiny", prompt=req["prompt"], max_tokens=req["max_tokens"],
                    stop=req["stop"], stream=True, stream_options={"include_usage": True}))
                text = "".join(c.choices[0].text for c in chunks if c.choices)
                results.append((req["prompt"], text, chunks))
        out[client] = results
    except BaseException as exc:  # reported by the test
        errors.append(exc)


@pytest.fixture(scope="module", params=backend_params())
def served(request: pytest.FixtureRequest) -> Iterator[tuple[ServerProcess, str]]:
    with ServerProcess(TINY_BUNDLE, "--backend", request.param, "--sessions", "4",
                       "--threads", "1", "--queue", str(CLIENTS)) as proc:
        yield proc, request.param


def one_round(server: ServerProcess) -> dict[int, list[Any]]:
    out: dict[int, list[Any]] = {}
    errors: list[BaseException] = []
    threads = [threading.Thread(target=run_client, args=(server, c, out, errors))
               for c in range(CLIENTS)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(300)
    assert not any(t.is_alive() for t in threads), "a client did not finish"
    assert not errors, errors
    return out


@pytest.mark.slow
def test_concurrent_streams_equal_the_requests_run_alone(served: Any) -> None:
    server, backend = served
    rounds = []
    rss = []
    for _ in range(3):
        rounds.append(one_round(server))
        rss.append(server.rss_bytes())
    assert server.wait_idle()["busy"] == 0
    health = server.health()
    assert health["served"] >= 3 * CLIENTS * PER_CLIENT and health["failed"] == 0
    checked = 0
    with InferenceContext(TINY_BUNDLE) as ctx:
        for client in range(CLIENTS):
            pairs = zip(requests_of(client), rounds[0][client], strict=True)
            for k, (req, (prompt, text, chunks)) in enumerate(pairs):
                if req["kind"] == "chat":
                    alone = chat_completion(ctx, prompt, max_tokens=req["max_tokens"],
                                            backend=backend, config={"threads": 1})
                    want = alone.choices[0].message.content
                else:
                    alone = completion(ctx, prompt, max_tokens=req["max_tokens"],
                                       stop=req["stop"], backend=backend,
                                       config={"threads": 1})
                    want = alone.choices[0].text
                assert text == want, (client, req)
                assert len({c.id for c in chunks}) == 1  # one response, not mixed with others
                usage = chunks[-1].usage
                assert usage is not None
                assert usage.completion_tokens == alone.usage.completion_tokens, (client, req)
                finish = [c.choices[0].finish_reason for c in chunks if c.choices][-1]
                assert finish == alone.choices[0].finish_reason
                # every round gave the same answers
                assert all(later[client][k][1] == text for later in rounds[1:])
                checked += 1
    assert checked == CLIENTS * PER_CLIENT
    # memory flat after the first round (sessions and model are allocated once)
    print("server RSS per round, MiB:", [round(r / 2**20, 1) for r in rss])
    growth = rss[2] - rss[0]
    assert growth < 24 << 20, [r >> 20 for r in rss]
