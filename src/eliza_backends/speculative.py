"""Speculative decoding pieces every backend shares: the n-gram drafter and the acceptance rule.

A backend drafts ``k`` tokens, verifies them in one batched forward pass over
``[last, d1..dk]``, and keeps the longest agreeing prefix plus the target's own next token
(:func:`accept_greedy`). Greedy output is token-for-token identical to decoding without a
drafter; the step reports how many tokens were drafted and accepted.

:class:`NgramDrafter` is prompt lookup: it proposes what followed the most recent earlier
occurrence of the sequence's last n tokens (longest n first), from an incremental index, so a
proposal costs O(new tokens), not O(history).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any, Protocol


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
        """What followed the latest earlier match of the longest matching tail n-gram."""
        if k <= 0 or len(history) < 2:
            return []
        self._extend(history)
        length = len(history)
        for n in range(min(self.max_n, length - 1), self.min_n - 1, -1):
            e = self._index[n].get(tuple(history[length - n:]))
            if e is not None and e < length:
                return list(history[e:e + k])
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


__all__ = ["Drafter", "NgramDrafter", "accept_greedy", "accept_sampled"]
