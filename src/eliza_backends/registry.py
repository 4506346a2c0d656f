"""Plugin discovery: a pluggy PluginManager over the ``eliza_backends`` entry-point group.

Discovery is lazy (the first ``list_backends()`` / ``select()``), once per process, and
idempotent; it reads only this package's entry-point group
(:func:`~eliza_backends.entry_points.group_entry_points`, not ``importlib.metadata``, which
parses every installed distribution). Each entry point is loaded on its own, so a plugin that
fails to import, implements an unknown hook, raises, or returns something that is not a
:class:`Factory` is recorded as a :class:`PluginProblem` and never breaks the others.

``ELIZA_BACKENDS_PLUGINS`` (a comma list of entry-point names) restricts which plugins load; an
application can pin exactly what may run in its process.
"""

from __future__ import annotations

import os
import threading
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

import pluggy

from .backend import hookspecs
from .backend.factory import Factory
from .backend.types import Availability
from .entry_points import group_entry_points

PLUGINS_ENV = "ELIZA_BACKENDS_PLUGINS"


@dataclass(frozen=True)
class PluginProblem:
    """A plugin that could not contribute backends, and why."""

    plugin: str
    distribution: str | None
    error: str


@dataclass(frozen=True)
class BackendInfo:
    """One row of :func:`list_backends`: a backend as this process sees it."""

    name: str
    aliases: tuple[str, ...]
    plugin: str
    distribution: str | None
    version: str | None
    available: bool
    reason: str
    rank: int
    rank_reason: str
    formats: tuple[str, ...]
    pip_extra: str | None
    detail: Mapping[str, str]

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready form."""
        return {
            "name": self.name, "aliases": list(self.aliases), "plugin": self.plugin,
            "distribution": self.distribution, "version": self.version,
            "available": self.available, "reason": self.reason, "rank": self.rank,
            "rank_reason": self.rank_reason, "formats": list(self.formats),
            "pip_extra": self.pip_extra, "detail": dict(self.detail),
        }


@dataclass(frozen=True)
class _Entry:
    factory: Factory
    plugin: str
    distribution: str | None
    version: str | None


def allowed_plugins(environ: Mapping[str, str]) -> frozenset[str] | None:
    """The ``ELIZA_BACKENDS_PLUGINS`` allowlist, or None when unset (everything may load)."""
    raw = environ.get(PLUGINS_ENV)
    if raw is None or not raw.strip():
        return None
    return frozenset(p.strip() for p in raw.split(",") if p.strip())


class Registry:
    """The backends of one process (or of one test): entry points plus in-process plugins."""

    def __init__(self, *, environ: Mapping[str, str] | None = None,
                 group: str = hookspecs.ENTRY_POINT_GROUP, entry_points: bool = True) -> None:
        self._environ = environ
        self._group = group
        self._use_entry_points = entry_points
        self._lock = threading.RLock()
        self._pm = pluggy.PluginManager(hookspecs.PROJECT_NAME)
        self._pm.add_hookspecs(hookspecs)
        self._dists: dict[str, tuple[str | None, str | None]] = {}
        self._loaded = False
        self._entries: list[_Entry] = []
        self._load_problems: list[PluginProblem] = []  # import / registration failures
        self._hook_problems: list[PluginProblem] = []  # bad results of the hook

    # ------------------------------------------------------------------ loading

    def register(self, plugin: object, name: str | None = None) -> None:
        """Register an in-process plugin (a module or object with ``@hookimpl`` functions)."""
        with self._lock:
            plugin_name = name or getattr(plugin, "__name__", None) or repr(plugin)
            self._safe_register(plugin, plugin_name, None, None)
            self._collect()

    def _safe_register(self, plugin: object, name: str, dist: str | None,
                       version: str | None) -> None:
        try:
            self._pm.register(plugin, name=name)
            self._pm.check_pending()
        except Exception as exc:  # a broken plugin must not break the others
            if self._pm.is_registered(plugin):
                self._pm.unregister(plugin)
            self._load_problems.append(PluginProblem(name, dist, f"{type(exc).__name__}: {exc}"))
            return
        self._dists[name] = (dist, version)

    def _discover(self) -> None:
        if self._loaded:
            return
        self._loaded = True
        if not self._use_entry_points:
            self._collect()
            return
        environ = os.environ if self._environ is None else self._environ
        allow = allowed_plugins(environ)
        for ep in sorted(group_entry_points(self._group), key=lambda e: e.name):
            if allow is not None and ep.name not in allow:
                continue
            if self._pm.has_plugin(ep.name):
                continue
            dist, version = ep.distribution, ep.version
            try:
                plugin = ep.load()
            except Exception as exc:
                self._load_problems.append(PluginProblem(
                    ep.name, dist, f"import failed: {type(exc).__name__}: {exc}"))
                continue
            self._safe_register(plugin, ep.name, dist, version)
        self._collect()

    def _collect(self) -> None:
        """Ask every registered plugin for its factories; keep the good, report the bad."""
        entries: list[_Entry] = []
        seen: dict[str, str] = {}
        problems: list[PluginProblem] = []
        for impl in self._pm.hook.eliza_backends_factories.get_hookimpls():  # load order
            name = impl.plugin_name
            dist, version = self._dists.get(name, (None, None))
            try:
                result = impl.function()
            except Exception as exc:
                problems.append(PluginProblem(
                    name, dist, f"eliza_backends_factories() raised {type(exc).__name__}: {exc}"))
                continue
            items: Iterable[object] = [result] if isinstance(result, Factory) else (
                result if isinstance(result, (list, tuple)) else [result])
            for item in items:
                if not isinstance(item, Factory):
                    problems.append(PluginProblem(
                        name, dist, f"eliza_backends_factories() returned {item!r}, not a "
                        "Factory instance"))
                    continue
                if not isinstance(getattr(item, "name", None), str) or not item.name:
                    problems.append(PluginProblem(name, dist, f"{item!r} has no name"))
                    continue
                if not _logger_names(item.native_loggers):
                    problems.append(PluginProblem(
                        name, dist, f"backend {item.name!r} declares native_loggers = "
                        f"{item.native_loggers!r}: give a tuple of logger names"))
                    continue
                keys = {n.lower() for n in item.names()}
                clash = sorted(k for k in keys if k in seen)
                if clash:
                    problems.append(PluginProblem(
                        name, dist, f"backend {item.name!r} clashes with plugin "
                        f"{seen[clash[0]]!r} over the name {clash[0]!r}; uninstall one of them "
                        f"or pin plugins with {PLUGINS_ENV}"))
                    continue
                for k in keys:
                    seen[k] = name
                entries.append(_Entry(item, name, dist, version))
        self._entries = entries
        self._hook_problems = problems

    # ------------------------------------------------------------------ queries

    def factories(self) -> list[Factory]:
        """Every backend successfully provided by a plugin, in discovery order."""
        with self._lock:
            self._discover()
            return [e.factory for e in self._entries]

    def problems(self) -> list[PluginProblem]:
        """Plugins that failed, with the reason."""
        with self._lock:
            self._discover()
            return [*self._load_problems, *self._hook_problems]

    def get(self, name: str) -> Factory | None:
        """The backend called ``name`` (canonical or alias, case-insensitive), if registered."""
        key = name.strip().lower()
        for factory in self.factories():
            if key in (n.lower() for n in factory.names()):
                return factory
        return None

    def info(self) -> list[BackendInfo]:
        """One :class:`BackendInfo` per backend (calls each ``available()``; loads no model)."""
        self.factories()
        rows = []
        for e in self._entries:
            avail = safe_available(e.factory)
            rows.append(BackendInfo(
                name=e.factory.name, aliases=tuple(e.factory.aliases), plugin=e.plugin,
                distribution=e.distribution, version=e.version, available=avail.ok,
                reason=avail.reason, rank=safe_rank(e.factory),
                rank_reason=e.factory.rank_reason(), formats=tuple(e.factory.formats),
                pip_extra=e.factory.pip_extra, detail=avail.detail))
        return rows


def _logger_names(value: object) -> bool:
    """Whether ``value`` is a valid ``Factory.native_loggers``: a tuple or list of non-empty
    logger names."""
    return isinstance(value, (tuple, list)) and all(isinstance(n, str) and n for n in value)


def safe_available(factory: Factory) -> Availability:
    """``factory.available()``, turning an exception into an unavailable verdict."""
    try:
        avail = factory.available()
    except Exception as exc:
        return Availability.no(f"available() raised {type(exc).__name__}: {exc}")
    if not isinstance(avail, Availability):
        return Availability(bool(avail), "" if avail else "available() returned false")
    return avail


def safe_rank(factory: Factory) -> int:
    """``factory.preference_rank()``, 0 if it misbehaves."""
    try:
        rank = factory.preference_rank()
    except Exception:
        return 0
    return rank if isinstance(rank, int) and not isinstance(rank, bool) else 0


_default: Registry | None = None
_default_lock = threading.Lock()


def default_registry() -> Registry:
    """The process-wide registry (created on first use, discovers lazily)."""
    global _default
    with _default_lock:
        if _default is None:
            _default = Registry()
        return _default


def reset_default_registry() -> None:
    """Forget the process-wide registry, so the next use rediscovers plugins (tests, reloads)."""
    global _default
    with _default_lock:
        _default = None


def list_backends(registry: Registry | None = None) -> list[BackendInfo]:
    """Every installed backend with its availability, rank and the artifacts it serves."""
    return (registry or default_registry()).info()


def plugin_problems(registry: Registry | None = None) -> list[PluginProblem]:
    """Plugins that failed to load, with the reason."""
    return (registry or default_registry()).problems()


__all__ = [
    "PLUGINS_ENV",
    "BackendInfo",
    "PluginProblem",
    "Registry",
    "allowed_plugins",
    "default_registry",
    "list_backends",
    "plugin_problems",
    "reset_default_registry",
]
