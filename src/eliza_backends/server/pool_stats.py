"""The counters a :class:`~eliza_backends.server.pool.SessionPool` reports (``/health``)."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any


@dataclass
class PoolStats:
    """Counters of a pool (for ``/health`` and tests)."""

    sessions: int
    busy: int
    queued: int
    served: int
    cancelled: int
    reopened: int
    failed: int
    draining: bool
    #: sequences decoding together in one batched context (1: independent sessions)
    parallel: int = 1
    #: True when the sessions share one batched runtime context
    batched: bool = False
    #: how the sessions run, in words (says so when a backend does not batch)
    batching: str = ""
    #: requests generating now (each holds one sequence)
    active_sequences: int = 0
    #: completion tokens per second over the last ``tokens_window_s`` seconds, all slots
    tokens_per_second: float = 0.0
    tokens_window_s: float = 0.0
    #: completion tokens generated since the pool opened
    completion_tokens: int = 0
    #: the batched context's step totals (:meth:`BatchStats.summary`: steps, mean sequences
    #: per step, ...); None when the slots are not batched
    batch: dict[str, Any] | None = None
    #: the speculative drafter's totals since the pool opened (``drafter``, ``drafted`` and
    #: ``accepted`` tokens, ``acceptance``); None when the sessions do not draft
    draft: dict[str, Any] | None = None
    #: the prompt cache's counters (:meth:`PromptCache.stats`: ``hits``, ``misses``,
    #: ``entries``, ``bytes``, ``limit_bytes`` ...); None when it is off
    prompt_cache: dict[str, Any] | None = None
    steps_after_cancel: list[int] = field(default_factory=list)
    slots: list[dict[str, Any]] = field(default_factory=list)

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready form."""
        return dict(self.__dict__)


__all__ = ["PoolStats"]
