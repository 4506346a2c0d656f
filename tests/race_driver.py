"""Close races, driven in a process of their own (a native crash then fails one test, not the
run): every public method of Stream, Session and InferenceContext in one thread, ``close()`` of
the stream, the session or the context from another, over many timings.

    python tests/race_driver.py BACKEND OPTIONS_JSON SECONDS SEED

Prints one JSON line: cases tried, outcomes per operation, and the unexpected ones (anything but
a normal return, :class:`SessionClosedError` or :class:`CancelledError`). The parent test
(tests/test_close_races.py) asserts there are none and that the closes really overlapped.
"""

from __future__ import annotations

import asyncio
import json
import os
import random
import sys
import tempfile
import threading
import time
from collections import Counter
from collections.abc import Callable
from pathlib import Path
from typing import Any

from eliza_backends import (
    CancelledError,
    InferenceContext,
    SessionClosedError,
    Stream,
    open_stream,
)

TINY_BUNDLE = Path(__file__).resolve().parent.parent / "examples" / "bundles" / "tiny"
EXPECTED = (SessionClosedError, CancelledError)
#: When the close comes, as a fraction of the operation's measured length: tried in turn, then
#: random (fixed delays missed LiteRT's calls on a faster machine: they ended first)
FRACTIONS = (0.0, 0.05, 0.2, 0.4, 0.7)
#: Delays (seconds) for the close of a context a session is being opened on
DELAYS = (0.0, 2e-4, 1e-3, 4e-3, 1.2e-2)
LONG_TEXT = "the quick brown fox jumps over the lazy dog, " * 2000
#: About 400 tokens of the tiny model: fits the 512-token context with room to decode.
PROMPT_TEXT = LONG_TEXT[:640]


def _consume_async(stream: Stream) -> None:
    async def run() -> None:
        async for _ in stream:
            pass

    asyncio.run(run())


