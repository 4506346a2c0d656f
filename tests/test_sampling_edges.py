"""Sampling parameters at their edges are served, the same way, on every backend (issue 15.11,
the mlx-lm part): ``top_k`` at or above the vocabulary keeps every token (it is no filter, as
``top_k=0``), and a ``repeat_last_n`` longer than the context sees the whole context (mlx-lm
raised ValueError for both)."""

from __future__ import annotations

import importlib.util
from typing import Any

import pytest
from conftest import TINY_BUNDLE

from eliza_backends import InferenceContext, open_stream

BACKENDS = [
    pytest.param("llama.cpp", {}, "llama_cpp", id="llama.cpp"),
    pytest.param("litert-lm", {"litert-lm": {"session": "interpreter"}}, "ai_edge_litert",
                 id="litert"),
    pytest.param("mlx", {}, "mlx_lm", id="mlx"),
]


def _tokens(ctx: InferenceContext, backend: str, options: dict[str, Any], **cfg: Any
            ) -> list[int]:
    with open_stream(ctx, backend=backend, options=options, threads=1, max_tokens=12,
                     ignore_eos=True, context_size=256, batch_size=64, **cfg) as s:
        s.prefill("the quick brown fox")
        return [t for st in s for t in st.tokens]


@pytest.mark.parametrize(("backend", "options", "module"), BACKENDS)
def test_top_k_at_or_above_the_vocabulary_is_no_filter(backend: str, options: dict[str, Any],
                                                       module: str) -> None:
    if importlib.util.find_spec(module) is None:
        pytest.skip(f"{module} is not installed")
    with InferenceContext(TINY_BUNDLE) as ctx:
        with open_stream(ctx, backend=backend, options=options, threads=1) as probe:
            vocab = probe.session.vocab_size
        sampled = {"temperature": 0.9, "seed": 11}
        every = _tokens(ctx, backend, options, top_k=vocab, **sampled)
        for top_k in (vocab + 1, 10**9):
            assert _tokens(ctx, backend, options, top_k=top_k, **sampled) == every, top_k
        if backend != "llama.cpp":  # (llama.cpp's top-k stage sorts the candidates, so its
            # seeded draw differs from no top-k stage at all; the distribution is the same)
            assert _tokens(ctx, backend, options, top_k=0, **sampled) == every


@pytest.mark.parametrize(("backend", "options", "module"), BACKENDS)
def test_a_repeat_window_longer_than_the_context_is_the_context(
        backend: str, options: dict[str, Any], module: str) -> None:
    if importlib.util.find_spec(module) is None:
        pytest.skip(f"{module} is not installed")
    with InferenceContext(TINY_BUNDLE) as ctx:
        whole = _tokens(ctx, backend, options, repeat_penalty=1.3, repeat_last_n=256)
        for n in (257, 2**31, 2**40):
            assert _tokens(ctx, backend, options, repeat_penalty=1.3, repeat_last_n=n) == \
                whole, n
