"""One contract under hostile inputs (issue 41), the quick checks: the step scheduler's isolation
when a share's callback raises, tool-call arguments that stay JSON whatever number the model
writes, Gemma 4 string arguments kept whole, ``generate_batch``'s inputs, ``batch_size`` below
``parallel``, and stop strings that end inside a token with ``logprobs``.

The scheduler is driven through its stable API (``decode`` is any callable over the pieces);
the rest runs the real runtimes on the tiny bundle. The sampling matrix (repeat penalty x
drafter x backend, seeded sampling under batching) is tests/test_sampling_contract.py (full
tier)."""

from __future__ import annotations

import importlib.util
import json
import math
import subprocess
import sys
import threading
from collections.abc import Callable, Sequence
from typing import Any

import pytest
from conftest import TINY_BUNDLE

from eliza_backends import (
    CancelledError,
    InferenceContext,
    InvalidArgumentError,
    chat_completion,
    completion,
    generate_batch,
    open_stream,
)
from eliza_backends.openai.gemma4_calls import parse_gemma4_reply
from eliza_backends.openai.tools import parse_reply
from eliza_backends.runtime.batching import Piece, StepScheduler

# --------------------------------------------------------------------------- step scheduler


class _Probe(Exception):
    """A plugin's callback failing (an ordinary exception)."""


class _Fatal(BaseException):
    """A plugin's callback failing with a BaseException (as KeyboardInterrupt would)."""


def _scheduler(log: list[list[Piece]] | None = None, max_tokens: int = 8) -> StepScheduler:
    """A scheduler whose decode records each step's pieces."""
    def decode(pieces: Sequence[Piece]) -> None:
        if log is not None:
            log.append(list(pieces))

    return StepScheduler(decode, max_tokens, gather_window=0.05)


def _raising(kind: type[BaseException], after: int = 0) -> Callable[[], bool]:
    """A ``cancelled`` probe that returns False ``after`` times, then raises ``kind``."""
    calls = {"n": 0}

    def probe() -> bool:
        calls["n"] += 1
        if calls["n"] > after:
            raise kind("probe failed")
        return False

    return probe


@pytest.mark.parametrize("kind", [_Probe, _Fatal, CancelledError])
@pytest.mark.parametrize("after", [0, 1])
def test_a_raising_cancelled_probe_fails_its_own_share_and_frees_the_sequence(
        kind: type[BaseException], after: int) -> None:
    """The leader's own share: its submit raises the probe's exception, the share is not left
    queued (the sequence submits again), and the failure is counted."""
    sched = _scheduler(max_tokens=4)
    with pytest.raises(kind, match="probe failed"):
        # 10 tokens in pieces of 4: the probe is asked again at each step boundary
        sched.submit("a", list(range(10)), 0, 1, lambda p: p.last_row, _raising(kind, after))
    assert sched.queued == 0
    assert sched.submit("a", [1], 10, 1, lambda p: "again") == "again"
    assert sched.stats().failed == 1


@pytest.mark.parametrize("callback", ["cancelled", "on_done"])
@pytest.mark.parametrize("kind", [_Probe, _Fatal])
def test_a_raising_callback_of_one_sequence_leaves_the_others(callback: str,
                                                              kind: type[BaseException]) -> None:
    """Four sequences submit together, one of them with a callback that raises: only that
    sequence's submit raises; the others get their own results, whichever thread leads."""
    log: list[list[Piece]] = []
    sched = _scheduler(log)
    together = threading.Barrier(4)
    results: dict[str, Any] = {}

    def run(seq: str) -> None:
        bad = seq == "c"

        def on_done(piece: Piece) -> str:
            if bad and callback == "on_done":
                raise kind("on_done failed")
            return f"{seq}:{piece.start}"

        probe = _raising(kind) if bad and callback == "cancelled" else None
        together.wait(timeout=10)
        for step in range(3):
            try:
                results[f"{seq}{step}"] = sched.submit(seq, [step], step, 1, on_done, probe)
            except BaseException as exc:  # what the submitter got
                results[f"{seq}{step}"] = exc

    threads = [threading.Thread(target=run, args=(s,), daemon=True) for s in "abcd"]
    for t in threads:
        t.start()
    for t in threads:
        t.join(30)
    assert not any(t.is_alive() for t in threads), "a submitter hung"
    for seq in "abd":
        assert [results[f"{seq}{i}"] for i in range(3)] == [f"{seq}:{i}" for i in range(3)]
    assert all(isinstance(results[f"c{i}"], kind) for i in range(3)), results
    assert sched.queued == 0
    stats = sched.stats()
    assert stats.failed == 3 and stats.shares == 9


def test_a_share_cancelled_by_its_probe_is_still_a_cancel() -> None:
    sched = _scheduler()
    with pytest.raises(CancelledError):
        sched.submit("a", [1, 2], 0, 1, lambda p: None, lambda: True)
    assert sched.stats().cancelled == 1 and sched.stats().failed == 0
    assert sched.submit("a", [1], 0, 1, lambda p: 7) == 7


