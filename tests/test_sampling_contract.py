"""One sampling contract under every option (issue 41), on the real runtimes and the tiny bundles.

* **The repeat penalty has one definition**: the window is the last ``repeat_last_n`` tokens of
  the session's sequence, prompt and generated alike (llama.cpp's ``penalty_last_n`` as
  llama-server applies it: the prompt goes through the sampler too), applied by the core's
  :class:`~eliza_backends.runtime.sampling.Sampler`. So greedy decoding with a drafter (n-gram,
  draft model, Gemma 4's MTP assistant) is token for token greedy decoding without one, under
  any sampling settings, on every backend that drafts (llama.cpp, MLX, LiteRT), and llama.cpp,
  MLX and LiteRT produce the same greedy tokens with a penalty.
* **A seed repeats its answer whatever else runs**: a seeded sampled stream gives the same
  tokens served alone and as one row of a batched context with another stream decoding beside
  it, under every sampling option, on every backend.

Full tier (the matrix loads three runtimes); tests/test_contract_edges.py has the quick checks.
"""

from __future__ import annotations

import importlib.util
import threading
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from conftest import ROOT, TINY_BUNDLE
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from eliza_backends import InferenceContext, open_stream

GEMMA4_TINY = ROOT / "examples" / "bundles" / "gemma4-tiny"
#: backend -> (its name, options, the module it needs)
BACKENDS: dict[str, tuple[str, dict[str, Any], str]] = {
    "llama.cpp": ("llama.cpp", {}, "llama_cpp"),
    "mlx": ("mlx", {}, "mlx_lm"),
    "litert": ("litert-lm", {"litert-lm": {"session": "interpreter"}}, "ai_edge_litert"),
}
#: (backend, drafter, bundle) for every drafter a backend has on the tiny bundles
DRAFTED = [("llama.cpp", "ngram", TINY_BUNDLE), ("llama.cpp", "model", TINY_BUNDLE),
           ("llama.cpp", "mtp", GEMMA4_TINY), ("mlx", "ngram", TINY_BUNDLE),
           ("mlx", "model", TINY_BUNDLE), ("litert", "ngram", TINY_BUNDLE)]
PROMPTS = ["the quick brown fox", "Four score and seven years ago",
           "We hold these truths to be self-evident,"]
BASE: dict[str, Any] = {"context_size": 256, "batch_size": 64, "threads": 1,
                        "ignore_eos": True}
N = 20


def _needs(backend: str) -> None:
    if importlib.util.find_spec(BACKENDS[backend][2]) is None:
        pytest.skip(f"{BACKENDS[backend][2]} is not installed")


def _tokens(ctx: InferenceContext | Path, backend: str, prompt: str, **cfg: Any) -> list[int]:
    name, options, _ = BACKENDS[backend]
    with open_stream(ctx, {**BASE, "max_tokens": N, **cfg}, backend=name,
                     options=options) as s:
        s.prefill(prompt)
        return [t for step in s for t in step.tokens]


# --------------------------------------------------------------------------- drafters


greedy_settings = st.fixed_dictionaries({
    "repeat_penalty": st.sampled_from([1.0, 0.7, 1.15, 1.5, 3.0, 10.0]),
    "repeat_last_n": st.sampled_from([0, 1, 3, 8, 64, 4096]),
    "top_k": st.sampled_from([0, 1, 5, 40]),
    "top_p": st.sampled_from([1.0, 0.9, 0.1]),
    "min_p": st.sampled_from([0.0, 0.05, 0.5]),
    "seed": st.integers(0, 2**31 - 1),
    "draft_length": st.integers(1, 6),
    "prompt": st.sampled_from(PROMPTS),
})


@pytest.mark.parametrize("backend, drafter, bundle", DRAFTED,
                         ids=[f"{b}-{d}" for b, d, _ in DRAFTED])
