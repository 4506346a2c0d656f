"""An OpenAI-compatible HTTP server over one bundle: ``eliza-backends serve BUNDLE``.

Needs the ``server`` extra (``pip install 'eliza-backends[server]'``: Starlette and uvicorn);
``import eliza_backends`` never imports this package.

* :mod:`~eliza_backends.server.pool`: :class:`SessionPool`, N sessions over one model load,
  leased to requests with prefix routing, a bounded queue and cancellation.
* :mod:`~eliza_backends.server.app`: :func:`create_app`, the Starlette application (routes,
  access logs); :mod:`~eliza_backends.server.run`: one request's generation on a leased
  session, answered whole or as server-sent events; :mod:`~eliza_backends.server.api_errors`:
  OpenAI's error bodies.
* :mod:`~eliza_backends.server.serve`: :func:`serve`, the start-up (the model loads while the
  web stack imports: :mod:`~eliza_backends.server.listen`, uvicorn on a socket, graceful
  Ctrl-C).

Importing this package imports no web framework: :func:`create_app` (Starlette, pydantic and
the request models) is imported on first use (PEP 562), so that ``serve`` can start the model's
load before them.
"""

from __future__ import annotations

from types import ModuleType
from typing import TYPE_CHECKING

from ..lazy import lazy_names
from .pool import PoolClosedError, PoolFullError, SessionPool
from .serve import serve

if TYPE_CHECKING:
    from .app import create_app as create_app


def _app(name: str) -> ModuleType:
    from . import app
    return app


__getattr__, __dir__ = lazy_names("eliza_backends.server", {"create_app": "app"}, _app,
                                  globals())

__all__ = ["PoolClosedError", "PoolFullError", "SessionPool", "create_app", "serve"]
