"""What a server of an embedding model runs instead of a :class:`SessionPool`:
:class:`EmbeddingService`, one :class:`~eliza_backends.openai.embedder.Embedder` (one model load)
that answers ``POST /v1/embeddings``, one request at a time on its own thread (each request's
inputs already go through the model in batches), with a bounded queue.

A bundle is served by one or the other, decided before any load by a header probe
(:func:`~eliza_backends.openai.embedder.bundle_embedding`): ``eliza-backends serve`` and the Ray
Serve replica open an :class:`EmbeddingService` for an embedding model and a
:class:`SessionPool` for a generation model; the app answers the other kind's routes with a
typed 400.
"""

from __future__ import annotations

import asyncio
import os
from concurrent.futures import ThreadPoolExecutor
from typing import Any

from ..backend.context import InferenceContext
from ..config import StreamConfig
from ..errors import InvalidArgumentError, PoolClosedError, PoolFullError
from ..openai.embedder import Embedder, open_embedder
from ..openai.embeddings import EmbeddingList, EmbeddingRequest, run_embedding

#: Requests that may wait for the running one by default.
DEFAULT_QUEUE = 16


class EmbeddingService:
    """An embedding model served over HTTP: :meth:`open` loads it, :meth:`run` answers one
    request (validated already) on the service's thread, :meth:`close` frees it.

    ``config``: the session's settings (``context_size`` is the longest input in tokens,
    ``threads``); ``max_queue`` requests may wait for the running one (more: 429); after
    :meth:`begin_shutdown` new requests get 503. Call :meth:`run` from the event loop."""

    def __init__(self, bundle: str | os.PathLike[str] | InferenceContext,
                 config: StreamConfig | None = None, *, backend: str | None = None,
                 max_queue: int = DEFAULT_QUEUE) -> None:
        if max_queue < 0:
            raise InvalidArgumentError(f"max_queue must be >= 0, got {max_queue}")
        self._bundle = bundle
        self.config = config or StreamConfig()
        self._backend_request = backend
        self.max_queue = max_queue
        self.embedder: Embedder | None = None
        self._executor = ThreadPoolExecutor(1, thread_name_prefix="eliza-embeddings")
        self._active = 0  # the running request and those waiting for it
        self._draining = False
        self.served = self.failed = 0

    def open(self) -> None:
        """Select the backend and load the model (on the service's thread)."""
        self.embedder = self._executor.submit(
            open_embedder, self._bundle, self.config, backend=self._backend_request).result()

    @property
    def backend(self) -> str:
        """The backend serving the model ("" before :meth:`open`)."""
        return self.embedder.backend if self.embedder is not None else ""

    @property
    def context_size(self) -> int:
        """The longest input in tokens."""
        return self.embedder.session.context_size if self.embedder is not None else 0

    async def run(self, request: EmbeddingRequest, model: str) -> EmbeddingList:
        """``request`` answered (:func:`~eliza_backends.openai.embeddings.run_embedding`) on
        the service's thread; :class:`PoolFullError` when the queue is full,
        :class:`PoolClosedError` while shutting down or closed."""
        embedder = self.embedder
        if self._draining or embedder is None:
            raise PoolClosedError("the server is shutting down and takes no new requests")
        if self._active > self.max_queue:
            raise PoolFullError(f"{self._active} embedding requests are running or waiting "
                                f"(queue {self.max_queue}); retry shortly")
        self._active += 1
        try:
            reply = await asyncio.get_running_loop().run_in_executor(
                self._executor, run_embedding, embedder, request, model)
        except BaseException:
            self.failed += 1
            raise
        finally:
            self._active -= 1
        self.served += 1
        return reply

    def stats(self) -> dict[str, Any]:
        """For ``/health``: the task, the model's vector length, the request counts."""
        spec = self.embedder.spec if self.embedder is not None else None
        return {"task": "embeddings", "dimensions": spec.dimensions if spec else 0,
                "pooling": spec.pooling if spec else "", "active": self._active,
                "max_queue": self.max_queue, "served": self.served, "failed": self.failed,
                "draining": self._draining}

    @property
    def draining(self) -> bool:
        """True after :meth:`begin_shutdown`."""
        return self._draining

    def begin_shutdown(self, grace: float) -> None:
        """Take no new requests (the running ones finish: an embedding call is short)."""
        self._draining = True

    def close(self) -> None:
        """Free the model (after the running request). Idempotent."""
        self._draining = True
        embedder, self.embedder = self.embedder, None
        try:
            if embedder is not None:
                self._executor.submit(embedder.close).result()
        finally:
            self._executor.shutdown(wait=True)


__all__ = ["DEFAULT_QUEUE", "EmbeddingService"]
