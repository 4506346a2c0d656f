"""A close landing inside a call, and a cancel landing inside a rewind, at the exact points that
matter (issue 32's "close vs opens" hang): each interleaving is forced with a line trace on the
thread that must be caught there, so it happens every run, on the real runtimes.

* A close while llama.cpp decodes a prefill chunk: the C-level cancel probe makes
  ``llama_decode`` return 2 (aborted); the call ends with :class:`SessionClosedError` (not a
  retry, not a runtime error) and the close returns.
* A close at a call's next safe point, on every backend: :class:`SessionClosedError`.
* ``open_stream`` on a context closed meanwhile: :class:`SessionClosedError`.
* ``cancel()`` from another thread caught between setting its flag and setting the probe,
  while the consumer rewinds: before the fix the rewind cleared the flag, the probe stayed set,
  and the next prefill's decode aborted with no cancel to report ("llama_decode failed with
  status 2", a runtime error).
"""

from __future__ import annotations

import importlib.util
import inspect
import logging
import sys
import threading
import time
from collections.abc import Callable, Iterator
from types import FrameType
from typing import Any

import pytest
from conftest import TINY_BUNDLE

from eliza_backends import (
    CancelledError,
    InferenceContext,
    SessionClosedError,
    Stream,
    open_stream,
)
from eliza_backends.backend import Session
from eliza_backends.backend.guard import SessionGuard

Tracer = Callable[[FrameType, str, Any], Any]

#: (backend, options, the module it needs)
BACKENDS = [
    pytest.param("llama.cpp", {}, "llama_cpp", id="llama.cpp"),
    pytest.param("litert-lm", {"litert-lm": {"session": "interpreter",
                                             "runtime": "interpreter"}}, "ai_edge_litert",
                 id="litert-interpreter"),
    pytest.param("litert-lm", {"litert-lm": {"session": "interpreter", "runtime": "compiled"}},
                 "ai_edge_litert", id="litert-compiled"),
    pytest.param("litert-lm", {"litert-lm": {"session": "engine"}}, "litert_lm",
                 id="litert-engine"),
    pytest.param("mlx", {}, "mlx_lm", id="mlx"),
]


def paused_at(codes: Any, event: str, reached: threading.Event,
              until: Callable[[], bool], line: int | None = None) -> Tracer:
    """A trace function that, the first time one of ``codes`` sees ``event`` (at ``line`` for
    "line"), sets ``reached`` and waits (at most 10 s) until ``until()``."""
    done = [False]

    def local(frame: FrameType, ev: str, arg: Any) -> Any:
        if not done[0] and ev == event and (line is None or frame.f_lineno == line):
            done[0] = True
            reached.set()
            deadline = time.monotonic() + 10
            while not until() and time.monotonic() < deadline:
                time.sleep(0.001)
        return local

    def tracer(frame: FrameType, ev: str, arg: Any) -> Any:
        if frame.f_code in codes and not done[0]:
            if ev == event == "call":
                return local(frame, ev, arg)
            return local
        return None

    return tracer


def run_traced(fn: Callable[[], None], tracer: Tracer) -> tuple[threading.Thread,
                                                             list[BaseException]]:
    """Run ``fn`` on a new thread under ``tracer``; the exceptions it raised go in the list."""
    raised: list[BaseException] = []

    def body() -> None:
        sys.settrace(tracer)
        try:
            fn()
        except BaseException as exc:
            raised.append(exc)
        finally:
            sys.settrace(None)

    thread = threading.Thread(target=body, daemon=True)
    thread.start()
    return thread, raised


@pytest.fixture
def native_log() -> Iterator[list[str]]:
    """llama.cpp's log lines while the test runs (its errors reach logging)."""
    lines: list[str] = []

    class Keep(logging.Handler):
        def emit(self, record: logging.LogRecord) -> None:
            lines.append(record.getMessage())

    handler = Keep(logging.ERROR)
    logger = logging.getLogger("eliza_llamacpp.native")
    logger.addHandler(handler)
    try:
        yield lines
    finally:
        logger.removeHandler(handler)


def on_mlx_thread(fn: Callable[[], None]) -> None:
    """Run ``fn`` on the thread that runs every mlx call (and so the MLX session's hooks)."""
    from eliza_mlx.mlx_thread import MLX_THREAD

    MLX_THREAD.run(fn)


def stopping(stream: Stream) -> Callable[[], bool]:
    """True once something asked the stream's session to stop (its C-level probe is set)."""
    return lambda: stream.session._cancel_probe(None)


