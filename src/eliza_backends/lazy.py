"""Names a package imports on first use (PEP 562), for ``eliza_backends`` and its plugin kit.

A package keeps a table ``name -> module`` and a function that imports one module of it by a
static import (no module name is computed: tests/test_reliability.py bans ``import_module``);
:func:`lazy_names` turns them into the package's ``__getattr__`` and ``__dir__``. A name is
imported once, then stored in the package's namespace.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, MutableMapping
from types import ModuleType
from typing import Any


def lazy_names(package: str, table: Mapping[str, str], load: Callable[[str], ModuleType],
               namespace: MutableMapping[str, Any]
               ) -> tuple[Callable[[str], Any], Callable[[], list[str]]]:
    """``(__getattr__, __dir__)`` for ``package``: a name of ``table`` is
    ``getattr(load(table[name]), name)``, kept in ``namespace`` (the package's
    ``globals()``) after its first use; any other name is an :class:`AttributeError`."""

    def getattr_(name: str) -> Any:
        module = table.get(name)
        if module is None:
            raise AttributeError(f"module {package!r} has no attribute {name!r}")
        value = getattr(load(module), name)
        namespace[name] = value
        return value

    def dir_() -> list[str]:
        return sorted(set(namespace) | set(table))

    return getattr_, dir_


__all__ = ["lazy_names"]
