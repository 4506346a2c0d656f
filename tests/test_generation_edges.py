"""Generation edges a hostile client reaches (issue 32), on the real runtimes: tiny
temperatures are greedy on every backend (below ``GREEDY_TEMPERATURE``), every sampling
setting the API accepts draws only tokens the reference chain keeps, stop strings cut
logprobs where they cut text, a Stream refuses a second open completion, and closing a
context under a thread that keeps opening streams on it ends that thread's calls with typed
errors (no hang)."""

from __future__ import annotations

import importlib.util
import json
import math
import subprocess
import sys
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from conftest import TINY_BUNDLE
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from eliza_backends import (
    InferenceContext,
    SessionBusyError,
    StreamConfig,
    completion,
    open_stream,
)
from eliza_backends.config import GREEDY_TEMPERATURE
from eliza_backends.openai.types import ChatCompletionRequest, parse_request
from eliza_backends.serving import session_config

BACKENDS = [
    pytest.param("llama.cpp", {}, "llama_cpp", id="llama.cpp"),
    pytest.param("litert-lm", {"litert-lm": {"session": "interpreter"}}, "ai_edge_litert",
                 id="litert"),
    pytest.param("mlx", {}, "mlx_lm", id="mlx"),
]
PROMPT = "the quick brown fox"
TINY_TEMPERATURES = [1e-45, 1e-300, 5e-324, 1e-6, 9.99e-6]


def _needs(module: str) -> None:
    if importlib.util.find_spec(module) is None:
        pytest.skip(f"{module} is not installed")


def _generate(ctx: InferenceContext, backend: str, options: dict[str, Any],
              config: StreamConfig, n: int = 10) -> list[Any]:
    """The steps of ``n`` tokens from PROMPT (logprobs in them when the config asks)."""
    with open_stream(ctx, config, backend=backend, options=options) as s:
        s.prefill(PROMPT)
        steps = []
        while len(steps) < n:
            step = s.next(1)
            steps.append(step)
            if step.final:
                break
        return steps


@pytest.mark.parametrize(("backend", "options", "module"), BACKENDS)
def test_tiny_temperatures_decode_greedily_on_every_backend(
        backend: str, options: dict[str, Any], module: str) -> None:
    _needs(module)
    base = {"threads": 1, "max_tokens": 12, "ignore_eos": True, "context_size": 256,
            "batch_size": 64, "seed": 7}
    with InferenceContext(TINY_BUNDLE) as ctx:
        greedy = [t for step in _generate(ctx, backend, options, StreamConfig(**base), 12)
                  for t in step.tokens]
        for temperature in TINY_TEMPERATURES:
            config = StreamConfig(**base, temperature=temperature, top_k=40, top_p=0.95)
            assert config.greedy
            got = [t for step in _generate(ctx, backend, options, config, 12)
                   for t in step.tokens]
            assert got == greedy, (temperature, got, greedy)
        # just above the threshold 1/T is huge: still the argmax on this model, no junk
        config = StreamConfig(**base, temperature=GREEDY_TEMPERATURE)
        assert not config.greedy
        got = [t for step in _generate(ctx, backend, options, config, 12) for t in step.tokens]
        assert got == greedy


def test_the_threshold_is_applied_once_in_the_config() -> None:
    assert StreamConfig(temperature=GREEDY_TEMPERATURE * 0.999).greedy
    assert not StreamConfig(temperature=GREEDY_TEMPERATURE).greedy
    request = parse_request(ChatCompletionRequest, {"messages": [{"role": "user", "content": ""}],
                                                    "temperature": 1e-300})
    assert session_config(StreamConfig(), request).greedy