def test_a_close_inside_an_aborting_prefill_decode_ends_the_call_with_a_closed_error(
        native_log: list[str]) -> None:
    from eliza_llamacpp import llama_context

    ctx = InferenceContext(TINY_BUNDLE)
    s = open_stream(ctx, backend="llama.cpp", threads=1, context_size=512, batch_size=32)
    ids = s.session.tokenize("the quick brown fox jumps over the lazy dog " * 4)
    assert len(ids) > 64  # several chunks: the first one is decoded when the close lands
    reached = threading.Event()
    # the batch of the first chunk is filled: the decode starts once the close has begun
    tracer = paused_at({llama_context.fill_batch.__code__}, "return", reached, stopping(s))
    worker, raised = run_traced(lambda: s.prefill(ids), tracer)
    assert reached.wait(30)
    t0 = time.monotonic()
    ctx.close()
    worker.join(30)
    assert not worker.is_alive(), "the prefill never returned after the close"
    assert time.monotonic() - t0 < 10
    assert [type(e) for e in raised] == [SessionClosedError], raised
    assert any("ret = 2" in line for line in native_log), native_log  # aborted, not finished
    assert s.session.closed and ctx.closed
    s.close()


@pytest.mark.parametrize(("backend", "options", "module"), BACKENDS)
@pytest.mark.parametrize("call", ["prefill", "next"])
def test_a_close_at_a_calls_safe_point_ends_it_with_a_closed_error(
        backend: str, options: dict[str, Any], module: str, call: str) -> None:
    if importlib.util.find_spec(module) is None:
        pytest.skip(f"{module} is not installed")
    ctx = InferenceContext(TINY_BUNDLE)
    engine = "engine" in str(options)  # (it ends its turn at a stop token itself)
    s = open_stream(ctx, backend=backend, options=options, context_size=512, batch_size=32,
                    max_tokens=64, ignore_eos=not engine)
    ids = s.session.tokenize("the quick brown fox jumps over the lazy dog " * 4)
    if call == "next":
        s.prefill(ids)
        s.next(2)
    reached = threading.Event()
    # the first cancel check of the call (MLX's decode loop asks the bare flag first)
    checks = {Session._raise_if_cancelled.__code__, Session._cancel_requested.__code__}
    tracer = paused_at(checks, "call", reached, stopping(s))
    on_hook_thread = on_mlx_thread if backend == "mlx" else (lambda fn: fn())
    on_hook_thread(lambda: sys.settrace(tracer))  # (MLX runs the hooks on its own thread)
    try:
        work = (lambda: s.prefill(ids)) if call == "prefill" else (lambda: s.next(16))
        worker, raised = run_traced(work, tracer)
        assert reached.wait(30)
        closer = threading.Thread(target=ctx.close, daemon=True)
        closer.start()
        worker.join(30)
        closer.join(30)
    finally:
        on_hook_thread(lambda: sys.settrace(None))
    assert not worker.is_alive() and not closer.is_alive(), "a close or a call never returned"
    assert [type(e) for e in raised] == [SessionClosedError], raised
    s.close()


def test_a_cancel_racing_a_rewind_never_leaves_the_abort_probe_set() -> None:
    s = open_stream(TINY_BUNDLE, backend="llama.cpp", threads=1, context_size=512,
                    batch_size=32, max_tokens=8)
    with s:
        s.prefill("hello there " * 4)
        lines, first = inspect.getsourcelines(SessionGuard.cancel)
        gap = first + next(i for i, text in enumerate(lines) if "_stop.add(None)" in text)
        at_gap, resume = threading.Event(), threading.Event()
        # cancel() is held after setting its flag, before setting the probe ...
        tracer = paused_at({SessionGuard.cancel.__code__}, "line", at_gap, resume.is_set,
                           line=gap)
        canceller, raised = run_traced(s.cancel, tracer)
        assert at_gap.wait(30)
        # ... while the consumer rewinds (it waits for the cancel to finish, or it does not)
        rewind = threading.Thread(target=s.session.reset, daemon=True)
        rewind.start()
        rewind.join(0.3)
        resume.set()
        canceller.join(30)
        rewind.join(30)
        assert not raised and not canceller.is_alive() and not rewind.is_alive()
        # either the cancel or the rewind came last: the probe agrees with the flag
        assert s.session._cancel_probe(None) == s.session.cancelled
        if s.session.cancelled:
            with pytest.raises(CancelledError):
                s.prefill("again " * 3)
            s.session.reset()
        s.prefill("again " * 3)  # was: BackendRuntimeError("llama_decode failed with status 2")
        assert s.next(2).tokens


def test_opening_a_stream_on_a_closed_single_file_context_is_a_closed_error() -> None:
    # a single artifact is staged in a folder the close removes: the selection that read it
    # before opening() said "bundle directory ... does not exist" (BackendSelectionError) to a
    # thread that kept opening streams while another closed the context
    ctx = InferenceContext(TINY_BUNDLE / "text" / "tiny-f16.gguf")
    staged = ctx.bundle_dir
    ctx.close()
    assert not staged.exists()
    for backend in ("llama.cpp", None):
        with pytest.raises(SessionClosedError):
            open_stream(ctx, backend=backend)
