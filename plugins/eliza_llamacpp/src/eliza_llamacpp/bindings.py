"""llama-cpp-python's ctypes bindings (``llama_cpp.llama_cpp``, here :data:`lc`) without the
high-level half of its package, and the log callback this plugin routes llama.cpp's lines to.

``import llama_cpp`` runs the package's ``__init__``, which imports ``llama_cpp.llama`` (the
``Llama`` class, its chat formats, cache and grammar: jinja2, diskcache, sqlite3, ...): 130-170
ms of a fresh process on a quiet machine, of which 60-70 ms beyond numpy (which the session
imports anyway), none of which this plugin uses (it calls the C API only; issue 42). So when
nothing imported ``llama_cpp`` yet, the package goes into ``sys.modules`` unexecuted (the module
its spec makes, ``__path__`` and all, as the import system makes it before running it) with a
module class whose first lookup of a name it lacks (``llama_cpp.Llama``, ``from llama_cpp import
Llama``, ``llama_cpp.__version__``, ``dir()``) runs the package's ``__init__`` then, once, under
a lock: code elsewhere in the process that imports ``llama_cpp`` works as before, and pays for
the high-level half when it uses it. Submodules (``llama_cpp.llama_cpp``, ``mtmd_cpp``,
``llama_cpp_ext``) import as usual. This plugin's modules take :data:`lc` from here (``from
.bindings import lc``) and import a submodule by its dotted name (``import llama_cpp.mtmd_cpp as
mtmd_cpp``: ``from llama_cpp import mtmd_cpp`` looks the name up on the package first).

That ``__init__`` installs llama-cpp-python's own log callback (``llama_cpp._logger``: raw
stderr). When it runs after :func:`route_logs`, the callback routed there is installed again,
so the order of imports decides nothing (before this module, the package ran first and the
plugin's routing came after it).
"""

from __future__ import annotations

import ctypes
import importlib.util
import sys
import threading
import types
from typing import Any


class _DeferredPackage(types.ModuleType):
    """``llama_cpp`` before its ``__init__`` ran: the first missing name runs it."""

    def __getattr__(self, name: str) -> Any:
        _run_package(self)
        return types.ModuleType.__getattribute__(self, name)

    def __dir__(self) -> list[str]:
        _run_package(self)
        return list(types.ModuleType.__dir__(self))


#: Held while the package's ``__init__`` runs: another thread's lookup of a name the package
#: lacks waits for the run (re-entrant: the running thread's own lookups do not wait).
_package_lock = threading.RLock()
#: ``running``: the ``__init__`` runs now (on the thread holding the lock); ``ran``: it did.
_package_state = {"running": False, "ran": False}
#: The callback :func:`route_logs` installed (kept alive here; re-installed after the package).
_routed: list[Any] = []


def _run_package(package: types.ModuleType) -> None:
    """Run ``llama_cpp/__init__.py`` in ``package``, once. A lookup from inside that run sees
    the partly run module, as a circular lookup during a normal import does; a lookup on
    another thread waits for the run, then sees the whole package. A run that raises is run
    again by the next lookup (which raises again), as a failed import is retried."""
    with _package_lock:
        if _package_state["running"] or _package_state["ran"]:
            return
        spec = package.__spec__
        assert spec is not None and spec.loader is not None
        _package_state["running"] = True
        try:
            spec.loader.exec_module(package)
        finally:
            _package_state["running"] = False
        _package_state["ran"] = True
        package.__class__ = types.ModuleType  # a plain module from now on
        if _routed:
            lc.llama_log_set(_routed[0], ctypes.c_void_p(0))


def _defer_package() -> None:
    """Put ``llama_cpp`` in ``sys.modules`` unexecuted, unless something imported it."""
    with _package_lock:
        if "llama_cpp" in sys.modules:
            return
        spec = importlib.util.find_spec("llama_cpp")
        if spec is None or spec.loader is None or spec.submodule_search_locations is None:
            return  # not installed or not a package: the import below raises as it would
        package = importlib.util.module_from_spec(spec)
        package.__class__ = _DeferredPackage
        sys.modules["llama_cpp"] = package


_defer_package()

import llama_cpp.llama_cpp as lc  # noqa: E402  (after the package is in place)


def route_logs(callback: Any) -> None:
    """Send llama.cpp's log lines to ``callback`` (a ``llama_log_callback``) from now on, also
    after llama-cpp-python's ``__init__`` runs (which installs its own)."""
    with _package_lock:
        _routed[:] = [callback]
        lc.llama_log_set(callback, ctypes.c_void_p(0))


__all__ = ["lc", "route_logs"]