# --------------------------------------------------------------------------- tool-call arguments

HUGE = "9" * 5000  # past Python's 4,300-digit int conversion limit
NUMBERS = ["1e999", "-1e999", "1E+400", "1e-999", HUGE, "-" + HUGE, HUGE + ".5",
           "0." + "1" * 5000, "123456789012345678901234567890", "0", "-0", "2.50", "1e5"]


def _valid_json(text: str) -> Any:
    """``text`` parsed as strict JSON (no NaN/Infinity), with every number's literal."""
    def refuse(name: str) -> Any:
        raise AssertionError(f"{name} is not JSON")

    return json.loads(text, parse_constant=refuse, parse_int=str, parse_float=str)


@pytest.mark.parametrize("number", NUMBERS)
def test_json_tool_call_arguments_stay_json_text(number: str) -> None:
    reply = '{"tool_calls": [{"name": "f", "arguments": {"x": ' + number + \
        ', "y": [' + number + ', {"z": ' + number + '}]}}]}'
    content, calls = parse_reply(reply)
    assert content is None and len(calls) == 1, "a valid call was dropped"
    args = _valid_json(calls[0]["function"]["arguments"])
    assert args == {"x": number, "y": [number, {"z": number}]}


@pytest.mark.parametrize("number", NUMBERS)
def test_gemma4_call_arguments_stay_json_text(number: str) -> None:
    reply = f"<|tool_call>call:f{{x:{number},y:[{number},{{z:{number}}}]}}<tool_call|>"
    content, calls = parse_gemma4_reply(reply, {"f"})
    assert content is None and len(calls) == 1, "a valid call was dropped"
    args = _valid_json(calls[0]["function"]["arguments"])
    assert args == {"x": number, "y": [number, {"z": number}]}


def test_ordinary_arguments_are_unchanged() -> None:
    """Numbers a client reads as Python floats and ints come out as json.dumps writes them."""
    args = {"a": 1, "b": -2.5, "c": [True, False, None, "é\"\\\n"], "d": {"e": 1e-05}}
    reply = json.dumps({"tool_calls": [{"name": "f", "arguments": args}]}, ensure_ascii=False)
    _, calls = parse_reply(reply)
    assert calls[0]["function"]["arguments"] == json.dumps(args, ensure_ascii=False)
    assert math.isclose(json.loads(calls[0]["function"]["arguments"])["d"]["e"], 1e-05)


# --------------------------------------------------------------------------- Gemma 4 strings

MARKS = ["<channel|>", "<|channel>", "<|channel>thought x<channel|>", "<|channel><channel|>",
         "a <channel|> b", "<|channel>a", "<channel|><|channel>"]


@pytest.mark.parametrize("mark", MARKS)
def test_gemma4_string_arguments_keep_channel_marks(mark: str) -> None:
    q = '<|"|>'
    reply = (f"<|channel>thought plan<channel|>Sure.<|tool_call>call:f{{s:{q}{mark}{q},"
             f"l:[{q}{mark}{q}],{q}{mark}{q}:1}}<tool_call|>")
    content, calls = parse_gemma4_reply(reply, {"f"})
    assert content == "Sure."
    assert json.loads(calls[0]["function"]["arguments"]) == {"s": mark, "l": [mark], mark: 1}


def test_gemma4_thoughts_outside_strings_are_still_removed() -> None:
    q = '<|"|>'
    reply = (f"<|channel>thought {q}quoted{q} call:g{{}}<channel|>A<channel|>B<|tool_call>"
             f"call:f{{s:{q}x{q}}}<tool_call|>")
    content, calls = parse_gemma4_reply(reply, {"f"})
    assert content == "AB"
    assert [c["function"]["name"] for c in calls] == ["f"]
    assert parse_gemma4_reply("<|channel>t<channel|>plain", {"f"}) == ("plain", [])


# --------------------------------------------------------------------------- generate_batch

CONFIG: dict[str, Any] = {"threads": 1, "context_size": 256, "batch_size": 64,
                          "max_tokens": 8}
BAD_PROMPTS: list[Any] = [None, 3, 2.5, b"Once upon a time", bytearray(b"abc"),
                          memoryview(b"abc"), {"role": "user", "content": "hi"}, {1, 2},
                          object(), [1, "a"], [1.0, 2.0], [True, 2], [None], [[1, 2]],
                          [{"role": "user", "content": "hi"}, 5]]


def test_each_bad_prompt_fails_alone_with_a_typed_error() -> None:
    good = ["Once upon a time", [1, 2, 3], [{"role": "user", "content": "Where do fish live?"}]]
    prompts = [good[0], *BAD_PROMPTS, good[1], good[2]]
    out = generate_batch(TINY_BUNDLE, prompts, parallel=2, backend="llama.cpp", config=CONFIG)
    assert [r.index for r in out.results] == list(range(len(prompts)))
    bad = out.results[1:1 + len(BAD_PROMPTS)]
    for prompt, result in zip(BAD_PROMPTS, bad, strict=True):
        assert isinstance(result.error, InvalidArgumentError), (prompt, result)
        assert result.error.code.name == "ERR_INVALID_ARG" and result.text == ""
    kept = [out.results[0], *out.results[-2:]]
    assert all(r.ok and r.completion_tokens > 0 for r in kept)  # nothing computed is lost
    with open_stream(TINY_BUNDLE, CONFIG, backend="llama.cpp") as stream:
        stream.prefill(good[0])
        assert kept[0].text == stream.text()
    assert out.stats.failed == len(BAD_PROMPTS)


