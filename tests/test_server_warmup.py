"""The server's startup warm-up (``serve`` without ``--no-warmup``): it leaves each session
empty, with fresh metrics, and the replies exactly as without it (real llama.cpp, tiny bundle)."""

from __future__ import annotations

import pytest
from conftest import TINY_BUNDLE

pytest.importorskip("llama_cpp")

from eliza_backends import InferenceContext, open_stream
from eliza_backends.server.pool import SessionPool
from eliza_backends.server.warmup import warm_up

CFG = {"threads": 1, "max_tokens": 12, "ignore_eos": True}


def test_warm_up_leaves_the_stream_as_it_was() -> None:
    with InferenceContext(TINY_BUNDLE) as ctx:
        with open_stream(ctx, backend="llama.cpp", **CFG) as cold:
            cold.prefill("Once upon a time")
            want = cold.text()
        with open_stream(ctx, backend="llama.cpp", **CFG) as warmed:
            assert warm_up(warmed) > 0
            assert warmed.session.n_past == 0 and not warmed.session.history
            assert warmed.metrics.turns == 0 and warmed.metrics.decode_tokens == 0
            warmed.prefill("Once upon a time")
            assert warmed.text() == want


@pytest.mark.parametrize("kind", [{"parallel": 2}, {"sessions": 2}], ids=["batched", "sessions"])
def test_a_warm_pool_opens_empty_sessions(kind: dict[str, int]) -> None:
    from eliza_backends import StreamConfig

    pool = SessionPool(TINY_BUNDLE, StreamConfig(threads=1), warm=True, **kind)
    try:
        pool.open()
        assert pool.warmup_seconds > 0
        assert all(s.stream is not None and s.stream.session.n_past == 0 and s.text == ""
                   for s in pool.slots)
    finally:
        pool.close()
