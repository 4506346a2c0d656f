"""MLX from worker threads (issue 15.4): every mlx call runs on the plugin's one MLX thread, so
a process that drove MLX sessions from threads that have ended (a plain thread, ``async for``'s
worker) exits cleanly, instead of mlx's "terminate called without an active exception" abort
(about 7 runs of 10 before)."""

from __future__ import annotations

import subprocess
import sys
import textwrap
import threading

import pytest
from conftest import TINY_BUNDLE

pytest.importorskip("mlx_lm")

SCRIPT = textwrap.dedent("""
    import asyncio, sys, threading
    from eliza_backends import open_stream

    bundle = sys.argv[1]

    def in_a_thread():
        with open_stream(bundle, backend="mlx", threads=1, max_tokens=6) as s:
            s.prefill("hello")
            s.text()

    t = threading.Thread(target=in_a_thread)
    t.start()
    t.join()

    async def with_async_for():
        with open_stream(bundle, backend="mlx", threads=1, max_tokens=6) as s:
            s.prefill("hello")
            async for _ in s:
                pass

    asyncio.run(with_async_for())
    print("done", flush=True)
""")


@pytest.mark.slow
def test_twenty_processes_using_mlx_from_worker_threads_exit_cleanly() -> None:
    results = []
    for _ in range(20):
        proc = subprocess.run([sys.executable, "-c", SCRIPT, str(TINY_BUNDLE)],
                              capture_output=True, text=True, timeout=120)
        results.append((proc.returncode, proc.stdout.strip(), proc.stderr[-400:]))
    bad = [r for r in results if r[0] != 0 or r[1] != "done"]
    assert not bad, f"{len(bad)}/20 unclean exits, first: {bad[0]}"


def test_every_mlx_call_runs_on_the_mlx_thread() -> None:
    """The hooks run on one thread whichever thread drives the session."""
    from eliza_mlx.mlx_thread import MLX_THREAD

    from eliza_backends import open_stream

    seen: set[str] = set()
    with open_stream(TINY_BUNDLE, backend="mlx", threads=1, max_tokens=4) as s:
        def drive() -> None:
            s.prefill("hello")
            s.text()
            seen.add(MLX_THREAD.run(lambda: threading.current_thread().name))

        t = threading.Thread(target=drive)
        t.start()
        t.join()
        drive()
    assert seen == {"eliza-mlx"}


def test_a_stopped_mlx_thread_runs_calls_inline() -> None:
    """After the exit hook stopped it, calls (finalizers at exit) run on the caller."""
    from eliza_mlx.mlx_thread import MLXThread

    worker = MLXThread("eliza-mlx-test")
    assert worker.run(lambda: threading.current_thread().name) == "eliza-mlx-test"
    with pytest.raises(ZeroDivisionError):
        worker.run(lambda: 1 // 0)
    worker.stop()
    assert worker.run(lambda: threading.current_thread().name) == \
        threading.current_thread().name
