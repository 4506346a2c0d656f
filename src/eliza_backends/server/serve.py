"""Run the server: :func:`serve` is ``eliza-backends serve``.

The model loads and every session opens before the socket is served, so a bundle that cannot
be served fails at once with its ``ELIZA_*`` error. Then one line on stdout says where the API
is, which backend serves which model, and how its sessions run (batched or not)::

    eliza-backends serve: http://127.0.0.1:8000/v1  model tiny on llama.cpp, continuous
    batching: 8 sequences share one llama.cpp context (2 threads), context 2048, queue 32 ...

uvicorn runs the Starlette app on that socket (``--port 0`` picks a free port; the line names
it). Ctrl-C (or SIGTERM) shuts down gracefully: no new requests (503), running generations get
``grace`` seconds to finish, then are stopped at their next step and their streams end with an
error event; a connection still open ``grace`` + 1 s after the signal (a client that stopped
reading) is dropped. The sessions and the model are freed and the process exits 0. A second
Ctrl-C stops at once.

Logging goes through :mod:`logging` to stderr: one access record per request on
``eliza_backends.server.access`` (``--log-format json`` writes each record as one JSON object,
the access fields included).
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import math
import os
import signal
import socket
import sys
import time
from collections.abc import Iterator, Sequence
from types import FrameType
from typing import IO, Any, Literal

import uvicorn

from ..config import StreamConfig
from ..media import MediaLimits
from ..openai.embedder import bundle_embedding
from ..serving import model_name
from .app import create_app
from .auth import exposure_warning
from .embedding_service import DEFAULT_QUEUE, EmbeddingService
from .pool import SessionPool

LogFormat = Literal["text", "json"]

#: Seconds after ``grace`` that a shutdown waits for connections to take their last events
#: (rounded up to whole seconds, as uvicorn takes them); then uvicorn cancels what still runs
#: (a client that stopped reading holds its connection forever otherwise).
SHUTDOWN_MARGIN = 1.0


class JsonLogFormatter(logging.Formatter):
    """One JSON object per record: time, level, logger, message, and the ``access`` fields of
    an access record."""

    def format(self, record: logging.LogRecord) -> str:
        out: dict[str, Any] = {
            "time": time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(record.created))
            + f".{int(record.msecs):03d}Z",
            "level": record.levelname, "logger": record.name, "message": record.getMessage()}
        out.update(getattr(record, "access", {}))
        if record.exc_info:
            out["exception"] = self.formatException(record.exc_info)
        return json.dumps(out, default=str)


def configure_logging(log_format: LogFormat = "text", level: str = "info") -> None:
    """Send ``eliza_backends.server`` and uvicorn records to stderr (text or JSON lines)."""
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(JsonLogFormatter() if log_format == "json" else logging.Formatter(
        "%(asctime)s %(levelname)s %(name)s: %(message)s"))
    for name in ("eliza_backends.server", "uvicorn"):
        logger = logging.getLogger(name)
        logger.handlers[:] = [handler]
        logger.setLevel(level.upper())
        logger.propagate = False


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
        if not _in_main_thread():
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


def _in_main_thread() -> bool:
    import threading

    return threading.current_thread() is threading.main_thread()


def bind(host: str, port: int) -> socket.socket:
    """A TCP socket bound to ``host:port`` (``port`` 0: any free port)."""
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    sock = socket.socket(family, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    try:
        sock.bind((host, port))
    except OSError as exc:
        sock.close()
        raise OSError(f"cannot listen on {host}:{port}: {exc.strerror}; choose another --port "
                      "or --host") from None
    return sock


#: The prompt cache's bound, as llama-server's ``--cache-ram`` default (8 GiB), but never more
#: than an eighth of the host's memory: this library also runs on laptops beside the model.
MAX_DEFAULT_CACHE_MIB = 8192


def default_cache_mib() -> int:
    """``serve``'s default ``--cache-ram`` in MiB: an eighth of the physical memory, at most
    :data:`MAX_DEFAULT_CACHE_MIB` (1024 when the memory size is unknown). The cache holds
    only what evicted conversations left, so it grows to the bound only under that load."""
    try:
        total = os.sysconf("SC_PHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")
    except (AttributeError, OSError, ValueError):
        return 1024
    return max(1, min(MAX_DEFAULT_CACHE_MIB, (total >> 20) // 8))


def serve(bundle: str | os.PathLike[str], *, host: str = "127.0.0.1", port: int = 8000,
          backend: str | None = None, sessions: int | None = None,
          parallel: int | Literal["auto"] | None = None, queue: int | None = None,
          config: StreamConfig | None = None, model: str | None = None, grace: float = 10.0,
          log_format: LogFormat = "text", log_level: str = "info",
          out: IO[str] | None = None, allow_media_files: bool = False,
          api_key: str | None = None, warm: bool = True,
          cache_ram: int | None = None,
          slot_save_path: str | os.PathLike[str] | None = None) -> int:
    """Serve ``bundle`` until interrupted; returns the exit status (0 after a graceful
    shutdown). ``parallel`` concurrent generations batched in one runtime context, or
    ``sessions`` independent ones, over one model load (neither: ``parallel="auto"``; see
    :class:`SessionPool`); ``queue`` more waiting (default 4 per session), ``config`` the
    sessions' base settings, ``model`` the id clients use (default: the bundle's name);
    ``allow_media_files``: an ``image_url`` may name a local file (a path or ``file://``; off:
    only data URIs; remote URLs are never fetched).
    ``api_key``: every request but ``/health`` must send it (see
    :mod:`~eliza_backends.server.auth`); without one, a ``host`` beyond loopback is warned
    about at startup; ``warm``: warm the runtime contexts up before listening (see
    :mod:`~eliza_backends.server.warmup`); ``cache_ram``: the prompt cache's bound in MiB
    (0: off; None: :func:`default_cache_mib`); ``slot_save_path``: the folder of the
    ``/slots`` endpoints' files (:mod:`~eliza_backends.server.slot_files`).
    Raises :class:`ElizaError` when the bundle cannot be served (or both ``sessions`` and
    ``parallel`` are over 1) and ``OSError`` when the address is taken. A ``config`` with a
    drafter speculates on every session (``drafter="mtp"`` without ``parallel`` or
    ``sessions``: one session, as the MTP assistant cannot share a batched context)."""
    out = out or sys.stdout
    configure_logging(log_format, log_level)
    if parallel is None and sessions is None:  # MTP needs a context of its own: 1 session
        parallel = None if config is not None and config.drafter == "mtp" else "auto"
    cache_mib = default_cache_mib() if cache_ram is None else cache_ram
    if bundle_embedding(bundle, backend=backend) is not None:
        service: SessionPool | EmbeddingService = EmbeddingService(
            bundle, config, backend=backend, max_queue=DEFAULT_QUEUE if queue is None else queue)
        pool = None
    else:
        service = pool = SessionPool(bundle, config, sessions=sessions or 1, parallel=parallel,
                                     max_queue=queue, backend=backend, warm=warm,
                                     cache_bytes=cache_mib << 20)
    try:
        service.open()
        if pool is not None and pool.warmup_seconds:
            logging.getLogger("eliza_backends.server").info(
                "warmed up in %.0f ms", pool.warmup_seconds * 1000)
        name = model or model_name(bundle)
        sock = bind(host, port)
        bound = sock.getsockname()[1]
        shown = f"[{host}]" if ":" in host else host
        how = (f"{pool.batching}, context {pool.context_size}" if pool is not None else
               f"embeddings, inputs up to {service.context_size} tokens")
        cache = "" if pool is None else \
            f", prompt cache {f'{cache_mib} MiB' if pool.prompt_cache else 'off'}"
        announce = (f"eliza-backends serve: http://{shown}:{bound}/v1  model {name} on "
                    f"{service.backend}, {how}, queue {service.max_queue}"
                    f"{cache}{', API key required' if api_key else ''}; "
                    "Ctrl-C to stop")
        warning = exposure_warning(host, api_key)
        if warning:
            logging.getLogger("eliza_backends.server").warning("%s", warning)
        media = MediaLimits(allow_files=True) if allow_media_files else None
        embeddings = service if isinstance(service, EmbeddingService) else None
        uv_config = uvicorn.Config(create_app(pool, model=name, media=media, api_key=api_key,
                                              embeddings=embeddings,
                                              slot_save_path=slot_save_path),
                                   log_config=None,
                                   access_log=False, lifespan="off", ws="none",
                                   timeout_graceful_shutdown=math.ceil(grace + SHUTDOWN_MARGIN))
        server = _Server(uv_config, service, grace, announce, out)
        server.run(sockets=[sock])
    finally:
        service.close()
    print("eliza-backends serve: stopped", file=out, flush=True)
    return 0


__all__ = ["MAX_DEFAULT_CACHE_MIB", "JsonLogFormatter", "LogFormat", "bind", "configure_logging",
           "default_cache_mib", "serve"]
