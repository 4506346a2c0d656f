"""The records of continuous batching: what one step's batch holds for each sequence
(:class:`Piece`, handed to the backend's ``decode``), what each step did (:class:`StepRecord`)
and the totals a scheduler has counted (:class:`BatchStats`, ``/health``'s ``batch``). The
scheduler that makes them is :class:`~eliza_backends.runtime.batching.StepScheduler`."""

from __future__ import annotations

from collections import Counter
from collections.abc import Hashable, Iterable, Sequence
from dataclasses import dataclass
from typing import Any, NamedTuple


@dataclass(slots=True)
class Piece:
    """One sequence's part of one step's batch.

    ``tokens`` go at positions ``start..start+len-1`` of sequence ``seq``; the last
    ``n_outputs`` of them want outputs (logits) (0 for a piece that is not the share's last).
    ``row``: the index of ``tokens[0]`` in the step's flattened batch (the pieces before it
    hold ``row`` tokens), so token ``j`` is batch row ``row + j``. ``index``: the piece's
    place in the batch. ``final``: the share's last piece (its callback runs after this
    decode)."""

    seq: Hashable
    tokens: Sequence[int]
    start: int
    n_outputs: int
    row: int
    index: int
    final: bool

    @property
    def last_row(self) -> int:
        """The batch row of the piece's last token."""
        return self.row + len(self.tokens) - 1


class StepRecord(NamedTuple):
    """One step: how many sequences and tokens it decoded, how many of the sequences were
    decodes (every token with an output) and how many prefill tokens it carried, how long the
    leader gathered before it (seconds) and whether the window ran out (``waited_out``) with an
    expected sequence missing, and the decode's own time (seconds)."""

    sequences: int
    tokens: int
    decodes: int
    prefill_tokens: int
    gather_s: float
    waited_out: bool
    decode_s: float


@dataclass(frozen=True, slots=True)
class BatchStats:
    """Totals since the scheduler was made: ``steps``, ``tokens`` decoded, ``shares`` finished,
    ``failed`` / ``cancelled`` shares, ``waited_out`` steps, and ``batch_sizes`` (sequences per
    step -> steps). ``resubmit_lags``: recent delays (seconds) between a sequence's decode
    share finishing and its next decode share arriving (the per-token work between two steps
    of a stream: what :data:`GATHER_WINDOW_S` must cover)."""

    steps: int
    tokens: int
    shares: int
    failed: int
    cancelled: int
    waited_out: int
    batch_sizes: dict[int, int]
    resubmit_lags: tuple[float, ...]

    @property
    def mean_batch(self) -> float:
        """Sequences per step, on average (0.0 before the first step)."""
        n = sum(self.batch_sizes.values())
        return sum(k * v for k, v in self.batch_sizes.items()) / n if n else 0.0

    @classmethod
    def total(cls, parts: Iterable[BatchStats]) -> BatchStats:
        """The sum of several schedulers' totals (one context's batched runtimes)."""
        parts = list(parts)
        sizes: Counter[int] = Counter()
        for p in parts:
            sizes.update(p.batch_sizes)
        return cls(steps=sum(p.steps for p in parts), tokens=sum(p.tokens for p in parts),
                   shares=sum(p.shares for p in parts), failed=sum(p.failed for p in parts),
                   cancelled=sum(p.cancelled for p in parts),
                   waited_out=sum(p.waited_out for p in parts), batch_sizes=dict(sizes),
                   resubmit_lags=tuple(lag for p in parts for lag in p.resubmit_lags))

    def summary(self) -> dict[str, Any]:
        """The JSON-ready figures a server shows (``/health``'s ``batch``): ``steps``,
        ``tokens`` decoded, ``mean_sequences_per_step``, ``waited_out`` steps (the gather
        window ran out before every running sequence resubmitted), finished / ``failed`` /
        ``cancelled`` shares, and the recent resubmit lag's median and 99th percentile (ms)."""
        lags = sorted(self.resubmit_lags)

        def ms(q: float) -> float | None:
            return round(lags[min(len(lags) - 1, int(q * len(lags)))] * 1e3, 2) if lags else None

        return {"steps": self.steps, "tokens": self.tokens,
                "mean_sequences_per_step": round(self.mean_batch, 2),
                "waited_out": self.waited_out, "shares": self.shares, "failed": self.failed,
                "cancelled": self.cancelled, "resubmit_lag_ms_p50": ms(0.5),
                "resubmit_lag_ms_p99": ms(0.99)}


__all__ = ["BatchStats", "Piece", "StepRecord"]
