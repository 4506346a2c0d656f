"""Oracle parity in one place: every token-exact backend, through the seam, reproduces the
PyTorch oracle's greedy continuation of every oracle prompt (examples/bundles/tiny/oracle.json),
with and without each of its drafters. (The text-level LiteRT-LM engine is checked against the
oracle's text in test_litert_backend.py.)"""

from __future__ import annotations

import importlib.util
import json
from collections.abc import Iterator
from typing import Any

import pytest
from conftest import TINY_BUNDLE

from eliza_backends import InferenceContext, open_stream

ORACLE = json.loads((TINY_BUNDLE / "oracle.json").read_text())
CASES = ORACLE["prompts"]

#: (label, backend, module that must be installed, options, drafters it offers)
BACKENDS: list[tuple[str, str, str, dict[str, Any], tuple[str, ...]]] = [
    ("llama.cpp", "llama.cpp", "llama_cpp", {}, ("ngram", "model")),
    ("litert/interpreter", "litert-lm", "ai_edge_litert",
     {"litert-lm": {"session": "interpreter", "runtime": "interpreter"}}, ("ngram",)),
    ("litert/compiled", "litert-lm", "ai_edge_litert",
     {"litert-lm": {"session": "interpreter", "runtime": "compiled"}}, ("ngram",)),
    ("mlx", "mlx", "mlx_lm", {}, ("ngram", "model")),
]


def _params(with_drafters: bool) -> list[Any]:
    out = []
    for label, backend, module, options, drafters in BACKENDS:
        marks = [] if importlib.util.find_spec(module) else [
            pytest.mark.skip(reason=f"{module} is not installed")]
        for drafter in (drafters if with_drafters else ("none",)):
            out.append(pytest.param(backend, options, drafter, marks=marks,
                                    id=label if drafter == "none" else f"{label}-{drafter}"))
    return out


@pytest.fixture(scope="module")
def tiny() -> Iterator[InferenceContext]:
    ctx = InferenceContext(TINY_BUNDLE)
    yield ctx
    ctx.close()


@pytest.mark.parametrize(("backend", "options", "drafter"), _params(False))
@pytest.mark.parametrize("step", [1, 5])
def test_greedy_matches_the_oracle(tiny: InferenceContext, backend: str,
                                   options: dict[str, Any], drafter: str, step: int) -> None:
    for case in CASES:
        n = len(case["continuation_ids"])
        with open_stream(tiny, backend=backend, options=options, max_tokens=n,
                         ignore_eos=True, tokens_per_step=step, threads=1) as stream:
            stream.prefill(case["prompt_ids"])
            got = [t for s in stream for t in s.tokens]
        assert got == case["continuation_ids"], case["name"]


@pytest.mark.parametrize(("backend", "options", "drafter"), _params(True))
@pytest.mark.parametrize("draft_length", [1, 4, 8])
def test_drafters_keep_the_oracle(tiny: InferenceContext, backend: str, options: dict[str, Any],
                                  drafter: str, draft_length: int) -> None:
    """Greedy with a drafter equals the oracle on every prompt; every step reports its own
    drafted / accepted counts, and a default step is one round (at most k + 1 tokens)."""
    drafted = accepted = 0
    for case in CASES:
        n = len(case["continuation_ids"])
        with open_stream(tiny, backend=backend, options=options, threads=1, max_tokens=n,
                         ignore_eos=True, drafter=drafter, draft_length=draft_length,
                         draft_policy="fixed") as s:
            s.prefill(case["prompt_ids"])
            steps = list(s)
            assert [t for st in steps for t in st.tokens] == case["continuation_ids"], \
                case["name"]
            assert all(0 <= st.accepted <= st.drafted for st in steps)
            assert all(len(st.tokens) <= draft_length + 1 for st in steps)
            assert s.metrics.drafted == sum(st.drafted for st in steps)
            assert s.metrics.accepted == sum(st.accepted for st in steps)
            drafted += s.metrics.drafted
            accepted += s.metrics.accepted
    assert drafted > 0 and 0 <= accepted <= drafted
    if backend != "litert-lm":  # (LiteRT is checked for honest counts; it may accept none)
        assert accepted > 0
