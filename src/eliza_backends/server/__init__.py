"""An OpenAI-compatible HTTP server over one bundle: ``eliza-backends serve BUNDLE``.

Needs the ``server`` extra (``pip install 'eliza-backends[server]'``: Starlette and uvicorn);
``import eliza_backends`` never imports this package.

* :mod:`~eliza_backends.server.pool`: :class:`SessionPool`, N sessions over one model load,
  leased to requests with prefix routing, a bounded queue and cancellation.
* :mod:`~eliza_backends.server.app`: :func:`create_app`, the Starlette application (routes,
  access logs); :mod:`~eliza_backends.server.run`: one request's generation on a leased
  session, answered whole or as server-sent events; :mod:`~eliza_backends.server.api_errors`:
  OpenAI's error bodies.
* :mod:`~eliza_backends.server.serve`: :func:`serve`, uvicorn on a socket, startup line,
  graceful Ctrl-C.
"""

from __future__ import annotations

from .app import create_app
from .pool import PoolClosedError, PoolFullError, SessionPool
from .serve import serve

__all__ = ["PoolClosedError", "PoolFullError", "SessionPool", "create_app", "serve"]