@pytest.mark.parametrize("parallel", ["2", 2.0, 1.5, True, False, 0, -3, [2], "auto",
                                      float("nan")])
def test_a_bad_parallel_is_refused_before_any_work(parallel: Any) -> None:
    missing = TINY_BUNDLE.parent / "no-such-bundle"  # never reached: arguments come first
    with pytest.raises(InvalidArgumentError, match="parallel"):
        generate_batch(missing, ["a"], parallel=parallel)
    with InferenceContext(TINY_BUNDLE, parallel=2) as ctx, \
            pytest.raises(InvalidArgumentError, match="parallel"):
        generate_batch(ctx, ["a"], parallel=parallel)


def test_numpy_integers_are_a_parallel() -> None:
    np = pytest.importorskip("numpy")
    out = generate_batch(TINY_BUNDLE, ["a", "b"], parallel=np.int64(2), backend="llama.cpp",
                         config=CONFIG)
    assert out.stats.parallel == 2 and all(r.ok for r in out.results)


# --------------------------------------------------------------------------- batch_size < parallel


@pytest.mark.parametrize("backend", ["llama.cpp", "mlx"])
def test_batch_size_below_parallel_is_refused_naming_both(backend: str) -> None:
    if importlib.util.find_spec("mlx_lm" if backend == "mlx" else "llama_cpp") is None:
        pytest.skip(f"{backend} is not installed")
    with InferenceContext(TINY_BUNDLE, parallel=8) as ctx:
        with pytest.raises(InvalidArgumentError) as info:
            open_stream(ctx, {**CONFIG, "batch_size": 4}, backend=backend)
        assert info.value.code.name == "ERR_INVALID_ARG"
        assert "batch_size=4" in str(info.value) and "parallel=8" in str(info.value)
        with open_stream(ctx, {**CONFIG, "batch_size": 8}, backend=backend) as stream:
            stream.prefill("Once upon a time")
            assert stream.text()  # batch_size == parallel serves


def test_serve_refuses_batch_size_below_parallel_up_front() -> None:
    proc = subprocess.run(
        [sys.executable, "-m", "eliza_backends", "serve", str(TINY_BUNDLE), "--port", "0",
         "--parallel", "8", "--batch-size", "4", "--backend", "llama.cpp"],
        capture_output=True, text=True, timeout=120)
    assert proc.returncode != 0
    assert "--batch-size 4" in proc.stderr and "--parallel 8" in proc.stderr, proc.stderr
    assert "Traceback" not in proc.stderr and "shapes" not in proc.stderr


# --------------------------------------------------------------------------- stop + logprobs


@pytest.mark.parametrize("kind", ["text", "chat"])
@pytest.mark.parametrize("streamed", [False, True])
def test_a_stop_string_inside_a_token_keeps_text_and_tokens_together(kind: str,
                                                                     streamed: bool) -> None:
    """Every stop string that ends inside a token (the text keeps the token's first part):
    ``logprobs`` tokens spell the text exactly, the cut token's entry carrying that part."""
    with open_stream(TINY_BUNDLE, backend="llama.cpp", threads=1, context_size=512) as s:
        def ask(stop: list[str] | None) -> tuple[str, list[str]]:
            if kind == "text":
                args: dict[str, Any] = {"prompt": "Four score and seven years ago"}
                call: Callable[..., Any] = completion
            else:
                args = {"messages": [{"role": "user", "content": "Tell me about rivers."}]}
                call = chat_completion
            reply = call(s, **args, max_tokens=24, stop=stop, stream=streamed,
                         logprobs=kind == "chat" or 0)
            chunks = list(reply) if streamed else [reply]
            text, tokens = "", []
            for c in chunks:
                for ch in c.choices:
                    text += (ch.delta.content or "") if streamed and kind == "chat" else \
                        ch.message.content or "" if kind == "chat" else ch.text
                    lp = ch.logprobs
                    if lp is not None:
                        tokens += [t.token for t in lp.content] if kind == "chat" else lp.tokens
            return text, tokens

        full, tokens = ask(None)
        assert "".join(tokens) == full
        starts = {sum(len(t) for t in tokens[:i]) for i in range(len(tokens) + 1)}
        cases = 0
        for k in range(1, len(full) - 1):
            stop = full[k:k + 2]
            if k in starts or full.find(stop) != k or not stop.strip():
                continue  # only cuts inside a token
            cases += 1
            text, got = ask([stop])
            assert text == full[:k]
            assert "".join(got) == text, (stop, text, got)
        assert cases >= 5
