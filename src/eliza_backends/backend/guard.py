"""The concurrency guard of one session: who may call it now, and whether it must stop.

A :class:`~eliza_backends.backend.session.Session` has one consumer thread. Its guard holds
the consumer lock and the thread inside a call (a re-entrant call is refused, not deadlocked),
the cancel flag (sticky until a rewind; ``cancel()`` is safe from any thread), the interrupt
flag a deferred Ctrl-C sets (:mod:`eliza_backends.backend.interrupts`), the C-level stop probe
native abort callbacks poll, and the closing / closed state that ``close()`` moves through.

Every consumer call runs as ``guard.begin(op)`` then ``try: ... finally: guard.end()``. A
*guarded* call (one that changes the session's state) defers SIGINT to its safe points; the
session delivers it with :meth:`SessionGuard.deliver` once its history and KV cache agree.
"""

from __future__ import annotations

import contextlib
import threading
from collections.abc import Callable, Iterator

from ..errors import CancelledError, SessionBusyError, SessionClosedError
from .interrupts import SigintDeferral


class SessionGuard:
    """Lock, owner, cancel / interrupt flags, SIGINT deferral and the close protocol of one
    session (``name``: the backend's, for messages). Owned by the session; its flags are read
    by the session's ``_raise_if_cancelled`` on the hot path, so they are plain attributes."""

    def __init__(self, name: str) -> None:
        self.name = name
        #: set by cancel() (and by a failure that left the cache unknown): sticky until a rewind
        self.cancelled = threading.Event()
        #: why the session is cancelled, when it was not cancel(): an interrupted call that left
        #: state only a reset repairs
        self.cancel_reason: str | None = None
        #: set by a deferred SIGINT: the running call stops at its next safe point
        self.interrupt = threading.Event()
        # holds None while cancel or interrupt is set: its __contains__ is the C-level probe
        # native abort callbacks poll
        self._stop: set[None] = set()
        # makes each change of the cancel flag and the probe one step, so that a cancel() in
        # another thread racing a rewind's clear_cancel() never leaves the probe set with the
        # flags clear (a native decode would then abort with no cancel to report: a spurious
        # runtime error). Re-entrant: a Python signal handler may call cancel() on the thread
        # that holds it.
        self._flags = threading.RLock()
        #: ``probe(None)``: the stop flag as a C-implemented callable (set membership), for
        #: native abort callbacks: no Python code runs inside it
        self.probe: Callable[[object], bool] = self._stop.__contains__
        self._deferral = SigintDeferral(self._on_sigint)
        self.lock = threading.Lock()
        self._owner: int | None = None  # the thread inside a call (for re-entrant calls)
        self.closing = False
        self.closed = False

    # ---------------------------------------------------------------- one call

    def begin(self, op: str, *, allow_cancelled: bool = False, guarded: bool = False) -> None:
        """Take the consumer lock and check the session is usable; the caller then runs the
        call in ``try: ... finally: guard.end()``. ``guarded``: the call changes the
        session's state, so SIGINT is deferred to its safe points while it runs (the caller
        delivers it with :meth:`deliver` once the state is consistent)."""
        lock = self.lock
        if not lock.acquire(blocking=False):
            self.check_open()  # close() holds it, or waits for the running call
            if self._owner == threading.get_ident():
                raise SessionBusyError(f"{op}() was called from inside a call on this session")
            if not self.cancelled.is_set():
                raise SessionBusyError(
                    f"{op}(): another thread is using this session; a session has one "
                    "consumer (open one session per thread)")
            if not allow_cancelled:
                self.raise_if_cancelled()
            lock.acquire()  # the cancelled call stops at its next safe point: wait for it
        try:
            self._owner = threading.get_ident()  # (cleared by end)
            if self.closed or self.closing or (
                    not allow_cancelled and self.cancelled.is_set()):
                self.check_open()
                self.raise_if_cancelled()
            if guarded:
                if self.interrupt.is_set():
                    self.interrupt.clear()
                    self.sync_stop()
                self._deferral.begin()
        except BaseException:
            try:
                self._deferral.end()
            finally:
                self._owner = None
                lock.release()
            raise

    def end(self) -> None:
        """Release what :meth:`begin` took (the deferral too, if the call did not deliver it:
        then a deferred Ctrl-C is delivered here)."""
        try:
            self._deferral.end()
        finally:
            self._owner = None
            self.lock.release()

    @contextlib.contextmanager
    def call(self, op: str, *, allow_cancelled: bool = False) -> Iterator[None]:
        """:meth:`begin` before the ``with`` body and :meth:`end` after it: a consumer call that
        changes no state a failure would have to repair (not ``guarded``)."""
        self.begin(op, allow_cancelled=allow_cancelled)
        try:
            yield
        finally:
            self.end()

    @property
    def interrupting(self) -> bool:
        """A Ctrl-C arrived during this guarded call and will raise ``KeyboardInterrupt``."""
        return self._deferral.interrupting

    def deliver(self) -> None:
        """End the SIGINT deferral: a deferred Ctrl-C raises ``KeyboardInterrupt`` here."""
        self._deferral.end()

    # ---------------------------------------------------------------- stop flags

    def cancel(self) -> None:
        """Ask the running (or next) call to stop; safe from any thread."""
        with self._flags:
            self.cancelled.set()
            self._stop.add(None)

    def requested(self) -> bool:
        """True after cancel() or a Ctrl-C."""
        return self.cancelled.is_set() or self.interrupt.is_set()

    def raise_if_cancelled(self) -> None:
        """Raise :class:`CancelledError` if cancelled or interrupted; once close() started,
        :class:`SessionClosedError` (the stop is the close's: a reset cannot undo it)."""
        if self.cancelled.is_set() or self.interrupt.is_set():
            self.check_open()
            raise CancelledError(self.cancel_reason or (
                f"{self.name}: cancelled by cancel(); call reset() or reset_keep() to "
                "use the session again" if self.cancelled.is_set() else
                f"{self.name}: interrupted (SIGINT)"))

    def check_open(self) -> None:
        """Raise :class:`SessionClosedError` once close() started."""
        if self.closed or self.closing:
            raise SessionClosedError(f"this {self.name} session is closed; open a new one")

    def broken(self, why: str) -> None:
        """The session's state no longer matches its history: refuse calls with
        :class:`CancelledError` (saying ``why``) until a rewind clears it."""
        self.cancel_reason = (f"{self.name}: {why} left the session's cache unknown; "
                              "call reset() (or reset_keep()) to use it again")
        self.cancel()

    def clear_cancel(self) -> None:
        """After a rewind: the session is usable again."""
        with self._flags:
            self.cancelled.clear()
            self.cancel_reason = None
            self.sync_stop()

    def clear_interrupt(self) -> None:
        """After the interrupted call's state was repaired."""
        self.interrupt.clear()
        self.sync_stop()

    def _on_sigint(self) -> None:
        """A deferred SIGINT that will raise KeyboardInterrupt: stop at the next safe point."""
        self.interrupt.set()
        self._stop.add(None)

    def sync_stop(self) -> None:
        """After clearing a flag: the probe says stop only while cancel or interrupt is set
        (discard first, then re-add: a concurrent cancel() is never lost)."""
        with self._flags:
            self._stop.discard(None)
            if self.cancelled.is_set() or self.interrupt.is_set():
                self._stop.add(None)

    # ---------------------------------------------------------------- close

    def close(self, free: Callable[[], None]) -> None:
        """The close protocol: cancel the running call, wait for it to return, then run
        ``free`` once (idempotent; safe from any thread except one inside a call)."""
        if self.closed:
            return
        if self._owner == threading.get_ident():  # (the lock is not re-entrant)
            raise SessionBusyError("close() was called from inside a call on this session")
        self.closing = True
        self.cancel()
        with self.lock:
            if self.closed:
                return
            self.closed = True
            free()


__all__ = ["SessionGuard"]
