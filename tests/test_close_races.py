"""Close races on every backend (issue 15.2): each public method of Stream, Session and
InferenceContext in one thread against ``close()`` of the stream, the session or the context in
another, over a ladder of timings. No crash (the driver runs in a process of its own, so a
segfault fails the test instead of the run), no hang, and only typed outcomes: a normal
return, :class:`SessionClosedError` or :class:`CancelledError`, never ``SessionBusyError``.

Plus the single-process races that need no runtime: close() while another thread is in next()
on the scripted backend (the SessionBusyError of 9 runs in 10), and reset() right after a
cancelled ``async for`` (15.12).
"""

from __future__ import annotations

import asyncio
import contextlib
import importlib.util
import json
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

import pytest
from conftest import make_bundle
from scripted_backend import ScriptedSession

from eliza_backends import (
    CancelledError,
    InferenceContext,
    SessionBusyError,
    SessionClosedError,
    Stream,
    StreamConfig,
)

DRIVER = Path(__file__).parent / "race_driver.py"
INTERPRETER = {"litert-lm": {"session": "interpreter", "runtime": "interpreter"}}
COMPILED = {"litert-lm": {"session": "interpreter", "runtime": "compiled"}}
ENGINE = {"litert-lm": {"session": "engine"}}

RUNTIMES = [
    pytest.param("llama.cpp", {}, "llama_cpp", id="llama.cpp"),
    pytest.param("litert-lm", INTERPRETER, "ai_edge_litert", id="litert-interpreter"),
    pytest.param("litert-lm", COMPILED, "ai_edge_litert", id="litert-compiled"),
    pytest.param("litert-lm", ENGINE, "litert_lm", id="litert-engine"),
    pytest.param("mlx", {}, "mlx_lm", id="mlx"),
]


@pytest.mark.parametrize(("backend", "options", "module"), RUNTIMES)
def test_close_races_on_every_public_method(backend: str, options: dict[str, Any],
                                            module: str) -> None:
    if importlib.util.find_spec(module) is None:
        pytest.skip(f"{module} is not installed")
    proc = subprocess.run([sys.executable, str(DRIVER), backend, json.dumps(options), "1", "0"],
                          capture_output=True, text=True, timeout=300)
    lines = [line for line in proc.stdout.splitlines() if line.startswith("RESULT ")]
    assert proc.returncode == 0 and lines, (
        f"the race driver died with status {proc.returncode} (a native crash?)\n"
        f"{proc.stderr[-3000:]}")
    report = json.loads(lines[-1][len("RESULT "):])
    assert report["unexpected"] == [], "\n".join(report["unexpected"])
    outcomes: dict[str, dict[str, int]] = report["outcomes"]
    # not vacuous: closes landed while calls ran (typed errors), on every kind of call that
    # runs long enough to be caught, and with every closer
    # (LiteRT prefills the 256-token prompt in a few native calls of a few ms: too short to
    # aim a close at reliably, on every runtime and session)
    long_calls = ("Stream.next", "Stream.text", "async for") if backend == "litert-lm" else (
        "Stream.prefill(ids)", "Stream.next", "Stream.text", "async for")
    for name in long_calls:
        for closer in ("Stream.close", "Session.close", "InferenceContext.close"):
            got = outcomes[f"{name} / {closer}"]
            assert got.get("CancelledError", 0) + got.get("SessionClosedError", 0), (name, closer,
                                                                                   got)
    print(f"{backend} {options}: {report['cases']} cases, outcomes {outcomes}")


# ---------------------------------------------------------------------------- scripted


class SlowDecode(ScriptedSession):
    """A scripted session whose decode takes a while per token (so close lands inside)."""

    def _decode(self, max_tokens: int) -> Any:
        time.sleep(0.001)
        return super()._decode(max_tokens)


def _scripted(tmp_path: Path, **cfg: Any) -> tuple[InferenceContext, ScriptedSession]:
    bundle = make_bundle(tmp_path / "b", "m.scripted")
    ctx = InferenceContext(bundle)
    config = StreamConfig(**{"context_size": 100_000, "max_tokens": 50_000, "ignore_eos": True,
                             **cfg})
    return ctx, SlowDecode(config, ctx)