class Driver:
    def __init__(self, backend: str, options: dict[str, Any], seed: int) -> None:
        self.backend = backend
        self.options = options
        self.rng = random.Random(seed)
        self.tmp = Path(tempfile.mkdtemp(prefix="eliza-race-"))
        self.shared = InferenceContext(TINY_BUNDLE)
        self.outcomes: dict[str, Counter[str]] = {}
        self.unexpected: list[str] = []
        self.cases = 0
        probe = self.open(self.shared)
        session = probe.session
        self.slots = session.capabilities.slots
        self.prompt = session.tokenize(LONG_TEXT, add_special=True)[: session.context_size // 2]
        self.short = self.prompt[:24]
        self.slot = self.tmp / "slot.bin"
        if self.slots:
            probe.prefill(self.short)
            session.save_slot(self.slot)
        probe.close()

    def open(self, context: InferenceContext | None = None, **cfg: Any) -> Stream:
        return open_stream(context if context is not None else TINY_BUNDLE, backend=self.backend,
                           options=self.options, threads=1, context_size=512, batch_size=16,
                           ignore_eos=self.options.get("litert-lm", {}).get("session") != "engine",
                           max_tokens=400, **cfg)  # (the engine refuses ignore_eos)

    # ----------------------------------------------------------------- operations

    def operations(self) -> dict[str, tuple[Callable[[Stream], None], Callable[[Stream], Any]]]:
        """name -> (setup run before the race, the operation raced against close)."""
        nothing: Callable[[Stream], None] = lambda s: None  # noqa: E731
        primed = self._primed
        ops: dict[str, tuple[Callable[[Stream], None], Callable[[Stream], Any]]] = {
            "Stream.prefill(text)": (nothing, lambda s: s.prefill(PROMPT_TEXT)),
            "Stream.prefill(ids)": (nothing, lambda s: s.prefill(self.prompt)),
            "Stream.prefill_messages": (nothing, lambda s: s.prefill_messages(
                [{"role": "user", "content": PROMPT_TEXT[:400]}])),
            "Stream.next": (primed, lambda s: s.next(300)),
            "Stream.text": (primed, lambda s: s.text()),
            "async for": (primed, _consume_async),
            "Stream.reset": (primed, lambda s: s.reset()),
            "Stream.reset_keep": (primed, lambda s: s.reset_keep(8)),
            "Session.tokenize": (nothing, lambda s: s.session.tokenize(LONG_TEXT)),
            "Session.detokenize": (nothing, lambda s: s.session.detokenize(self.prompt * 4)),
            "Session.history": (primed, lambda s: s.session.history),
            "Session.cancel": (primed, lambda s: s.session.cancel()),
            "Session.model_info.control_texts": (nothing,
                                                 lambda s: s.session.model_info.control_texts),
        }
        if self.slots:
            ops["Session.save_slot"] = (primed, lambda s: s.session.save_slot(
                self.tmp / f"save-{threading.get_ident()}.bin"))
            ops["Session.restore_slot"] = (nothing, lambda s: s.session.restore_slot(self.slot))
        return ops

    def _primed(self, stream: Stream) -> None:
        stream.prefill(self.short)
        stream.next(2)

    # ----------------------------------------------------------------- the races

    def race(self, name: str, closer: str, op: Callable[[], Any], close: Callable[[], None],
             delay: float) -> None:
        started = threading.Event()
        result: list[str] = []

        def consumer() -> None:
            started.set()
            try:
                op()
                result.append("ok")
            except EXPECTED as exc:
                result.append(type(exc).__name__)
            except BaseException as exc:  # the failures this driver looks for
                result.append(f"UNEXPECTED {type(exc).__name__}: {exc}")

        t = threading.Thread(target=consumer)
        t.start()
        started.wait()
        if delay:
            time.sleep(delay)
        try:
            close()
        except BaseException as exc:
            self.unexpected.append(f"{name} / {closer}: close raised {type(exc).__name__}: {exc}")
        t.join(30)
        if t.is_alive():
            self.unexpected.append(f"{name} / {closer}: the consumer hangs after close")
            return
        outcome = result[0]
        self.outcomes.setdefault(f"{name} / {closer}", Counter())[outcome.split(":")[0]] += 1
        if outcome.startswith("UNEXPECTED"):
            self.unexpected.append(f"{name} / {closer} (delay {delay:g}s): {outcome}")
        self.cases += 1

    def measure(self, setup: Callable[[Stream], None], op: Callable[[Stream], Any]) -> float:
        """Seconds ``op`` takes after ``setup`` on a fresh stream, with no close."""
        stream = self.open(self.shared)
        setup(stream)
        t0 = time.perf_counter()
        op(stream)
        elapsed = time.perf_counter() - t0
        stream.close()
        return elapsed

    def run(self, seconds: float) -> dict[str, Any]:
        ops = self.operations()
        lengths = {name: self.measure(setup, op) for name, (setup, op) in ops.items()}
        deadline = time.monotonic() + seconds
        rounds = 0
        while time.monotonic() < deadline or rounds < len(FRACTIONS):
            fraction = FRACTIONS[rounds] if rounds < len(FRACTIONS) else self.rng.uniform(0, 1)
            for name, (setup, op) in ops.items():
                delay = fraction * lengths[name]
                stream = self.open(self.shared)
                setup(stream)
                self.race(name, "Stream.close", lambda s=stream, o=op: o(s), stream.close,
                          delay)
                stream = self.open(self.shared)
                setup(stream)
                self.race(name, "Session.close", lambda s=stream, o=op: o(s),
                          stream.session.close, delay)
                stream.close()
                owned = self.open()
                setup(owned)
                self.race(name, "InferenceContext.close", lambda s=owned, o=op: o(s),
                          owned.context.close, delay)
                owned.close()
            context = InferenceContext(TINY_BUNDLE)
            self.open(context).close()  # the weights are loaded: open only makes a session
            self.race("open_stream(context)", "InferenceContext.close",
                      lambda c=context: self.open(c).prefill(self.short), context.close,
                      DELAYS[rounds % len(DELAYS)])
            rounds += 1
        self.shared.close()
        return {"backend": self.backend, "cases": self.cases, "rounds": rounds,
                "outcomes": {k: dict(v) for k, v in self.outcomes.items()},
                "unexpected": self.unexpected}


def main() -> None:
    backend, options, seconds, seed = sys.argv[1], json.loads(sys.argv[2]), float(
        sys.argv[3]), int(sys.argv[4])
    sys.setswitchinterval(1e-4)  # hand the GIL over often: the closer thread lands mid-call
    report = Driver(backend, options, seed).run(seconds)
    sys.stdout.write("RESULT " + json.dumps(report) + "\n")
    sys.stdout.flush()
    os._exit(0)  # the runtimes' own exit-time logging is not part of the result


if __name__ == "__main__":
    main()
