"""Speculative decoding: the n-gram drafter, the acceptance rule, the core loop and the
draft-model sync, and llama.cpp's drafters keeping the target distribution and following
rewinds (greedy parity with the oracle on every backend: test_oracle_parity.py)."""

from __future__ import annotations

import json
from collections.abc import Sequence

import pytest
from conftest import TINY_BUNDLE
from hypothesis import given
from hypothesis import strategies as st

from eliza_backends import open_stream
from eliza_backends.runtime.speculative import ModelDrafter, NgramDrafter, accept_greedy


def test_ngram_drafter_proposes_what_followed_the_last_match() -> None:
    d = NgramDrafter(max_n=3)
    seq = [1, 2, 3, 4, 5, 9, 1, 2, 3]
    assert d.propose(seq, 3) == [4, 5, 9]
    seq += [4]
    assert d.propose(seq, 2) == [5, 9]
    assert d.propose([7, 8], 4) == []
    # a match near the end: the loop it starts is continued to k tokens
    assert NgramDrafter(max_n=3).propose([1, 2, 3, 4, 5, 9, 1, 2, 3], 8) == [4, 5, 9, 1, 2, 3,
                                                                         4, 5]
    assert NgramDrafter(max_n=3).propose([7, 1, 7, 1, 7], 5) == [1, 7, 1, 7, 1]
    assert NgramDrafter(max_n=1).propose([3, 3], 4) == [3, 3, 3, 3]
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
        assert len(got) in (0, k)


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
                                 draft_length=3, draft_policy="fixed") as s:
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


# ----------------------------------------------------------------------------- the core loop


def _target(seq: list[int]) -> int:
    """A toy target model: the next token is a function of the last two."""
    return (seq[-1] * 3 + (seq[-2] if len(seq) > 1 else 0)) % 7


def test_speculate_equals_plain_greedy_and_counts_honestly() -> None:
    from eliza_backends.runtime.speculative import speculate

    calls: list[list[int]] = []

    def verify(seq: Sequence[int], drafts: list[int]) -> tuple[list[int], int]:
        calls.append(list(drafts))
        ctx = list(seq)
        return accept_greedy(drafts, lambda i: _target(ctx + drafts[:i]), lambda t: False)

    start = [1, 2, 3, 1, 2, 3, 1, 2]
    plain = list(start)
    for _ in range(20):
        plain.append(_target(plain))
    tokens, drafted, accepted = speculate(NgramDrafter(), start, 20, 4, verify,
                                          lambda t: False, lambda: None)
    assert tokens == plain[len(start):]
    assert drafted == sum(len(c) for c in calls) and 0 <= accepted <= drafted
    assert all(len(c) <= 4 for c in calls)


def test_whole_rounds_end_the_step_instead_of_cutting_a_round() -> None:
    """A default step (whole rounds) never verifies a round cut to fit what is left of it: after
    a round of 4 in a 5-token step it stops at 4, where a sized step cuts a 0-draft round."""
    from eliza_backends.runtime.speculative import speculate

    def run(whole: bool) -> tuple[list[int], list[int]]:
        sizes: list[int] = []

        def verify(seq: Sequence[int], drafts: list[int]) -> tuple[list[int], int]:
            sizes.append(len(drafts))
            return [*drafts, 7], len(drafts)  # every draft accepted

        seq = [7, 7, 7, 7]
        tokens, _, _ = speculate(NgramDrafter(), seq, 5, 3, verify, lambda t: False,
                                 lambda: None, whole_rounds=whole)
        return tokens, sizes

    assert run(True) == ([7] * 4, [3])
    assert run(False) == ([7] * 5, [3, 0])


