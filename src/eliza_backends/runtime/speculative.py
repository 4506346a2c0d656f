"""Speculative decoding, once for every backend: the loop, the drafters, the acceptance rules.

:func:`speculate` is the loop (mlx-lm's ``speculative_generate_step`` draws the same line): each
round the drafter proposes ``k`` tokens, the backend's ``verify`` step runs one forward pass
over ``[last, d1..dk]`` (batched where the runtime allows), keeps the longest agreeing prefix
plus the target's own next token (:func:`accept_greedy`, or :func:`accept_sampled` with
temperature) and rolls its cache back past the rest. Greedy output is token-for-token identical
to decoding without a drafter; the step reports how many tokens were drafted and accepted. A
session runs it through :meth:`eliza_backends.Session._speculate`, which also owns the drafter.

:class:`NgramDrafter` is prompt lookup: it proposes what followed the most recent earlier
occurrence of the sequence's last n tokens (longest n first; a loop shorter than the draft
continued round), from an incremental index, so a proposal costs O(new tokens), not
O(history). :class:`ModelDrafter` is the base of draft-model drafters: it keeps a small model's
cache in step with the target sequence; the backend supplies the forward pass and the cache
trim.
"""

from __future__ import annotations

import time
from abc import ABC, abstractmethod
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any, Protocol

from ..errors import BundleError

if TYPE_CHECKING:
    from .draft_policy import DraftPolicy

#: A backend's verify step: ``verify(sequence, drafts) -> (produced, accepted)``.
#: ``sequence`` is the whole sequence so far (its last token is the one the drafts follow;
#: read-only), ``drafts`` the proposal (maybe empty). It feeds the runtime, applies the
#: acceptance rule, rolls the cache back past rejected drafts, and returns the tokens the round
#: produced (1..len(drafts) + 1, ending at an end token) and how many drafts were accepted.
Verify = Callable[[Sequence[int], list[int]], tuple[list[int], int]]


class Drafter(Protocol):
    """What a backend's speculative loop needs from a drafter."""

    def propose(self, history: Sequence[int], k: int) -> list[int]:
        """Up to ``k`` draft tokens continuing ``history`` ([] when there is nothing to say)."""
        ...

    def truncate(self, n: int) -> None:
        """The sequence was rewound to its first ``n`` tokens."""
        ...

    def close(self) -> None:
        """Free what the drafter holds."""
        ...


class NgramDrafter:
    """Prompt-lookup drafter over the sequence itself (no model)."""

    def __init__(self, max_n: int = 3, min_n: int = 1) -> None:
        if not 1 <= min_n <= max_n:
            raise ValueError("need 1 <= min_n <= max_n")
        self.max_n, self.min_n = max_n, min_n
        self._index: dict[int, dict[tuple[int, ...], int]] = {n: {} for n in range(min_n,
                                                                                   max_n + 1)}
        self._upto = 0  # continuation positions < _upto are indexed

    def _extend(self, history: Sequence[int]) -> None:
        end = len(history)
        for e in range(max(self._upto, 1), end):
            for n, table in self._index.items():
                if e >= n:
                    table[tuple(history[e - n:e])] = e
        self._upto = max(self._upto, end)

    def propose(self, history: Sequence[int], k: int) -> list[int]:
        """What followed the latest earlier match of the longest matching tail n-gram, ``k``
        tokens when there is a match. A match closer than ``k`` to the end (a loop: the text
        repeats with a period shorter than the draft) continues the loop: the continuation runs
        into the drafts themselves, so a round is not cut short where drafting pays most."""
        if k <= 0 or len(history) < 2:
            return []
        self._extend(history)
        length = len(history)
        for n in range(min(self.max_n, length - 1), self.min_n - 1, -1):
            e = self._index[n].get(tuple(history[length - n:]))
            if e is not None and e < length:
                drafts = list(history[e:e + k])
                period = length - e
                while len(drafts) < k:
                    drafts.append(drafts[len(drafts) - period])
                return drafts
        return []

    def truncate(self, n: int) -> None:
        """Drop index entries that point at or past position ``n``."""
        if n >= self._upto:
            return
        for table in self._index.values():
            stale = [key for key, e in table.items() if e >= n]
            for key in stale:
                del table[key]
        self._upto = n

    def close(self) -> None:
        """Nothing to free."""


class ModelDrafter(ABC):
    """Greedy drafts from a small model sharing the target's vocabulary, its cache kept in step
    with the target sequence: before each proposal it drops what diverged (rejected drafts, a
    rewind), feeds what is new, then drafts ``k`` tokens. Subclasses supply the runtime calls.

    ``_tokens`` is what the draft cache holds; its first ``_synced`` tokens are known to equal
    the target sequence (a rewind lowers it through :meth:`truncate`).
    """

    def __init__(self, name: str, vocab_size: int, target_vocab_size: int) -> None:
        """``name``: the draft artifact, for messages. A draft model must share the target's
        vocabulary: :class:`BundleError` when the sizes differ."""
        if vocab_size != target_vocab_size:
            raise BundleError(f"draft model {name} has {vocab_size} tokens, the target "
                              f"{target_vocab_size}: a draft model must share the target's "
                              "vocabulary")
        self._tokens: list[int] = []
        self._synced = 0

    @abstractmethod
    def _forward(self, feed: list[int], k: int) -> list[int]:
        """Feed ``feed`` (non-empty) after the cached tokens, then draft ``k`` tokens greedily,
        feeding each draft but the last; return the drafts."""

    @abstractmethod
    def _drop(self, n: int) -> bool:
        """Drop cache positions ``>= n``; False when the runtime cannot."""

    @abstractmethod
    def _clear(self) -> None:
        """Empty the cache."""

    def propose(self, history: Sequence[int], k: int) -> list[int]:
        """Sync with ``history`` and draft ``k`` tokens greedily."""
        if k <= 0 or not history:
            return []
        n = min(len(self._tokens), len(history))
        p = min(self._synced, n)
        while p < n and self._tokens[p] == history[p]:
            p += 1
        if p == len(history):  # everything is cached: re-feed the last token for its logits
            p -= 1
        self.truncate(p)
        p = min(p, len(self._tokens))  # 0 when the cache could not be trimmed
        feed = list(history[p:])
        try:
            drafts = self._forward(feed, k)
        except BaseException:
            self._forget()  # the cache may hold part of a feed: start over next time
            raise
        self._tokens += feed
        self._tokens += drafts[:-1]  # fed while drafting (the last draft is not)
        self._synced = len(history)
        return drafts

    def truncate(self, n: int) -> None:
        """Forget cache positions from ``n`` on."""
        if n < len(self._tokens):
            if not self._drop(n):
                self._forget()
                return
            del self._tokens[n:]
        self._synced = min(self._synced, n)

    def _forget(self) -> None:
        self._clear()
        self._tokens = []
        self._synced = 0


