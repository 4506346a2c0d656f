"""Speculative decoding: the n-gram drafter, the acceptance rule, and llama.cpp's drafters
keeping greedy output identical while reporting real per-step stats."""

from __future__ import annotations

import json

import pytest
from conftest import TINY_BUNDLE
from hypothesis import given
from hypothesis import strategies as st

from eliza_backends import open_stream
from eliza_backends.speculative import NgramDrafter, accept_greedy


def test_ngram_drafter_proposes_what_followed_the_last_match() -> None:
    d = NgramDrafter(max_n=3)
    seq = [1, 2, 3, 4, 5, 9, 1, 2, 3]
    assert d.propose(seq, 3) == [4, 5, 9]
    seq += [4]
    assert d.propose(seq, 2) == [5, 9]
    assert d.propose([7, 8], 4) == []
    assert NgramDrafter().propose([], 3) == [] and d.propose(seq, 0) == []


def test_ngram_drafter_prefers_the_longest_match() -> None:
    d = NgramDrafter(max_n=2)
    # "2" alone was last followed by 8, but "1 2" was followed by 3
    assert d.propose([1, 2, 3, 5, 2, 8, 1, 2], 1) == [3]


def test_ngram_drafter_truncate_forgets_the_rewound_part() -> None:
    d = NgramDrafter(max_n=2)
    seq = [5, 6, 7, 5, 6]
    assert d.propose(seq, 1) == [7]
    d.truncate(2)
    assert d.propose([5, 6, 1, 5, 6], 1) == [1]


@given(st.lists(st.integers(0, 5), max_size=60), st.integers(1, 6))
def test_ngram_incremental_index_equals_a_fresh_scan(seq: list[int], k: int) -> None:
    incremental = NgramDrafter(max_n=3)
    for i in range(1, len(seq) + 1):
        got = incremental.propose(seq[:i], k)
        assert got == NgramDrafter(max_n=3).propose(seq[:i], k)
        assert len(got) <= k


def test_accept_greedy_rule() -> None:
    target = [10, 11, 99, 13, 14]
    assert accept_greedy([10, 11, 12], target.__getitem__, lambda t: False) == (
        [10, 11, 99], 2)
    assert accept_greedy([10, 11], target.__getitem__, lambda t: False) == ([10, 11, 99], 2)
    assert accept_greedy([], target.__getitem__, lambda t: False) == ([10], 0)
    assert accept_greedy([10, 11, 99], target.__getitem__, lambda t: t == 11) == ([10, 11], 2)


ORACLE = json.loads((TINY_BUNDLE / "oracle.json").read_text()) if \
    (TINY_BUNDLE / "oracle.json").exists() else {"prompts": []}


@pytest.mark.parametrize("drafter", ["ngram", "model"])
@pytest.mark.parametrize("draft_length", [1, 4, 8])
def test_llama_cpp_drafters_keep_the_oracle(drafter: str, draft_length: int) -> None:
    pytest.importorskip("llama_cpp")
    drafted = accepted = 0
    for case in ORACLE["prompts"]:
        n = len(case["continuation_ids"])
        with open_stream(TINY_BUNDLE, backend="llama.cpp", threads=1, max_tokens=n,
                         ignore_eos=True, drafter=drafter, draft_length=draft_length) as s:
            s.prefill(case["prompt_ids"])
            steps = list(s)
            assert [t for st in steps for t in st.tokens] == case["continuation_ids"], \
                case["name"]
            assert all(0 <= st.accepted <= st.drafted for st in steps)
            assert s.metrics.drafted == sum(st.drafted for st in steps)
            drafted += s.metrics.drafted
            accepted += s.metrics.accepted
    assert drafted > 0 and 0 < accepted <= drafted


@pytest.mark.parametrize("drafter", ["ngram", "model"])
def test_speculative_sampling_keeps_the_target_distribution(drafter: str) -> None:
    """Temperature sampling with a drafter follows the standard acceptance rule: the joint
    distribution of generated tokens matches plain sampling (total variation over 300 seeds)."""
    pytest.importorskip("llama_cpp")
    from collections import Counter

    from eliza_backends import InferenceContext

    counts: dict[str, Counter[tuple[int, ...]]] = {}
    drafted = 0
    with InferenceContext(TINY_BUNDLE) as ctx:
        for kind in ("none", drafter):
            counts[kind] = Counter()
            for seed in range(300):
                with open_stream(ctx, backend="llama.cpp", threads=1, temperature=1.0,
                                 seed=seed, max_tokens=4, ignore_eos=True, drafter=kind,
                                 draft_length=3) as s:
                    s.prefill("Four score and seven years ago our fathers brought forth. "
                              "Four score and seven")
                    tokens = [t for st in s for t in st.tokens]
                    counts[kind][tuple(tokens[1:3])] += 1
                    drafted += s.metrics.drafted
    a, b = counts["none"], counts[drafter]
    tv = 0.5 * sum(abs(a[k] - b[k]) for k in set(a) | set(b)) / 300
    assert drafted > 300
    assert tv < 0.12, (tv, a.most_common(4), b.most_common(4))


def test_drafter_survives_rewinds() -> None:
    pytest.importorskip("llama_cpp")
    case = ORACLE["prompts"][0]
    with open_stream(TINY_BUNDLE, backend="llama.cpp", threads=1, max_tokens=32,
                     ignore_eos=True, drafter="model", draft_length=4) as s:
        s.prefill(case["prompt_ids"])
        s.text()
        keep = s.reset_keep(len(case["prompt_ids"]) - 2)
        s.prefill(case["prompt_ids"][keep:])
        assert [t for st in s for t in st.tokens] == case["continuation_ids"]
