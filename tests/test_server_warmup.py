"""The server's startup warm-up (``serve`` without ``--no-warmup``): it leaves each session
empty, with fresh metrics, and the replies exactly as without it (real llama.cpp, tiny bundle)."""

from __future__ import annotations

from typing import Any

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


def test_the_warm_up_renders_the_chat_but_prefills_only_a_few_tokens() -> None:
    """Issue 42: the whole rendered message (43 tokens on SmolLM2) was prefilled at every
    start; a few tokens warm the runtime as well."""
    from eliza_backends.server.warmup import WARMUP_TEXT, WARMUP_TOKENS

    with open_stream(TINY_BUNDLE, backend="llama.cpp", **CFG) as stream:
        rendered = stream.chat_tokens([{"role": "user", "content": WARMUP_TEXT}])
        assert len(rendered) > WARMUP_TOKENS
        prefilled: list[int] = []
        prefill = stream.prefill

        def counted(ids: Any) -> Any:
            prefilled.append(len(ids))
            return prefill(ids)

        stream.prefill = counted  # type: ignore[method-assign,assignment]
        assert warm_up(stream) > 0
        assert prefilled == [WARMUP_TOKENS]
        assert stream.session.n_past == 0