def speculate(drafter: Drafter, sequence: Sequence[int], max_tokens: int, draft_length: int,
              verify: Verify, is_end: Callable[[int], bool],
              check_cancel: Callable[[], None], policy: DraftPolicy | None = None, *,
              whole_rounds: bool = False) -> tuple[list[int], int, int]:
    """Draft/verify rounds continuing ``sequence`` until ``max_tokens`` tokens or an end token.

    Each round: ``check_cancel()``, ``k = min(draft_length, tokens left - 1)`` drafts from
    ``drafter`` (with a ``policy``: ``min(policy.next_length(), draft_length, ...)``, 0 meaning a
    plain one-token round; the policy sees every round's acceptance and time), then
    ``verify``. ``whole_rounds``: once there are tokens, stop (fewer than ``max_tokens``)
    rather than cut the next round's drafts to fit; for a step whose size is only a round's
    worth (a cut round is the costly kind: on Gemma 3 a 3-token pass costs more than a 4-token
    one). Returns (tokens produced, drafts proposed, drafts accepted).
    """
    seq = list(sequence)
    out: list[int] = []
    drafted = accepted = 0
    while len(out) < max_tokens:
        check_cancel()
        want = draft_length if policy is None else min(policy.next_length(), draft_length)
        left = max_tokens - len(out)
        if whole_rounds and out and want >= left:
            break
        k = min(want, left - 1)
        shadow: list[int] = []
        if k > 0:
            t0 = time.perf_counter()
            drafts = drafter.propose(seq, k)
            if policy is not None:
                policy.observe_drafting(time.perf_counter() - t0, len(drafts))
        else:
            drafts = []
            if policy is not None and policy.shadow():
                shadow = drafter.propose(seq, 1)
        t0 = time.perf_counter()
        produced, n_ok = verify(seq, drafts)
        if policy is not None:
            policy.observe_round(len(drafts) + 1, time.perf_counter() - t0)
            if drafts:
                policy.observe(len(drafts), n_ok)
            elif shadow:
                policy.observe(1, int(shadow[0] == produced[0]))
        out += produced
        seq += produced
        drafted += len(drafts)
        accepted += n_ok
        if is_end(produced[-1]):
            break
    return out, drafted, accepted


def accept_greedy(drafts: Sequence[int], target: Callable[[int], int],
                  is_end: Callable[[int], bool]) -> tuple[list[int], int]:
    """The greedy acceptance rule; returns (tokens this round produces, drafts accepted).

    ``target(i)`` is the target model's token after ``[last, d1..di]`` (position i of the
    verification batch). The round produces the longest prefix of ``drafts`` the target agrees
    with, then the target's own next token, stopping early after an end token.
    """
    out: list[int] = []
    for i, d in enumerate(drafts):
        t = target(i)
        out.append(t)
        if t != d:
            return out, i
        if is_end(t):
            return out, i + 1
    out.append(target(len(drafts)))
    return out, len(drafts)


def accept_sampled(drafts: Sequence[int], target: Callable[[int], tuple[Any, Any]],
                   sampler: Any, is_end: Callable[[int], bool]) -> tuple[list[int], int]:
    """The speculative sampling rule for deterministic drafts (n-gram lookup, greedy draft
    model: the proposal puts all its mass on the draft token), keeping the target distribution.

    ``target(i)`` is the target's (ids, probs) after ``[last, d1..di]``; ``sampler`` provides
    ``uniform()`` and ``choose(ids, probs)``. Draft ``d`` is accepted with probability p(d);
    on rejection the token is drawn from p with d removed (renormalised), which is
    ``max(p - q, 0)`` for a one-hot q. Returns (tokens produced, drafts accepted).
    """
    out: list[int] = []
    for i, d in enumerate(drafts):
        ids, probs = target(i)
        hit = ids == d
        p_d = float(probs[hit].sum())
        if sampler.uniform() < p_d:
            out.append(d)
            if is_end(d):
                return out, i + 1
            continue
        rest = probs * ~hit
        total = float(rest.sum())
        out.append(sampler.choose(ids, rest / total) if total > 0 else int(ids[0]))
        return out, i
    ids, probs = target(len(drafts))
    out.append(sampler.choose(ids, probs))
    return out, len(drafts)


__all__ = ["Drafter", "ModelDrafter", "NgramDrafter", "Verify", "accept_greedy", "accept_sampled",
           "speculate"]