@st.composite
def _api_sampling(draw: st.DrawFn) -> dict[str, Any]:
    """Sampling fields of a chat request, as a client may send them (tiny temperatures too);
    top_k 1..20 so that the reference's kept set lies within the 20 recorded alternatives."""
    temperature = draw(st.one_of(st.sampled_from([0.0, *TINY_TEMPERATURES, GREEDY_TEMPERATURE,
                                                  1e-4, 0.01]),
                                 st.floats(0.0, 2.0, allow_nan=False)))
    fields: dict[str, Any] = {"temperature": temperature, "top_k": draw(st.integers(1, 20)),
                              "seed": draw(st.integers(0, (1 << 32) - 1))}
    if draw(st.booleans()):
        fields["top_p"] = draw(st.floats(0.05, 1.0))
    if draw(st.booleans()):
        fields["min_p"] = draw(st.floats(0.0, 0.5))
    return fields


def _check_token(entry: Any, config: StreamConfig) -> None:
    """``entry`` (a generated token's logprob with its 20 best alternatives, untempered) is a
    token the reference chain (top-k, then top-p and min-p over the top-k renormalised, then
    temperature) may draw; under greedy, the argmax."""
    top = sorted(entry.top, key=lambda t: -t.logprob)
    assert math.isfinite(entry.logprob)
    best = top[0].logprob
    if config.greedy:
        assert entry.logprob >= best - 1e-4, (entry, top[:3])
        return
    gap = best - top[1].logprob
    if gap / config.temperature > 50:  # the reference draws another token with p < 2e-22
        assert entry.logprob >= best - 1e-4, (config.temperature, entry, top[:3])
    above = [t for t in top if t.logprob > entry.logprob + 1e-5]
    assert len(above) < config.top_k, (len(above), config.top_k)
    kept = top[:config.top_k]
    norm = math.log(sum(math.exp(t.logprob - best) for t in kept)) + best
    mass_above = sum(math.exp(t.logprob - norm) for t in above)
    assert mass_above < config.top_p + 1e-4, (mass_above, config.top_p)
    assert entry.logprob - best >= math.log(max(config.min_p, 1e-300)) - 1e-4, \
        (entry.logprob, best, config.min_p)


@pytest.mark.parametrize(("backend", "options", "module"), BACKENDS[:2])
def test_every_accepted_sampling_setting_draws_what_the_reference_keeps(
        backend: str, options: dict[str, Any], module: str) -> None:
    _needs(module)
    ctx = InferenceContext(TINY_BUNDLE)
    base = StreamConfig(threads=1, max_tokens=8, ignore_eos=True, context_size=256,
                        batch_size=64, logprobs=True, top_logprobs=20)

    @settings(max_examples=15, deadline=None, derandomize=True, database=None,
              suppress_health_check=list(HealthCheck))
    @given(_api_sampling())
    def check(fields: dict[str, Any]) -> None:
        request = parse_request(ChatCompletionRequest, {
            "messages": [{"role": "user", "content": "hi"}], **fields})
        config = session_config(base, request)
        for step in _generate(ctx, backend, options, config, 6):
            assert step.logprobs is not None and len(step.logprobs) == len(step.tokens)
            for entry in step.logprobs:
                _check_token(entry, config)

    try:
        check()
    finally:
        ctx.close()


# --------------------------------------------------------------------------- stop + logprobs


@pytest.fixture(scope="module")
def stream() -> Iterator[Any]:
    with open_stream(TINY_BUNDLE, backend="llama.cpp", threads=1, context_size=512) as s:
        yield s


def test_stop_strings_cut_logprobs_where_they_cut_text(stream: Any) -> None:
    prompt = "Four score and seven years ago"
    full = completion(stream, prompt, max_tokens=24, logprobs=0)
    text = full.choices[0].text
    tokens = full.choices[0].logprobs.tokens
    assert "".join(tokens) == text
    bounds = {sum(len(t) for t in tokens[:i]) for i in range(len(tokens) + 1)}
    cases = 0
    for k in range(1, len(text) - 2):
        stop = text[k:k + 3]
        if text.find(stop) != k or not stop.strip():
            continue
        cases += 1
        for streamed in (False, True):
            if streamed:
                chunks = list(completion(stream, prompt, max_tokens=24, logprobs=0, stop=[stop],
                                         stream=True))
                got = "".join(c.choices[0].text for c in chunks if c.choices)
                lp = [t for c in chunks if c.choices and c.choices[0].logprobs
                      for t in c.choices[0].logprobs.tokens]
            else:
                reply = completion(stream, prompt, max_tokens=24, logprobs=0, stop=[stop])
                got, lp = reply.choices[0].text, reply.choices[0].logprobs.tokens
            assert got == text[:k], (stop, got)
            joined = "".join(lp)
            assert got.startswith(joined) and stop not in joined, (stop, got, lp)
            if k in bounds:
                assert joined == got, (stop, got, lp)
    assert cases >= 10


