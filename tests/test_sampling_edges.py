"""Sampling parameters at their edges are served, the same way, on every backend (issue 15.11,
the mlx-lm part): ``top_k`` at or above the vocabulary keeps every token (it is no filter, as
``top_k=0``), and a ``repeat_last_n`` longer than the context sees the whole context (mlx-lm
raised ValueError for both)."""

from __future__ import annotations

import importlib.util
from typing import Any

import pytest
from conftest import TINY_BUNDLE

from eliza_backends import InferenceContext, StreamConfig, open_stream

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


def _reference_distribution(logits: Any, cfg: StreamConfig) -> dict[int, float]:
    """llama.cpp's chain written plainly: sort the whole row, top-k, top-p, min-p on the
    untempered distribution, then the tempered softmax."""
    import numpy as np

    vals = logits.astype(np.float64)
    order = np.argsort(-vals, kind="stable")
    if 0 < cfg.top_k < len(order):
        order = order[:cfg.top_k]
    probs = np.exp(vals[order] - vals[order[0]])
    probs /= probs.sum()
    n = len(order)
    if cfg.top_p < 1.0:
        n = min(n, int(np.searchsorted(np.cumsum(probs), cfg.top_p)) + 1)
    if cfg.min_p > 0.0:
        n = min(n, max(1, int(np.count_nonzero(probs >= cfg.min_p * probs[0]))))
    kept = np.exp((vals[order[:n]] - vals[order[0]]) / cfg.temperature)
    kept /= kept.sum()
    return dict(zip(order[:n].tolist(), kept.tolist(), strict=True))


@pytest.mark.parametrize("filters", [{}, {"top_k": 40}, {"top_p": 0.9}, {"top_p": 0.999},
                                     {"min_p": 0.05}, {"top_k": 500, "top_p": 0.8},
                                     {"top_p": 0.95, "min_p": 0.02}])
@pytest.mark.parametrize("spread", [1.0, 4.0])
def test_sampler_distribution_is_the_sorted_chain(filters: dict[str, Any], spread: float) -> None:
    """The sampler partitions and sorts only what the filters need; its distribution equals
    the whole-vocabulary sort's, on a Gemma-sized row (flat and peaked)."""
    import numpy as np

    from eliza_backends.runtime.sampling import Sampler

    rng = np.random.default_rng(3)
    logits = (rng.standard_normal(262_144) * spread).astype(np.float32)
    cfg = StreamConfig(temperature=0.7, seed=5, **filters)
    ids, probs = Sampler(cfg).distribution(logits)
    got = dict(zip(ids.tolist(), probs.tolist(), strict=True))
    want = _reference_distribution(logits, cfg)
    assert got.keys() == want.keys()
    assert max(abs(got[i] - want[i]) for i in want) < 1e-6
    assert abs(probs.sum() - 1.0) < 1e-9
    draws = {Sampler(cfg).sample(logits) for _ in range(3)}
    assert len(draws) == 1 and draws <= want.keys()  # seeded: the same draw each time
