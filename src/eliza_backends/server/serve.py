"""Run the server: :func:`serve` is ``eliza-backends serve``.

The model loads and every session opens (and warms up) before the socket is bound, so a bundle
that cannot be served fails at once with its ``ELIZA_*`` error. The web stack (uvicorn,
Starlette, pydantic, the request models: :mod:`~eliza_backends.server.listen`) imports on a
thread meanwhile (:func:`import_web_stack`): the load is mostly native code that releases the
GIL, so the two overlap and start-up takes about the longer of them, not their sum. Then one
line on stdout says where the API is, which backend serves which model, and how its sessions
run (batched or not)::

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

import contextlib
import json
import logging
import os
import socket
import sys
import threading
import time
from typing import IO, TYPE_CHECKING, Any, Literal

from ..config import StreamConfig
from ..media import MediaLimits
from ..openai.embedder import bundle_embedding
from ..serving import model_name
from .pool import SessionPool

if TYPE_CHECKING:
    from .embedding_service import EmbeddingService

LogFormat = Literal["text", "json"]


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


def missing_extra() -> str | None:
    """The name of a module of the ``server`` extra that is not installed (None: all are);
    a look-up, no import, so that a missing extra is reported before the model loads."""
    from importlib.util import find_spec

    return next((name for name in ("starlette", "uvicorn") if find_spec(name) is None), None)


def import_web_stack() -> threading.Thread:
    """Start importing :mod:`~eliza_backends.server.listen` (uvicorn, Starlette, pydantic, the
    app and its request models) on a daemon thread, so that it overlaps the model's load on
    the calling thread. The caller's own import of it later waits for this one (the module
    lock) and raises its error, if any (this thread swallows it).

    Start it after the registry's discovery (plugins' front doors, ``importlib.metadata``):
    the two threads then import disjoint module trees but for a few leaf modules (measured:
    ``typing_extensions``, ``uuid``, ``multiprocessing``, ``prompt.chat``), which a package
    imports before its submodules, so no import waits on the other thread in a cycle."""
    def run() -> None:
        with contextlib.suppress(Exception):
            from . import listen  # noqa: F401

    thread = threading.Thread(target=run, name="eliza-serve-imports", daemon=True)
    thread.start()
    return thread


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
    embedding = bundle_embedding(bundle, backend=backend)  # registry discovery: before the thread
    import_web_stack()
    if embedding is not None:
        from .embedding_service import DEFAULT_QUEUE, EmbeddingService

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
        from .auth import exposure_warning  # the web stack: imported by now, or waited for
        from .listen import run_server

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
        run_server(service, sock, model=name, announce=announce, out=out, grace=grace,
                   media=media, api_key=api_key, slot_save_path=slot_save_path)
    finally:
        service.close()
    print("eliza-backends serve: stopped", file=out, flush=True)
    return 0


__all__ = ["MAX_DEFAULT_CACHE_MIB", "JsonLogFormatter", "LogFormat", "bind", "configure_logging",
           "default_cache_mib", "import_web_stack", "missing_extra", "serve"]