def test_close_while_another_thread_is_in_next_is_never_busy(tmp_path: Path) -> None:
    """The consumer loops next(); close() from another thread at many moments. The consumer
    sees CancelledError or SessionClosedError, never SessionBusyError."""
    outcomes: dict[str, int] = {}
    for i in range(60):
        ctx, s = _scripted(tmp_path / str(i), tokens_per_step=4)
        s.prefill([65, 66, 67])
        seen: list[str] = []

        def consumer(session: ScriptedSession = s, out: list[str] = seen) -> None:
            try:
                while True:
                    session.next()
            except (CancelledError, SessionClosedError, SessionBusyError) as exc:
                out.append(type(exc).__name__)

        t = threading.Thread(target=consumer)
        t.start()
        time.sleep((i % 12) * 0.0005)
        s.close()
        t.join(10)
        assert not t.is_alive()
        outcomes[seen[0]] = outcomes.get(seen[0], 0) + 1
        ctx.close()
    assert "SessionBusyError" not in outcomes, outcomes
    assert sum(outcomes.values()) == 60


def test_reset_right_after_a_cancelled_async_for(tmp_path: Path) -> None:
    """15.12: the task running ``async for`` is cancelled; ``reset()`` right after works (it
    used to get SessionBusyError while the worker thread still held the session)."""
    ctx, s = _scripted(tmp_path, tokens_per_step=64)
    stream = Stream(s, backend="scripted", context=ctx, owns_context=True)
    failures = []
    for i in range(20):
        stream.reset()
        stream.prefill([65, 66, 67])

        async def consume() -> None:
            async for _ in stream:
                pass

        async def main(delay: float = 0.002 + 0.001 * i) -> None:
            task = asyncio.create_task(consume())
            await asyncio.sleep(delay)
            task.cancel()
            with pytest.raises(asyncio.CancelledError):
                await task
            try:
                stream.reset()  # right away, on the loop's thread
            except SessionBusyError as exc:  # pragma: no cover - the bug
                failures.append(exc)

        asyncio.run(main())
    stream.close()
    assert not failures, failures[0]


def test_reset_waits_for_a_cancelled_call_in_another_thread(tmp_path: Path) -> None:
    """The same rule without asyncio: after cancel(), reset() waits for the running call."""
    ctx, s = _scripted(tmp_path, tokens_per_step=50_000)
    s.prefill([65, 66, 67])
    errors: list[BaseException] = []

    def consumer() -> None:
        try:
            s.next()
        except CancelledError:
            pass
        except BaseException as exc:  # pragma: no cover - reported below
            errors.append(exc)

    t = threading.Thread(target=consumer)
    t.start()
    while not s.busy:
        time.sleep(0.0005)
    s.cancel()
    s.reset()  # no SessionBusyError: the cancelled next() stops and reset() runs after it
    t.join()
    assert not errors and s.n_past == 0 and not s.cancelled
    # a second consumer while nothing is cancelled is still refused
    s.prefill([65, 66, 67])

    def long_call() -> None:
        with contextlib.suppress(CancelledError, SessionClosedError):
            s.next(50_000)

    t = threading.Thread(target=long_call)
    t.start()
    while not s.busy:
        time.sleep(0.0005)
    with pytest.raises(SessionBusyError):
        s.reset()
    s.close()
    t.join()
    ctx.close()


def test_close_from_inside_a_call_is_refused_not_a_deadlock() -> None:
    """The consumer lock is not re-entrant: close() from inside a hook (a callback, a
    finalizer running on the calling thread) gets SessionBusyError instead of waiting for
    itself forever; the session stays usable and closes afterwards."""
    from eliza_backends import Decoded, SessionBusyError

    class ClosesItself(ScriptedSession):
        def _decode(self, max_tokens: int) -> Decoded:
            self.close()
            return super()._decode(max_tokens)

    s = ClosesItself(StreamConfig(max_tokens=8), None)
    s.prefill([1, 2, 3])
    result: list[BaseException] = []

    def call() -> None:
        try:
            s.next()
        except BaseException as exc:
            result.append(exc)

    t = threading.Thread(target=call, daemon=True)
    t.start()
    t.join(10)
    assert not t.is_alive(), "close() inside next() deadlocked"
    assert len(result) == 1 and isinstance(result[0], SessionBusyError), result
    assert not s.closed and list(s.history) == [1, 2, 3]
    s.close()
    assert s.closed
