"""Real SIGINTs at many moments of a prefill or a next(), in a process of its own.

    python tests/interrupt_driver.py BACKEND OPTIONS_JSON PHASE CASES

The call runs on the main thread (where Python delivers signals); a timer thread sends the
process SIGINT at a moment spread over the call's measured duration. Each case: the call must
end with ``KeyboardInterrupt`` (or finish, when the signal came after its last safe point) and
the session must then continue exactly as an uninterrupted one. Prints one JSON line: outcomes
and the failures (anything else: a BackendRuntimeError, a wrong continuation ...).
"""

from __future__ import annotations

import json
import os
import signal
import sys
import threading
import time
from pathlib import Path
from typing import Any

from eliza_backends import CancelledError, InferenceContext, open_stream

TINY_BUNDLE = Path(__file__).resolve().parent.parent / "examples" / "bundles" / "tiny"
TEXT = "the quick brown fox jumps over the lazy dog, " * 400


def main() -> None:
    # a process started in the background (nohup ... &) inherits SIGINT ignored: this driver
    # needs Python's own handler
    signal.signal(signal.SIGINT, signal.default_int_handler)
    backend, options, phase, cases = sys.argv[1], json.loads(sys.argv[2]), sys.argv[3], int(
        sys.argv[4])
    ctx = InferenceContext(TINY_BUNDLE)
    cfg: dict[str, Any] = {"backend": backend, "options": options, "threads": 1,
                           "context_size": 2048, "batch_size": 16, "max_tokens": 100_000,
                           "ignore_eos": options != {"litert-lm": {"session": "engine"}}}
    stream = open_stream(ctx, **cfg)
    s = stream.session
    n_long = min(800, s.context_size - 400)
    long_prompt = s.tokenize(TEXT)[:n_long]
    prompt = long_prompt if phase == "prefill" else long_prompt[:40]
    m = min(80, s.context_size - len(prompt) - 10)

    def reference() -> list[int]:
        s.reset()
        s.prefill(prompt)
        return list(s.next(m).tokens)

    ref = reference()
    s.reset()
    t0 = time.perf_counter()
    s.prefill(prompt)
    duration = time.perf_counter() - t0  # of the call the signals interrupt
    if phase == "next":
        t0 = time.perf_counter()
        s.next(m)
        duration = time.perf_counter() - t0
    outcomes: dict[str, int] = {}
    bad: list[str] = []
    for i in range(cases):
        s.reset()
        if phase == "next":
            s.prefill(prompt)
        delay = duration * (i + 0.5) / cases
        timer = threading.Timer(delay, os.kill, (os.getpid(), signal.SIGINT))
        got: list[int] = []
        try:
            try:
                timer.start()
                if phase == "prefill":
                    s.prefill(prompt)
                else:
                    got = list(s.next(m).tokens)
                outcome = "finished"
            except KeyboardInterrupt:
                outcome = "KeyboardInterrupt"
            except BaseException as exc:
                outcome = f"{type(exc).__name__}: {exc}"
            timer.join()
            time.sleep(0.005)  # a signal sent after the call returned is handled here
        except KeyboardInterrupt:
            outcome = "late"
            timer.join()
        outcomes[outcome.split(":")[0]] = outcomes.get(outcome.split(":")[0], 0) + 1
        if outcome not in ("finished", "KeyboardInterrupt", "late"):
            bad.append(f"case {i} (delay {delay:.4f}s): {outcome}")
            continue
        try:
            if phase == "prefill":
                if outcome == "KeyboardInterrupt":
                    if s.history != ():
                        bad.append(f"case {i}: history {len(s.history)} after an interrupt")
                    s.prefill(prompt)
                got = list(s.next(m).tokens)
            elif outcome == "KeyboardInterrupt":
                if list(s.history) != prompt:
                    bad.append(f"case {i}: history holds {len(s.history) - len(prompt)} "
                               "tokens the caller never saw")
                got = list(s.next(m).tokens)
            if got != ref:
                at = next(j for j, (a, b) in enumerate(
                    zip([*got, -2], [*ref, -1], strict=False)) if a != b)
                bad.append(f"case {i} ({outcome}, delay {delay:.4f}s): the continuation "
                           f"differs at {at}")
        except CancelledError:
            outcomes["refused"] = outcomes.get("refused", 0) + 1  # (a runtime that cannot
            # be rewound asks for a reset; the engine session)
            if options != {"litert-lm": {"session": "engine"}}:
                bad.append(f"case {i}: refused after {outcome}")
        except BaseException as exc:
            bad.append(f"case {i} ({outcome}): then {type(exc).__name__}: {exc}")
    stream.close()
    ctx.close()
    sys.stdout.write("RESULT " + json.dumps({"outcomes": outcomes, "bad": bad,
                                             "duration": duration}) + "\n")
    sys.stdout.flush()
    os._exit(0)


if __name__ == "__main__":
    main()
