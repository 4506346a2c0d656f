"""Repair after a failed or interrupted session call: the history and the KV cache back in step.

A call that fails (an exception from the runtime) or is interrupted after its last safe point
(a deferred Ctrl-C) may have changed the KV cache without the history, or the other way round.
:class:`Repair` puts the history back to the length it had and makes the cache hold exactly
that again (a truncate, or a reset, and a re-fed last token when there were logits to sample
from). When the repair itself fails, the session refuses calls with
:class:`~eliza_backends.errors.CancelledError` until a rewind.

Owned by one session; runs on its consumer thread with the lock held, and calls the backend's
hooks (``_reset``, ``_truncate``, ``_prefill``) as the session would.
"""

from __future__ import annotations

from ..errors import (
    CancelledError,
    ConstraintError,
    InvalidArgumentError,
    SessionClosedError,
    SlotError,
    UnsupportedOperationError,
)
from ..runtime.text import AssemblerState
from .guard import SessionGuard
from .hooks import SessionHooks
from .media_seq import SessionMedia
from .speculation import Speculation
from .turn import Turn


class Repair:
    """The repair of one session: its history (the live list) and media spans, turn, guard,
    speculation and hooks (the session itself)."""

    def __init__(self, history: list[int], media: SessionMedia, turn: Turn, guard: SessionGuard,
                 spec: Speculation, hooks: SessionHooks) -> None:
        self.history = history
        self.media = media
        self.turn = turn
        self.guard = guard
        self.spec = spec
        self.hooks = hooks

    def recover(self, op: str, exc: BaseException | None, n: int,
                before: tuple[int, AssemblerState] | None) -> None:
        """A call failed (``exc``) or was interrupted after its last safe point (``exc`` is
        None): put the history back to its first ``n`` tokens and the KV cache back in step
        with it. Refusals (bad arguments, missing features) changed nothing; a cancel() is
        sticky and repaired by the reset that must follow; a close() frees the session next.
        If the repair fails too, the session refuses calls until reset() / reset_keep()."""
        limit = isinstance(exc, ConstraintError)  # raised mid-step: undo it, end the turn
        if exc is not None and not limit and (isinstance(exc, (
                InvalidArgumentError, UnsupportedOperationError, SessionClosedError)) or (
                isinstance(exc, CancelledError) and not self.guard.interrupt.is_set())):
            return
        turn = self.turn
        self.guard.clear_interrupt()
        del self.history[n:]
        self.media.truncate(n)
        if before is not None:
            turn.restore(before)
        if op == "prefill":
            turn.ready = False
        try:
            if turn.ready:
                self.refeed(n)
            else:
                self.rewind_cache(n)
            if op == "next" and turn.guide is not None and limit:
                turn.guide = None  # the turn is over: prefill again
                turn.ready = False
            elif op == "next" and turn.guide is not None:  # the constraint saw the undone
                raise UnsupportedOperationError(  # tokens and cannot be rewound with them
                    "an output constraint cannot be rewound")
        except BaseException as err:
            self.guard.clear_interrupt()
            what = f"{type(exc).__name__} in {op}()" if exc is not None else f"{op}() interrupted"
            self.broken(op, err, f"{what}, then the repair of the KV cache failed")

    def rewind_cache(self, n: int) -> None:
        """Make the KV cache hold ``history[:n]`` (``n == len(history)``), no logits kept."""
        self.spec.truncate(n)
        if n == 0:
            self.hooks._reset()
        elif not self.hooks._truncate(n):
            raise UnsupportedOperationError(f"{self.hooks.backend_name} cannot truncate its cache")

    def refeed(self, n: int) -> None:
        """Make the KV cache hold ``history[:n]`` with the logits after it ready (the state
        after a prefill): cut it before the last token and feed that token again."""
        history = self.history
        last = history[n - 1]
        self.turn.ready = False
        self.rewind_cache(n - 1)
        del history[n - 1:]
        try:
            self.hooks._prefill([last])
        finally:
            history.append(last)
        self.turn.ready = True

    def broken(self, op: str, exc: BaseException, what: str | None = None) -> None:
        """The session's state is no longer known to match its history: refuse calls with
        :class:`CancelledError` until reset() / reset_keep() / restore_slot()."""
        if isinstance(exc, (InvalidArgumentError, UnsupportedOperationError, SlotError)) and \
                what is None:
            return
        self.guard.broken(what or f"{type(exc).__name__} in {op}()")


__all__ = ["Repair"]
