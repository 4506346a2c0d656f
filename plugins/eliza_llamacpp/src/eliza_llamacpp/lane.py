"""The contracts a llama.cpp session decodes through: :class:`Lane`, the sequence it drives (its
own context, :mod:`~eliza_llamacpp.solo`, or one sequence of a shared one,
:mod:`~eliza_llamacpp.batch_engine`), and :class:`TargetLinkedDrafter`, a drafter that reads
that sequence's context (Gemma 4's MTP assistant, :mod:`~eliza_llamacpp.mtp`).

Protocols only: the session imports this module, the lanes and drafters implement it.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any, Protocol, TypeVar

from eliza_backends.backend import Drafter

from .llama_context import Outputs

if TYPE_CHECKING:  # imported by the batched path only (issue 42)
    from eliza_backends.backend import StepScheduler

R = TypeVar("R")


class TargetLinkedDrafter(Drafter, Protocol):
    """A drafter built on the session's own ``llama_context`` (Gemma 4's MTP assistant reads
    the target's KV cache and hidden states): the session builds it once its context exists,
    owns it like any drafter, and reports every decode on that context to it."""

    def target_decoded(self, start: int, tokens: Sequence[int], outputs: Outputs) -> None:
        """The session's context just decoded ``tokens`` at positions ``start..`` with outputs
        for ``outputs`` (as :func:`~eliza_llamacpp.llama_context.fill_batch` sets them). Called
        right after each successful ``llama_decode`` of the sequence, on the session's thread,
        before anything else runs on that context (the hidden rows are read here; the next
        decode overwrites them)."""
        ...


class Lane(Protocol):
    """One sequence of a ``llama_context``, as a session drives it: its own context
    (:class:`~eliza_llamacpp.solo.SoloLane`, sequence 0) or one sequence of a context shared by
    ``parallel`` sessions and decoded in batched steps (:class:`~eliza_llamacpp.batch_engine.
    SharedLane`). The session's sampling, drafting and bookkeeping are the same on both; only
    this interface differs. Used on the session's consumer thread."""

    #: The ``llama_context`` whose output rows the ``then`` callbacks read.
    ctx: Any
    #: The most tokens a decode with outputs for every token may carry.
    n_batch: int
    #: The most drafts one verify should carry (a shared context: the sequence's share of the
    #: batch, so every sequence's verify fits one step with room for a prefill piece).
    draft_cap: int
    #: The step scheduler of a shared context (None: an own context).
    scheduler: StepScheduler | None
    #: Positions this sequence may use (the session's context window).
    n_ctx: int
    #: True when the sequence shares its context with others (decoded in batched steps).
    batched: bool
    #: True when the outputs of the lane's last decode stay readable until its next one
    #: (its own context); False: only inside the decode's ``then`` callback.
    keeps_logits: bool
    #: The session's C-level abort callback, polled inside a long ``llama_decode`` (own
    #: contexts; a shared one stops a cancelled sequence between steps instead).
    abort: Any
    #: A drafter reading this lane's context, told of every decode (own contexts only).
    linked: TargetLinkedDrafter | None

    def decode(self, tokens: list[int], start: int, outputs: Outputs,
               then: Callable[[int], R], cancelled: Callable[[], bool]) -> R:
        """Decode ``tokens`` at positions ``start..`` (``"all"``: at most :attr:`n_batch` of
        them; otherwise any number, in pieces), then return ``then(last_row)`` run while the
        outputs are readable; ``last_row`` is the output row of the last token (with
        ``"all"``, token ``j`` is row ``last_row - len(tokens) + 1 + j``). Raises
        :class:`~eliza_backends.CancelledError` when ``cancelled()`` turned true before the
        last piece (positions at ``start..`` may then be held: the caller drops them),
        :class:`~eliza_backends.BackendRuntimeError` when llama.cpp fails."""
        ...

    def media(self, start: int, run: Callable[[Any, int, int], int], mark: int) -> int:
        """Decode a media block at ``start``: ``run(ctx, seq_id, start)`` does it (libmtmd's
        encoder and embedding decode) and returns the next position, which this returns. On
        a shared context it runs alone, between steps, on the calling thread, and its
        positions are recorded as ``mark`` (a negative id derived from the media's digest,
        never a token), so a prefix is shared with another sequence only where that one holds
        the same media at the same place."""
        ...

    def drop(self, p0: int) -> bool:
        """Drop the positions ``p0..`` of the sequence (False: llama.cpp cannot)."""
        ...

    def clear(self) -> None:
        """Drop every position of the sequence."""
        ...

    def pos_max(self) -> int:
        """The last position the sequence holds (-1: none)."""
        ...

    def pos_min(self) -> int:
        """The first position the sequence holds (-1: none; above 0 when a sliding-window
        cache holds only the window's last positions, as after restoring a saved state)."""
        ...

    def save(self) -> memoryview:
        """The sequence's state (``llama_state_seq_get_data``), a writable view of a buffer
        the caller owns; empty when llama.cpp fails."""
        ...

    def load(self, state: bytes | memoryview, tokens: Sequence[int]) -> bool:
        """Replace the sequence by a saved state holding ``tokens``; False when llama.cpp
        refuses it (the sequence is then empty)."""
        ...

    def idle(self) -> None:
        """The sequence's stream ended: it will not ask for a decode soon."""
        ...

    def batch_cost(self, token: int, n_kv: int, max_n: int) -> list[float] | None:
        """The seconds of one decode of n = 1..max_n tokens after position ``n_kv`` (see
        :meth:`eliza_backends.Session._batch_cost`); None where it cannot be measured alone
        (a shared context)."""
        ...

    def close(self) -> None:
        """Free what the lane owns (idempotent)."""
        ...


__all__ = ["Lane", "TargetLinkedDrafter"]
