"""The load test on a batched server: 12 streaming clients send test_openai_load's fixed 48
requests to `serve --parallel 4` while 4 more clients keep opening streams and hanging up after
two chunks. Every finished response must equal the same request served alone (greedy), or leave
it only at a near-tie of the solo logits (llama.cpp's batched kernels round differently:
tests/near_ties.py); no response may carry another's tokens; the hang-ups must free their
sequences; and no client may starve while new streams keep arriving."""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator
from typing import Any

import openai
import pytest
from conftest import TINY_BUNDLE
from near_ties import assert_same_or_near_tie
from server_process import ServerProcess
from test_openai_load import CLIENTS, PER_CLIENT, requests_of, run_client

from eliza_backends import InferenceContext, chat_completion, completion

HANG_UPS = 4
#: A request that waits longer than this for its reply starves: the scheduler is FIFO, so even
#: on a loaded 2-core machine every one of the 48 requests finishes well inside it.
STARVED_S = 240.0


@pytest.fixture(scope="module", params=["llama.cpp", "mlx"])
def served(request: pytest.FixtureRequest) -> Iterator[tuple[ServerProcess, str]]:
    if request.param == "mlx":
        pytest.importorskip("mlx_lm")
    with ServerProcess(TINY_BUNDLE, "--backend", request.param, "--parallel", "4",
                       "--threads", "1", "--queue", str(CLIENTS + HANG_UPS)) as proc:
        yield proc, request.param


def hang_up_repeatedly(server: ServerProcess, stop: threading.Event, count: list[int],
                       errors: list[BaseException]) -> None:
    """Open a long stream, read two chunks, close it; again until ``stop``."""
    api = openai.OpenAI(base_url=server.url, api_key="unused", max_retries=0, timeout=120)
    try:
        while not stop.is_set():
            stream = api.chat.completions.create(
                model="tiny", messages=[{"role": "user", "content": "Tell me a long story."}],
                max_tokens=200, stream=True)
            for n, _chunk in enumerate(stream):
                if n == 1:
                    break
            stream.close()
            count[0] += 1
    except BaseException as exc:  # reported by the test
        errors.append(exc)


def solo_reply(ctx: InferenceContext, req: dict[str, Any], prompt: Any, backend: str) -> str:
    if req["kind"] == "chat":
        reply = chat_completion(ctx, prompt, max_tokens=req["max_tokens"], backend=backend,
                                config={"threads": 1})
        return reply.choices[0].message.content or ""
    text = completion(ctx, prompt, max_tokens=req["max_tokens"], stop=req["stop"],
                      backend=backend, config={"threads": 1})
    return text.choices[0].text


@pytest.mark.slow
def test_batched_streams_with_hang_ups_equal_the_requests_run_alone(
        served: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    server, backend = served
    out: dict[int, list[Any]] = {}
    errors: list[BaseException] = []
    stop = threading.Event()
    hung_up = [0]
    hangers = [threading.Thread(target=hang_up_repeatedly, args=(server, stop, hung_up, errors))
               for _ in range(HANG_UPS)]
    clients = [threading.Thread(target=run_client, args=(server, c, out, errors))
               for c in range(CLIENTS)]
    started = time.monotonic()
    for t in hangers + clients:
        t.start()
    for t in clients:
        t.join(STARVED_S)
    waited = time.monotonic() - started
    stop.set()
    for t in hangers:
        t.join(120)
    assert not any(t.is_alive() for t in clients), f"a client starved ({STARVED_S} s)"
    assert not any(t.is_alive() for t in hangers), "a hang-up client did not finish"
    assert not errors, errors
    assert hung_up[0] >= HANG_UPS, hung_up  # the hang-ups ran alongside the whole time
    print(f"{backend}: 48 requests in {waited:.1f} s beside {hung_up[0]} hang-ups")

    health = server.wait_idle()
    assert health["busy"] == 0
    health = server.health()
    assert health["batched"] is True and health["parallel"] == 4
    assert health["active_sequences"] == 0  # every hang-up freed its sequence
    assert health["failed"] == 0

    monkeypatch.setenv("ELIZA_LLM_BACKEND", backend)  # the near-tie check's solo logprobs too
    prompts, got, want = [], [], []
    with InferenceContext(TINY_BUNDLE) as ctx:
        for client in range(CLIENTS):
            for req, (prompt, text, chunks) in zip(requests_of(client), out[client],
                                                   strict=True):
                assert len({c.id for c in chunks}) == 1  # one response, never mixed
                usage = chunks[-1].usage
                assert usage is not None and usage.completion_tokens <= req["max_tokens"]
                prompts.append(prompt)
                got.append(text)
                want.append(solo_reply(ctx, req, prompt, backend))
        assert len(got) == CLIENTS * PER_CLIENT
        # a continued conversation carries the batched first reply, so its solo reference is
        # computed on exactly that history: every difference is a near-tie of the solo logits
        flipped = assert_same_or_near_tie(ctx, prompts, got, want, max_tokens=56,
                                          config={"threads": 1})
    print(f"{backend}: {len(flipped)} of {len(got)} replies left the solo reply at a near-tie")