def test_speculate_stops_at_an_end_token_and_checks_cancel_each_round() -> None:
    from eliza_backends import CancelledError
    from eliza_backends.runtime.speculative import speculate

    rounds = []

    def verify(seq: Sequence[int], drafts: list[int]) -> tuple[list[int], int]:
        rounds.append(1)
        return [9] if len(rounds) == 3 else [5], 0

    tokens, _, _ = speculate(NgramDrafter(), [1, 2], 10, 2, verify, lambda t: t == 9,
                             lambda: None)
    assert tokens == [5, 5, 9]

    def cancel() -> None:
        if len(rounds) >= 4:
            raise CancelledError("stop")

    with pytest.raises(CancelledError):
        speculate(NgramDrafter(), [1, 2], 10, 2, verify, lambda t: False, cancel)


class _ListDrafter(ModelDrafter):
    """A model drafter over a pure-Python "cache" (a list), recording what it is fed."""

    def __init__(self, droppable: bool = True) -> None:
        super().__init__("list", 7, 7)
        self.cache: list[int] = []
        self.fed: list[list[int]] = []
        self.droppable = droppable

    def _forward(self, feed: list[int], k: int) -> list[int]:
        assert feed, "a proposal always feeds at least the last token"
        assert len(self.cache) == len(self._tokens)
        self.cache += feed
        self.fed.append(list(feed))
        drafts = []
        for i in range(k):
            drafts.append(_target(self.cache))
            if i < k - 1:
                self.cache.append(drafts[-1])
        return drafts

    def _drop(self, n: int) -> bool:
        if not self.droppable:
            return False
        del self.cache[n:]
        return True

    def _clear(self) -> None:
        self.cache = []

    def close(self) -> None:
        self.cache = []


def test_model_drafter_feeds_only_what_is_new_and_drops_what_diverged() -> None:
    d = _ListDrafter()
    drafts = d.propose([1, 2, 3], 3)
    assert drafts[0] == _target([1, 2, 3]) and len(drafts) == 3
    assert d.fed == [[1, 2, 3]]
    d.propose([1, 2, 3, 4], 2)  # the first draft was rejected: drop it, feed 4
    assert d.fed[-1] == [4] and d.cache[:4] == [1, 2, 3, 4]
    d.propose([1, 2, 3, 4], 2)  # nothing new: the last token is fed again for its logits
    assert d.fed[-1] == [4]
    d.truncate(2)
    d.propose([1, 2, 7], 1)
    assert d.fed[-1] == [7] and d.cache[:3] == [1, 2, 7]


def test_model_drafter_resyncs_when_the_sequence_shrinks_between_proposals() -> None:
    """The drift the two plugin copies had: with ``p = synced`` (no ``min``) a history shorter
    than the synced length fed nothing and drafted from stale logits."""
    d = _ListDrafter()
    d.propose([1, 2, 3, 4, 5, 6], 3)
    d.propose([1, 2, 3], 2)  # shorter, and nobody called truncate
    assert d.fed[-1] == [3] and d.cache[:3] == [1, 2, 3]


def test_model_drafter_starts_over_when_its_cache_cannot_be_trimmed() -> None:
    d = _ListDrafter(droppable=False)
    d.propose([1, 2, 3], 2)
    d.propose([1, 2, 9], 2)
    assert d.fed[-1] == [1, 2, 9] and d.cache[:3] == [1, 2, 9]


def test_kv_cursor_lazy_by_one_rule() -> None:
    from eliza_backends.runtime.kv_cursor import KVCursor

    kv = KVCursor()
    history = [10, 11, 12, 13, 14]
    kv.n_kv, kv.pending = 4, [14]  # after a step: the last sampled token waits
    assert kv.truncate(history, 2) is True and (kv.n_kv, kv.pending) == (2, [])
    kv.n_kv, kv.pending = 4, [14]
    assert kv.truncate(history, 5) is False and (kv.n_kv, kv.pending) == (4, [14])
    kv.n_kv, kv.pending = 2, []
    assert kv.truncate(history, 4) is False and kv.pending == [12, 13]
    assert kv.restore(history, 5) is True and (kv.n_kv, kv.pending) == (4, [14])
    assert kv.restore(history, 3) is False and (kv.n_kv, kv.pending) == (3, [13, 14])
    kv.reset()
    assert (kv.n_kv, kv.pending) == (0, [])