@settings(max_examples=10, deadline=None, derandomize=True,
          suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(drawn=greedy_settings)
def test_greedy_with_a_drafter_is_greedy_without(backend: str, drafter: str, bundle: Path,
                                                 drawn: dict[str, Any]) -> None:
    """Any sampling settings under greedy (temperature 0): the drafter changes no token."""
    _needs(backend)
    cfg = dict(drawn)
    prompt = cfg.pop("prompt")
    with InferenceContext(bundle) as ctx:
        plain = _tokens(ctx, backend, prompt, temperature=0.0, **cfg)
        drafted = _tokens(ctx, backend, prompt, temperature=0.0, drafter=drafter, **cfg)
    assert drafted == plain, cfg


@pytest.mark.parametrize("backend, drafter, bundle", DRAFTED,
                         ids=[f"{b}-{d}" for b, d, _ in DRAFTED])
@pytest.mark.parametrize("penalty, last_n", [(1.3, 64), (3.0, 8), (0.8, 4096), (10.0, 1)])
def test_greedy_penalty_with_a_drafter(backend: str, drafter: str, bundle: Path,
                                       penalty: float, last_n: int) -> None:
    """The table behind the drawn test: each drafter, each penalty, every prompt."""
    _needs(backend)
    cfg = {"temperature": 0.0, "repeat_penalty": penalty, "repeat_last_n": last_n,
           "draft_length": 4}
    with InferenceContext(bundle) as ctx:
        for prompt in PROMPTS:
            plain = _tokens(ctx, backend, prompt, **cfg)
            assert _tokens(ctx, backend, prompt, drafter=drafter, **cfg) == plain, prompt


@pytest.mark.parametrize("penalty, last_n", [(1.3, 64), (3.0, 8), (10.0, 4096), (0.8, 2)])
def test_every_backend_penalizes_the_same_window(penalty: float, last_n: int) -> None:
    """Greedy with a repeat penalty: llama.cpp, MLX and LiteRT give the same tokens (the
    window covers the prompt on each: at a penalty of 10 the prompt's own tokens lose)."""
    got: dict[str, list[list[int]]] = {}
    for backend in BACKENDS:
        if importlib.util.find_spec(BACKENDS[backend][2]) is None:
            continue
        with InferenceContext(TINY_BUNDLE) as ctx:
            got[backend] = [_tokens(ctx, backend, p, temperature=0.0, repeat_penalty=penalty,
                                    repeat_last_n=last_n) for p in PROMPTS]
    assert "llama.cpp" in got and len(got) >= 2, "needs llama.cpp and another backend"
    for backend, tokens in got.items():
        assert tokens == got["llama.cpp"], backend


# --------------------------------------------------------------------------- seeds and batches

#: sampled settings where the tiny model's peaked distributions still leave a choice (at a
#: temperature near 1 its replies are its greedy ones, and would prove nothing)
SAMPLED = [
    {"temperature": 2.5},
    {"temperature": 6.0, "top_k": 100},
    {"temperature": 6.0, "top_p": 0.9999},
    {"temperature": 3.0, "min_p": 1e-6},
    {"temperature": 3.0, "repeat_penalty": 1.4, "repeat_last_n": 16},
    {"temperature": 3.0, "top_k": 50, "top_p": 0.9999999, "min_p": 1e-9, "repeat_penalty": 0.9},
]
BATCHING = ["llama.cpp", "mlx", "litert"]


def _beside(ctx: InferenceContext, backend: str, run: Callable[[], list[int]]) -> list[int]:
    """``run()`` while another sampled stream decodes on ``ctx`` (another prompt and seed)."""
    started = threading.Event()
    stop = threading.Event()
    errors: list[BaseException] = []

    def other() -> None:
        try:
            name, options, _ = BACKENDS[backend]
            with open_stream(ctx, {**BASE, "max_tokens": 4 * N, "temperature": 1.0,
                                   "seed": 99}, backend=name, options=options) as s:
                s.prefill("Ships that passed in the dark")
                started.set()
                for _ in s:
                    if stop.is_set():
                        break
        except BaseException as exc:
            errors.append(exc)
            started.set()

    thread = threading.Thread(target=other, daemon=True)
    thread.start()
    started.wait(60)
    try:
        return run()
    finally:
        stop.set()
        thread.join(60)
        assert not errors, errors


@pytest.mark.parametrize("backend", BATCHING)
@pytest.mark.parametrize("sampling", SAMPLED, ids=lambda s: ",".join(s))
def test_a_seed_repeats_its_answer_batched_or_alone(backend: str,
                                                    sampling: dict[str, Any]) -> None:
    _needs(backend)
    cfg = {**sampling, "seed": 1234}
    prompt = PROMPTS[1]
    alone = _tokens(TINY_BUNDLE, backend, prompt, **cfg)
    assert alone != _tokens(TINY_BUNDLE, backend, prompt, temperature=0.0), "nothing sampled"
    with InferenceContext(TINY_BUNDLE, parallel=2) as ctx:
        batched = _beside(ctx, backend, lambda: _tokens(ctx, backend, prompt, **cfg))
        again = _tokens(ctx, backend, prompt, **cfg)  # a row alone on the batched context
    assert batched == alone
    assert again == alone
