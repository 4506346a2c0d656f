"""Ctrl-C inside a session call: SIGINT deferred to the call's safe points.

Python runs a signal handler between two bytecodes of the main thread, wherever they are: in
the middle of a backend's bookkeeping (after a forward pass, before the counter that records
it), or inside a ctypes callback, where the ``KeyboardInterrupt`` is printed and lost (llama.cpp's
abort callback then reports a failed decode). So while a session call that changes its state
runs on the main thread, :class:`SigintDeferral` replaces the SIGINT handler with one that only
records the signal; when the handler it replaced is Python's default (which raises
``KeyboardInterrupt``) it also sets the session's interrupt flag, which the hooks' cancel checks
see, so the call stops at its next safe point exactly as after ``cancel()``. When the call is
over (and the session has put its history and KV cache back in step) the recorded signal is
delivered to the original handler, so ``KeyboardInterrupt`` surfaces to the caller.

Elsewhere nothing changes: another thread never receives signals, and a handler set to
``SIG_IGN`` / ``SIG_DFL`` (not Python code) is left alone.
"""

from __future__ import annotations

import signal
import threading
from collections.abc import Callable
from types import FrameType
from typing import Any

_MAIN = threading.main_thread()


class SigintDeferral:
    """One session's SIGINT deferral: :meth:`begin` before a call, :meth:`end` after it.

    ``on_interrupt``: called (in the signal handler) when a deferred SIGINT will raise
    ``KeyboardInterrupt``: the session sets its interrupt flag. Not re-entrant; used by the
    thread that holds the session.
    """

    __slots__ = ("_on_interrupt", "_pending", "_previous")

    def __init__(self, on_interrupt: Callable[[], None]) -> None:
        self._on_interrupt = on_interrupt
        self._previous: Any = None
        self._pending: tuple[int, FrameType | None] | None = None

    def begin(self) -> None:
        """Defer SIGINT (main thread with a Python-level handler only; else a no-op)."""
        self._pending = None
        self._previous = None
        if threading.current_thread() is not _MAIN:
            return
        handler = signal.getsignal(signal.SIGINT)
        if not callable(handler):
            return
        self._previous = handler
        signal.signal(signal.SIGINT, self._record)

    def _record(self, signum: int, frame: FrameType | None) -> None:
        self._pending = (signum, frame)
        if self._previous is signal.default_int_handler:
            self._on_interrupt()

    @property
    def interrupting(self) -> bool:
        """A SIGINT arrived and :meth:`end` will raise ``KeyboardInterrupt`` for it."""
        return self._pending is not None and self._previous is signal.default_int_handler

    def end(self) -> None:
        """Put the original handler back and deliver a SIGINT that arrived meanwhile (the
        default handler raises ``KeyboardInterrupt``, hiding the exception the interrupted
        call raised from the traceback's display)."""
        previous, self._previous = self._previous, None
        if previous is None:
            return
        if signal.getsignal(signal.SIGINT) == self._record:
            signal.signal(signal.SIGINT, previous)
        pending, self._pending = self._pending, None
        if pending is None:
            return
        try:
            previous(*pending)
        except BaseException as exc:
            exc.__suppress_context__ = True
            raise


__all__ = ["SigintDeferral"]
