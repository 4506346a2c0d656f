"""Installed distributions read cheaply: one entry-point group, one distribution's version.

``importlib.metadata.entry_points(group=...)`` builds a distribution object for every installed
package and parses every ``entry_points.txt`` (and, for ``ep.dist.name``, the distribution's
``METADATA`` with the email parser): 160 distributions cost a fresh process more than importing
and loading this package's plugins. :func:`group_entry_points` lists the ``*.dist-info`` and
``*.egg-info`` folders on ``sys.path`` instead, reads only the ``entry_points.txt`` files that
have a ``[group]`` section, and the name and version of only those distributions (the first
lines of their ``METADATA`` / ``PKG-INFO``). :func:`distribution_version` is
``importlib.metadata.version`` read the same way (the plugins' availability probes report
their runtime's version). As with ``importlib.metadata``, the first distribution of a name on
the path wins.

:meth:`EntryPointRef.load` imports the object an installed distribution names (what
``EntryPoint.load`` does); nothing read from a bundle is ever imported.
"""

from __future__ import annotations

import functools
import os
import re
import sys
from collections.abc import Iterable
from dataclasses import dataclass

_INFO_SUFFIXES = (".dist-info", ".egg-info")
_NORMALIZE = re.compile(r"[-_.]+")


@dataclass(frozen=True)
class EntryPointRef:
    """One entry point: its ``name``, its ``value`` (``module`` or ``module:attr``), and the
    distribution that declares it (name and version as its metadata spells them)."""

    name: str
    value: str
    distribution: str | None
    version: str | None

    def load(self) -> object:
        """Import the module ``value`` names and return it, or its attribute after ``:``."""
        import pkgutil

        return pkgutil.resolve_name(self.value.split("[", 1)[0].strip())


def group_entry_points(group: str, path: Iterable[str] | None = None) -> list[EntryPointRef]:
    """The entry points of ``group`` that the distributions on ``path`` (default
    ``sys.path``) declare, in path order; a distribution name seen earlier on the path hides
    later ones (as ``importlib.metadata`` does)."""
    found: list[EntryPointRef] = []
    seen: set[str] = set()
    header = f"[{group}]"
    for folder in (sys.path if path is None else path):
        for key, info in _info_dirs(folder or "."):
            if key in seen:
                continue
            seen.add(key)
            text = _read(os.path.join(info, "entry_points.txt"))
            if text is None or header not in text:
                continue
            name, version = _name_and_version(info)
            found += [EntryPointRef(ep, value, name, version)
                      for ep, value in _section(text, group)]
    return found


def distribution_version(name: str, path: Iterable[str] | None = None) -> str | None:
    """The version of the installed distribution ``name`` (any spelling: ``ai-edge-litert``,
    ``ai_edge_litert``), the first on ``path`` (default ``sys.path``); None when it is not
    installed or its metadata has no version."""
    wanted = _NORMALIZE.sub("_", name).lower()
    for folder in (sys.path if path is None else path):
        for key, info in _info_dirs(folder or "."):
            if key == wanted:
                return _name_and_version(info)[1]
    return None


def _info_dirs(folder: str) -> tuple[tuple[str, str], ...]:
    """``(normalized distribution name, metadata folder)`` of the distributions directly
    inside ``folder``, sorted by folder name; the listing is cached per process until the
    folder's mtime changes (installing or removing a distribution changes it), as
    ``importlib.metadata`` caches its own."""
    try:
        mtime = os.stat(folder).st_mtime_ns
    except OSError:  # a missing path entry
        return ()
    return _listing(folder, mtime)


@functools.lru_cache(maxsize=64)
def _listing(folder: str, mtime_ns: int) -> tuple[tuple[str, str], ...]:
    try:
        with os.scandir(folder) as entries:
            found = sorted(e.path for e in entries if e.name.endswith(_INFO_SUFFIXES)
                           and e.is_dir())
    except OSError:  # not a folder (a zip)
        return ()
    return tuple((_dist_key(os.path.basename(path)), path) for path in found)


def _dist_key(folder_name: str) -> str:
    """The normalized distribution name of a ``name-version.dist-info`` (or ``name.egg-info``)
    folder name."""
    stem = folder_name.rsplit(".", 1)[0] if folder_name.endswith(_INFO_SUFFIXES) else folder_name
    return _NORMALIZE.sub("_", stem.split("-", 1)[0]).lower()


def _read(path: str) -> str | None:
    try:
        with open(path, encoding="utf-8") as f:
            return f.read()
    except (OSError, UnicodeDecodeError):
        return None


def _section(text: str, group: str) -> list[tuple[str, str]]:
    """The ``name = value`` lines of the ``[group]`` section of an ``entry_points.txt``."""
    out: list[tuple[str, str]] = []
    inside = False
    for raw in text.splitlines():
        line = raw.strip()
        if not line or line.startswith(("#", ";")):
            continue
        if line.startswith("[") and line.endswith("]"):
            inside = line[1:-1].strip() == group
            continue
        if inside and "=" in line:
            name, value = line.split("=", 1)
            out.append((name.strip(), value.strip()))
    return out


def _name_and_version(info: str) -> tuple[str | None, str | None]:
    """``Name`` and ``Version`` from the metadata file's header (None where missing)."""
    text = _read(os.path.join(info, "METADATA")) or _read(os.path.join(info, "PKG-INFO")) or ""
    fields: dict[str, str] = {}
    for line in text.splitlines():
        if not line.strip():
            break  # the header ends at the first blank line
        key, sep, value = line.partition(":")
        if sep and key in ("Name", "Version") and key not in fields:
            fields[key] = value.strip()
    return fields.get("Name"), fields.get("Version")


__all__ = ["EntryPointRef", "distribution_version", "group_entry_points"]
