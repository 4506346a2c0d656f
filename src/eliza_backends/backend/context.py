"""The inference context: one bundle, the models loaded from it, the sessions open on it.

:class:`InferenceContext` is the seed's ``EliInferenceContext``. Backends read the bundle root
from it and re-resolve their artifact there (nothing is cached between ``can_serve`` and
``open``). Loaded weights are shared through :meth:`InferenceContext.shared`, so several
sessions on one bundle pay for one load. Closing the context closes its sessions first, then
frees what was loaded, in reverse order.

A single model artifact (a ``.gguf`` file, an MLX folder, ...) is taken as an implicit
one-artifact bundle (:class:`~eliza_backends.bundle.ImplicitBundle`), staged for the
context's lifetime.

Threads: every method is safe from any thread. :meth:`InferenceContext.close` waits for the
sessions being opened (:meth:`InferenceContext.opening`: ``open_stream`` and the conformance
kit open inside it) and for the calls running on its sessions, so nothing it frees is in use.
"""

from __future__ import annotations

import os
import threading
import warnings
from collections.abc import Callable, Hashable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol, TypeVar, cast

from ..bundle import ImplicitBundle, artifact_format, is_bundle_dir, not_a_bundle
from ..errors import InvalidArgumentError, SessionClosedError

if TYPE_CHECKING:
    from ..runtime.batching import BatchStats, StepScheduler

T = TypeVar("T")


class Closeable(Protocol):
    """What the context keeps of a session it tracks (a
    :class:`~eliza_backends.backend.session.Session`, which registers itself; this module does
    not import it): closing the context closes it."""

    def close(self) -> None: ...