# --------------------------------------------------------------------------- one generation


def test_a_stream_refuses_a_second_completion_while_one_is_open(stream: Any) -> None:
    solo = completion(stream, "Once upon a time", max_tokens=20).choices[0].text
    first = completion(stream, "Once upon a time", max_tokens=20, stream=True)
    head = next(first).choices[0].text
    with pytest.raises(SessionBusyError):
        completion(stream, "Another prompt entirely", max_tokens=5)
    with pytest.raises(SessionBusyError):
        list(completion(stream, "Another prompt entirely", max_tokens=5, stream=True))
    errors: list[BaseException] = []

    def other_thread() -> None:
        try:
            completion(stream, "Another prompt entirely", max_tokens=5)
        except BaseException as exc:
            errors.append(exc)

    t = threading.Thread(target=other_thread)
    t.start()
    t.join(60)
    assert errors and isinstance(errors[0], SessionBusyError), errors
    rest = "".join(c.choices[0].text for c in first)
    assert head + rest == solo
    # over: the stream serves the next completion; an iterator closed early frees it too
    early = completion(stream, "Once upon a time", max_tokens=20, stream=True)
    next(early)
    early.close()
    assert completion(stream, "Once upon a time", max_tokens=20).choices[0].text == solo


# --------------------------------------------------------------------------- close vs opens

DRIVER = r"""
import json, random, sys, threading, time
from eliza_backends import InferenceContext, SessionClosedError, open_stream
from eliza_backends.errors import ElizaError
bundle, trials, seed = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
rng = random.Random(seed)
outcomes, unexpected = {}, []
for trial in range(trials):
    ctx = InferenceContext(bundle)
    def worker():
        while True:
            try:
                s = open_stream(ctx, backend="llama.cpp", threads=rng.choice([1, 2]),
                                max_tokens=64, ignore_eos=True, context_size=256,
                                batch_size=rng.choice([8, 64]))
            except ElizaError as e:
                outcomes[type(e).__name__] = outcomes.get(type(e).__name__, 0) + 1
                if not isinstance(e, SessionClosedError):
                    unexpected.append(repr(e))
                return
            try:
                s.prefill("the quick brown fox jumps over the lazy dog " * rng.randint(1, 4))
                for _ in range(rng.randint(0, 4)):
                    s.next(rng.randint(1, 8))
                outcomes["ok"] = outcomes.get("ok", 0) + 1
            except ElizaError as e:
                outcomes[type(e).__name__] = outcomes.get(type(e).__name__, 0) + 1
                if not isinstance(e, SessionClosedError):  # (nobody calls cancel())
                    unexpected.append(repr(e))
            finally:
                s.close()
    t = threading.Thread(target=worker, daemon=True)
    t.start()
    time.sleep(rng.uniform(0.0, 0.15))
    ctx.close()
    t.join(20)
    if t.is_alive():
        print(json.dumps({"hang": trial, "outcomes": outcomes}), flush=True)
        import os; os._exit(3)
print(json.dumps({"trials": trials, "outcomes": outcomes, "unexpected": unexpected}))
"""


def test_closing_a_context_under_a_thread_that_keeps_opening_streams_never_hangs(
        tmp_path: Path) -> None:
    proc = subprocess.run([sys.executable, "-c", DRIVER, str(TINY_BUNDLE), "40", "32"],
                          capture_output=True, text=True, timeout=240)
    assert proc.returncode == 0, (proc.stdout, proc.stderr[-2000:])
    report = json.loads(proc.stdout.strip().splitlines()[-1])
    assert report["unexpected"] == [], report
    assert report["outcomes"].get("SessionClosedError", 0) >= 20, report
