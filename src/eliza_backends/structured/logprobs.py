"""Log-probabilities of generated tokens: :class:`TokenLogprob` in every :class:`Step`.

A logprob here is the model's own: the log-softmax of the raw next-token logits, before the
repeat penalty, temperature, truncation and any constraint mask (vLLM's ``raw_logprobs``; the
number is then the same whatever the sampling settings, and comparable across backends). It is
computed in float64 from the backend's float32 logits, once, in the core
(:class:`LogprobRecorder`), for every backend that exposes logits
(``Capabilities.logits``).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    import numpy as np

#: Most alternatives a token may report (OpenAI's limit).
MAX_TOP_LOGPROBS = 20


@dataclass(frozen=True, slots=True)
class TopLogprob:
    """One alternative for a position: ``token`` id, its ``piece`` (the bytes it adds to the
    text; b"" for control tokens) and ``logprob`` (natural log)."""

    token: int
    piece: bytes
    logprob: float

    @property
    def text(self) -> str:
        """``piece`` as text (a partial UTF-8 character becomes U+FFFD)."""
        return self.piece.decode("utf-8", "replace")


@dataclass(frozen=True, slots=True)
class TokenLogprob:
    """The generated ``token`` at one position, its ``piece`` and ``logprob``, and the ``top``
    most likely tokens at that position (most likely first; as many as asked for)."""

    token: int
    piece: bytes
    logprob: float
    top: tuple[TopLogprob, ...] = ()

    @property
    def text(self) -> str:
        """``piece`` as text (a partial UTF-8 character becomes U+FFFD)."""
        return self.piece.decode("utf-8", "replace")


@dataclass(frozen=True, slots=True)
class RawLogprob:
    """What :class:`LogprobRecorder` keeps per token before the base class adds the pieces:
    (token, logprob) and the top alternatives as (token, logprob) pairs."""

    token: int
    logprob: float
    top: tuple[tuple[int, float], ...]


class LogprobRecorder:
    """Per position: :meth:`observe` the raw logits row before anything changes it, then
    :meth:`record` the token chosen. Owned by one generation; consumer thread only."""

    def __init__(self, top: int) -> None:
        import numpy as np

        self._np = np
        self.top = top
        self._lse = 0.0
        self._top: tuple[tuple[int, float], ...] = ()
        self._row: np.ndarray | None = None
        self.entries: list[RawLogprob] = []

    def observe(self, row: np.ndarray) -> None:
        """Read ``row`` (1-D float logits; the chosen token's value must survive any masking
        done after this call, which a mask that lets it through guarantees)."""
        np = self._np
        peak = float(row.max())
        self._lse = peak + float(np.log(np.exp((row - peak).astype(np.float64)).sum()))
        self._row = row
        k = self.top
        if k:
            idx = np.argpartition(-row, k - 1)[:k] if k < row.shape[0] else np.arange(
                row.shape[0])
            vals = row[idx]
            order = np.lexsort((idx, -vals))  # most likely first, ties by id
            self._top = tuple((int(idx[i]), float(vals[i]) - self._lse) for i in order)

    def record(self, token: int) -> None:
        """The token chosen from the row last observed."""
        assert self._row is not None, "observe() comes before record()"
        self.entries.append(RawLogprob(token, float(self._row[token]) - self._lse, self._top))
        self._row = None

    def take(self, n: int) -> list[RawLogprob]:
        """The first ``n`` recorded entries, removed."""
        out = self.entries[:n]
        del self.entries[:n]
        return out


__all__ = ["MAX_TOP_LOGPROBS", "LogprobRecorder", "RawLogprob", "TokenLogprob", "TopLogprob"]
