"""The web half of ``eliza-backends serve``: uvicorn running the Starlette app on a bound socket,
with the start-up line and a graceful Ctrl-C (see :mod:`~eliza_backends.server.serve`).

This module is what imports the web stack (uvicorn, Starlette, pydantic, the request models
through :mod:`~eliza_backends.server.app`): :func:`~eliza_backends.server.serve.serve` imports
it on a thread while the model loads, and calls :func:`run_server` once the sessions are open.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import math
import os
import signal
import socket
import threading
from collections.abc import Iterator, Sequence
from types import FrameType
from typing import IO, TYPE_CHECKING

import uvicorn

from ..media import MediaLimits
from .app import create_app
from .pool import SessionPool

if TYPE_CHECKING:
    from .embedding_service import EmbeddingService

#: Seconds after ``grace`` that a shutdown waits for connections to take their last events
#: (rounded up to whole seconds, as uvicorn takes them); then uvicorn cancels what still runs
#: (a client that stopped reading holds its connection forever otherwise).
SHUTDOWN_MARGIN = 1.0


class _Server(uvicorn.Server):
    """uvicorn's server with a graceful shutdown that drains the pool, and no re-raised
    signal once it is done (so the process can free the model and exit 0)."""

    def __init__(self, config: uvicorn.Config, pool: SessionPool | EmbeddingService,
                 grace: float, announce: str, out: IO[str]) -> None:
        super().__init__(config)
        self.pool = pool
        self.grace = grace
        self.announce = announce
        self.out = out
        self.loop: asyncio.AbstractEventLoop | None = None

    async def startup(self, sockets: list[socket.socket] | None = None) -> None:
        self.loop = asyncio.get_running_loop()
        await super().startup(sockets)
        print(self.announce, file=self.out, flush=True)

    def _log_started_message(self, listeners: Sequence[socket.SocketType]) -> None:
        """Replaced by the announcement line."""

    @contextlib.contextmanager
    def capture_signals(self) -> Iterator[None]:
        if threading.current_thread() is not threading.main_thread():
            yield
            return
        handled = (signal.SIGINT, signal.SIGTERM)
        original = {sig: signal.signal(sig, self.handle_exit) for sig in handled}
        try:
            yield
        finally:
            for sig, handler in original.items():
                signal.signal(sig, handler)

    def handle_exit(self, sig: int, frame: FrameType | None) -> None:
        first = not self.should_exit
        super().handle_exit(sig, frame)
        if first and self.loop is not None:
            logging.getLogger("eliza_backends.server").info(
                "shutting down: finishing running requests (up to %.0f s), refusing new ones",
                self.grace)
            self.loop.call_soon_threadsafe(self.pool.begin_shutdown, self.grace)


def run_server(service: SessionPool | EmbeddingService, sock: socket.socket, *, model: str,
               announce: str, out: IO[str], grace: float, media: MediaLimits | None,
               api_key: str | None, slot_save_path: str | os.PathLike[str] | None = None
               ) -> None:
    """Serve ``service`` (open) under the model id ``model`` on the bound ``sock`` until a
    shutdown signal: ``announce`` goes to ``out`` once uvicorn listens; running requests get
    ``grace`` seconds at a shutdown; ``media``, ``api_key``, ``slot_save_path``: as
    :func:`~eliza_backends.server.app.create_app` takes them. Returns after the graceful
    shutdown; closing ``service`` is the caller's job."""
    pool = service if isinstance(service, SessionPool) else None
    embeddings = None if isinstance(service, SessionPool) else service
    app = create_app(pool, model=model, media=media, api_key=api_key, embeddings=embeddings,
                     slot_save_path=slot_save_path)
    config = uvicorn.Config(app, log_config=None, access_log=False, lifespan="off", ws="none",
                            timeout_graceful_shutdown=math.ceil(grace + SHUTDOWN_MARGIN))
    _Server(config, service, grace, announce, out).run(sockets=[sock])


__all__ = ["SHUTDOWN_MARGIN", "run_server"]
