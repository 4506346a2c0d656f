"""Warm a freshly opened session up before the server listens, as llama-server does.

The first request after a start paid 2-3x the prefill time of the later ones: the runtime's
first decode allocates its compute buffers, faults the mapped weights in and starts its thread
pool, and the first chat render compiles the template. :func:`warm_up` pays that once at
startup: it renders a one-message chat through the model's template (when it has one),
prefills a few tokens, decodes one and forgets it all (``Stream.reset``), so the session is as
empty as it was, with fresh metrics.
"""

from __future__ import annotations

import time

from ..errors import UnsupportedOperationError
from ..stream import Stream, StreamMetrics

#: What the warm-up prefills (a few tokens of ordinary text: the prefill path, not one token).
WARMUP_TEXT = "Hello! This sentence warms the model up before the first request."
#: How many of the rendered message's tokens the warm-up prefills (a batch, not one token).
WARMUP_TOKENS = 8


def warm_up(stream: Stream) -> float:
    """Prefill the first :data:`WARMUP_TOKENS` tokens of a short prompt on ``stream`` (a chat
    message through its template when it has one: the render compiles the template), decode
    one token, then reset it; returns the seconds it took. Run it on the
    stream's consumer thread, before the stream serves anything."""
    start = time.perf_counter()
    try:
        ids = stream.chat_tokens([{"role": "user", "content": WARMUP_TEXT}])
    except UnsupportedOperationError:  # no chat template: plain text
        ids = stream.session.tokenize(WARMUP_TEXT, add_special=True)
    stream.prefill(ids[:WARMUP_TOKENS])
    stream.next(1)
    stream.reset()
    stream.metrics = StreamMetrics()
    return time.perf_counter() - start


__all__ = ["WARMUP_TEXT", "WARMUP_TOKENS", "warm_up"]
