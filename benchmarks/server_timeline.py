"""Where a request's time goes inside ``serve --parallel N`` (issue 39): timestamps around
``llama_decode`` and the calls a token passes through, for one client sending streamed chat
requests back to back (the 8 questions of ``bench_server.py`` in turn).

    python benchmarks/server_timeline.py MODEL.gguf [--seconds 14] [--parallel 8] [--threads 2]

Prints two tables of medians: the **token cycle** (between two consecutive marks of a decode
step, e.g. ``next> -> engine>``: from the stream's ``next()`` until its step's batch is
filled, ``engine>`` to ``decode>`` being that filling) and the **first token** (each mark's
offset from the chat handler's start: tokenizing the prompt, the prompt cache's swap, the
prefill's decode, the first step).

The server runs in a child process of this script, with the wrapped functions named below
(wrapping moves them by a few microseconds each; read differences, not absolutes). A renamed
function fails the child at start with an ``AttributeError`` naming it.
"""

from __future__ import annotations

import argparse
import collections
import functools
import itertools
import json
import os
import signal
import statistics
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from bench_server import QUESTIONS, Server, free_port, wait_ready

#: (module, class or None, function, label): what the child wraps
WRAPPED = [
    ("eliza_backends.server.app", "OpenAIServer", "chat_completions", "handler"),
    ("eliza_backends.openai.generation", "Generation", "_prompt_ids", "prompt_ids"),
    ("eliza_backends.backend.prompt_cache", "PromptCache", "swap", "swap"),
    ("eliza_backends.stream", "Stream", "prefill", "prefill"),
    ("eliza_backends.openai.generation", "Generation", "step", "step"),
    ("eliza_backends.stream", "Stream", "next", "next"),
    ("eliza_llamacpp.session", "LlamaCppSession", "_pick", "sample"),
    ("eliza_llamacpp.batch_engine", "BatchEngine", "_decode", "engine"),
]

events: list[tuple[str, float]] = []  # (label + ">" or "<", perf_counter); list.append is atomic


def _wrap(owner: Any, name: str, label: str) -> None:
    import inspect

    real = getattr(owner, name)
    clock = time.perf_counter
    if inspect.iscoroutinefunction(real):
        @functools.wraps(real)
        async def timed_async(*args: Any, **kwargs: Any) -> Any:
            events.append((label + ">", clock()))
            try:
                return await real(*args, **kwargs)
            finally:
                events.append((label + "<", clock()))
        setattr(owner, name, timed_async)
        return

    @functools.wraps(real)
    def timed(*args: Any, **kwargs: Any) -> Any:
        events.append((label + ">", clock()))
        try:
            return real(*args, **kwargs)
        finally:
            events.append((label + "<", clock()))
    setattr(owner, name, timed)


def child(argv: list[str]) -> None:
    """Wrap, then run ``eliza-backends serve``; SIGUSR2 forgets the events so far, SIGUSR1
    writes them to the file named by ``$TIMELINE_OUT`` and exits."""
    import importlib

    from eliza_llamacpp.bindings import lc

    for module, cls, name, label in WRAPPED:
        mod = importlib.import_module(module)
        _wrap(getattr(mod, cls) if cls else mod, name, label)
    _wrap(lc, "llama_decode", "decode")

    def dump(*_: Any) -> None:
        Path(os.environ["TIMELINE_OUT"]).write_text(json.dumps(events))
        os._exit(0)

    signal.signal(signal.SIGUSR1, dump)
    signal.signal(signal.SIGUSR2, lambda *_: events.clear())
    from eliza_backends.cli import main

    sys.argv = ["eliza-backends", *argv]
    main()


def token_cycle(marks: list[tuple[str, float]]) -> dict[str, tuple[float, int]]:
    """Median ms between consecutive marks (pairs seen in at least 20 steps; gaps over 4 ms
    are waits for the client, not the cycle, except a decode's own length)."""
    pairs: dict[str, list[float]] = collections.defaultdict(list)
    for (a, ta), (b, tb) in itertools.pairwise(marks):
        if tb - ta < 0.004 or (a, b) == ("decode>", "decode<"):
            pairs[f"{a} -> {b}"].append(tb - ta)
    return {k: (statistics.median(v) * 1e3, len(v)) for k, v in pairs.items() if len(v) >= 20}


def first_token(marks: list[tuple[str, float]]) -> dict[str, tuple[float, int]]:
    """Median ms from each request's ``handler>`` to the first time each mark follows it, up
    to the request's first ``step<``."""
    starts = [i for i, (label, _) in enumerate(marks) if label == "handler>"]
    offsets: dict[str, list[float]] = collections.defaultdict(list)
    for i, end in zip(starts, [*starts[1:], len(marks)], strict=True):
        seen: set[str] = set()
        for label, t in marks[i:end]:
            if label not in seen:
                seen.add(label)
                offsets[label].append((t - marks[i][1]) * 1e3)
            if label == "step<":
                break
    return {k: (statistics.median(v), len(v)) for k, v in offsets.items()}


def drive(seconds: float, ask: Callable[[str], None]) -> int:
    """``ask`` the questions in turn for ``seconds``; how many it asked."""
    n, deadline = 0, time.monotonic() + seconds
    while time.monotonic() < deadline:
        ask(QUESTIONS[n % 8])
        n += 1
    return n


def main() -> None:
    if len(sys.argv) > 1 and sys.argv[1] == "--child":
        child(sys.argv[2:])
        return
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("model", type=Path)
    ap.add_argument("--seconds", type=float, default=14.0)
    ap.add_argument("--parallel", type=int, default=8)
    ap.add_argument("--threads", type=int, default=2)
    args = ap.parse_args()
    import httpx

    out = Path(f"/tmp/server_timeline_{os.getpid()}.json")
    port = free_port()
    proc = subprocess.Popen(
        [sys.executable, __file__, "--child", "serve", str(args.model), "--port", str(port),
         "--parallel", str(args.parallel), "--threads", str(args.threads)],
        env={**os.environ, "TIMELINE_OUT": str(out)}, stdout=subprocess.DEVNULL, text=True)
    url = f"http://127.0.0.1:{port}/v1"
    try:
        wait_ready(Server("eliza (timeline)", proc, url, args.threads))
        client = httpx.Client(timeout=60)

        def ask(question: str) -> None:
            body = {"max_tokens": 48, "temperature": 0, "stream": True, "ignore_eos": True,
                    "messages": [{"role": "user", "content": question}]}
            with client.stream("POST", f"{url}/chat/completions", json=body) as resp:
                for _ in resp.iter_lines():
                    pass

        drive(2.0, ask)  # warm: every question once on its slot
        proc.send_signal(signal.SIGUSR2)  # (forget the warm-up)
        requests = drive(args.seconds, ask)
    finally:
        proc.send_signal(signal.SIGUSR1)
        proc.wait(30)
    marks = [(label, t) for label, t in json.loads(out.read_text())]
    out.unlink()
    print(f"{requests} requests, {sum(1 for m in marks if m[0] == 'decode>')} decodes")
    print("\ntoken cycle (ms, median; n)")
    for name, (ms, n) in sorted(token_cycle(marks).items(), key=lambda kv: -kv[1][1]):
        print(f"  {name:24s} {ms:7.3f}  {n}")
    print("\nfirst token (ms after the handler starts, median; n)")
    for name, (ms, n) in sorted(first_token(marks).items(), key=lambda kv: kv[1][0]):
        print(f"  {name:14s} {ms:7.2f}  {n}")


if __name__ == "__main__":
    main()