class InferenceContext:
    """Owns what is loaded from one bundle. Thread-safe; close it (or use ``with``) when done."""

    def __init__(self, bundle_dir: str | os.PathLike[str], *, parallel: int = 1) -> None:
        """``parallel``: how many sequences one runtime context may decode together. Sessions
        opened on this context by a backend whose capabilities say ``batched`` share runtime
        contexts of ``parallel`` sequences each and are decoded in one batch per step
        (continuous batching); other backends give every session its own runtime context, as
        with ``parallel=1``."""
        if isinstance(parallel, bool) or not isinstance(parallel, int) or parallel < 1:
            raise InvalidArgumentError(f"parallel must be an integer >= 1, got {parallel!r}")
        #: Sequences per runtime context for batching backends (1: no batching).
        self.parallel: int = parallel
        path = Path(bundle_dir)
        #: What the caller passed: the bundle folder, or the single artifact.
        self.source: Path = path
        self._implicit: ImplicitBundle | None = None
        if not is_bundle_dir(path) and artifact_format(path) is not None:
            self._implicit = ImplicitBundle(path)
            path = self._implicit.root
        elif not path.is_dir():
            raise not_a_bundle(path)
        #: The bundle folder backends read (for a single artifact, its staging folder).
        self.bundle_dir: Path = path.resolve()
        self._lock = threading.RLock()
        self._idle = threading.Condition(self._lock)  # notified when an open finishes
        self._close_lock = threading.Lock()  # one close() at a time; the others wait for it
        self._shared: dict[Hashable, tuple[Any, Callable[[Any], None] | None]] = {}
        self._sessions: list[Closeable] = []
        self._schedulers: list[StepScheduler] = []
        self._opening = 0  # sessions being opened (inside opening())
        self._closing = False
        self._closed = False

    def check_batch_size(self, batch_size: int) -> None:
        """Refuse a session's ``batch_size`` below this context's ``parallel``
        (:class:`InvalidArgumentError`, naming both): a batched step decodes one token of each
        of the ``parallel`` sequences and carries at most ``batch_size`` tokens (llama.cpp's
        ``n_batch``). One rule on every backend; ``open_stream`` checks it before anything
        loads, and a batching backend's ``open`` before it builds the shared runtime."""
        if batch_size < self.parallel:
            raise InvalidArgumentError(
                f"batch_size={batch_size} is below parallel={self.parallel}: a batched step "
                f"decodes one token of each of the {self.parallel} sequences, so batch_size "
                f"must be at least parallel; raise batch_size to {self.parallel} or more, or "
                "open the context with a smaller parallel")

    @contextmanager
    def opening(self) -> Iterator[None]:
        """Hold this while opening a session on the context (``Factory.open``):
        :meth:`close` waits until it is released, so it never frees weights a session is
        being built on. Raises :class:`SessionClosedError` once the context is closing.
        ``open_stream`` does this for you; call ``Factory.open`` directly only inside it."""
        with self._lock:
            if self._closing or self._closed:
                raise SessionClosedError("this InferenceContext is closed (or closing); create "
                                         "a new one")
            self._opening += 1
        try:
            yield
        finally:
            with self._lock:
                self._opening -= 1
                self._idle.notify_all()

    def shared(self, key: Hashable, load: Callable[[], T],
               close: Callable[[T], None] | None = None) -> T:
        """Return the object cached under ``key``, calling ``load()`` once to make it.

        ``close`` frees it when the context closes. Loads are serialised per context.
        """
        with self._lock:
            self._check_open()
            if key not in self._shared:
                self._shared[key] = (load(), cast("Callable[[Any], None] | None", close))
            return cast(T, self._shared[key][0])

    def track_scheduler(self, scheduler: StepScheduler) -> None:
        """Plugin kit: register the step scheduler of a batched runtime context made on this
        context (once per scheduler; again is a no-op), so that :meth:`batch_stats` counts it."""
        with self._lock:
            if scheduler not in self._schedulers:
                self._schedulers.append(scheduler)

    def batch_stats(self) -> BatchStats | None:
        """The step totals of this context's batched runtime contexts, summed (see
        :class:`~eliza_backends.backend.BatchStats`); None when no session opened on it is
        batched (``parallel=1``, or a backend that does not batch)."""
        from ..runtime.batching import BatchStats

        with self._lock:
            schedulers = list(self._schedulers)
        return BatchStats.total(s.stats() for s in schedulers) if schedulers else None

    def track(self, session: Closeable) -> None:
        """Register a session so that closing the context closes it first."""
        with self._lock:
            self._check_open()
            self._sessions.append(session)

    def untrack(self, session: Closeable) -> None:
        """Forget a closed session."""
        with self._lock:
            if session in self._sessions:
                self._sessions.remove(session)

    @property
    def closed(self) -> bool:
        """True once :meth:`close` ran."""
        return self._closed

    def _check_open(self) -> None:
        if self._closed:
            raise SessionClosedError("this InferenceContext is closed; create a new one")

    def close(self) -> None:
        """Close every session, then free loaded models (reverse load order). Idempotent and
        safe from any thread: it waits for sessions being opened (:meth:`opening`) and for the
        calls running on its sessions (each ``Session.close`` stops its call, which raises
        :class:`SessionClosedError`, and waits for it)."""
        with self._close_lock:
            with self._lock:
                if self._closed:
                    return
                self._closing = True
                while self._opening:
                    self._idle.wait()
                sessions, self._sessions = list(self._sessions), []
            for session in sessions:
                session.close()
            with self._lock:
                sessions, self._sessions = list(self._sessions), []
            for session in sessions:  # (opened meanwhile by a direct Factory.open call)
                session.close()
            with self._lock:
                self._closed = True
                items = list(self._shared.values())
                self._shared.clear()
            try:
                for obj, closer in reversed(items):
                    if closer is not None:
                        closer(obj)
            finally:
                if self._implicit is not None:
                    self._implicit.close()

    def __del__(self) -> None:
        # A context nobody closed frees its sessions and weights when it is collected, and
        # says so, as an unclosed file does.
        try:
            if not self._closed:
                warnings.warn(f"unclosed {self!r}: close it (or use `with`) to free the "
                              "weights when you are done", ResourceWarning, source=self,
                              stacklevel=2)
                self.close()
        except Exception:  # nothing may escape a finalizer (at interpreter shutdown too)
            pass

    def __enter__(self) -> InferenceContext:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def __repr__(self) -> str:
        state = "closed" if self._closed else f"{len(self._shared)} loaded"
        return f"<InferenceContext {self.bundle_dir} ({state})>"


__all__ = ["InferenceContext"]
