"""eliza-backends on a Ray cluster: batch generation on Ray Data, serving on Ray Serve.

Needs the ``ray`` extra (``pip install 'eliza-backends[ray]'``: Ray with Data and Serve);
``import eliza_backends`` never imports this package, and this package imports Ray only when
one of its names is first used.

* :mod:`~eliza_backends.ray.batch`: :class:`BatchGenerator`, the callable class each Ray Data
  actor constructs once (one model load per actor), and :func:`generate`, a dataset's rows of
  prompts or conversations mapped to OpenAI completions on an actor pool.
* :mod:`~eliza_backends.ray.serve`: :func:`deployment` / :func:`app_builder`, the
  OpenAI-compatible server of ``eliza-backends serve`` as a Ray Serve deployment: replicas (or
  autoscaling), each one process with its own model load and session pool.

The backend is selected on each worker (a Mac worker picks MLX, a CPU worker llama.cpp) and
reported per row (the ``backend`` column) and per replica (``/health``, the
``x-eliza-backend`` header).
"""

from __future__ import annotations

from importlib import import_module
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from .batch import RESULT_COLUMNS, BatchGenerator, generate
    from .serve import OpenAIReplica, ServeArgs, app_builder, deployment

_LAZY = {"BatchGenerator": "batch", "RESULT_COLUMNS": "batch", "generate": "batch",
         "OpenAIReplica": "serve", "ServeArgs": "serve", "app_builder": "serve",
         "deployment": "serve"}


def __getattr__(name: str) -> Any:
    module = _LAZY.get(name)
    if module is None:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    return getattr(import_module(f".{module}", __name__), name)


__all__ = ["RESULT_COLUMNS", "BatchGenerator", "OpenAIReplica", "ServeArgs", "app_builder",
           "deployment", "generate"]
