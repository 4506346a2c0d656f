"""The module-level import graph of a package, read from its source (nothing is imported).

An edge ``a -> b`` means that importing module ``a`` imports module ``b`` while ``a`` runs:
an ``import`` / ``from ... import`` statement at module level, including those in a top-level
``try`` or ``if`` block, except under ``if TYPE_CHECKING:``. Imports inside functions and
classes' methods run later and are not edges. Importing ``p.q.r`` also runs ``p/__init__`` and
``p/q/__init__``, so those are edges too, and ``from p import name`` is an edge to ``p.name``
when that is a module.
"""

from __future__ import annotations

import ast
from collections.abc import Iterator, Mapping
from pathlib import Path


def modules(src: Path, package: str) -> dict[str, Path]:
    """Every module of ``package`` (whose folder is ``src / package``): dotted name -> file."""
    out: dict[str, Path] = {}
    for path in sorted((src / package).rglob("*.py")):
        parts = path.relative_to(src).with_suffix("").parts
        if parts[-1] == "__init__":
            parts = parts[:-1]
        out[".".join(parts)] = path
    return out


def _is_type_checking(test: ast.expr) -> bool:
    return (isinstance(test, ast.Name) and test.id == "TYPE_CHECKING") or (
        isinstance(test, ast.Attribute) and test.attr == "TYPE_CHECKING")


def _module_level(body: list[ast.stmt]) -> Iterator[ast.Import | ast.ImportFrom]:
    for node in body:
        if isinstance(node, (ast.Import, ast.ImportFrom)):
            yield node
        elif isinstance(node, ast.If):
            if not _is_type_checking(node.test):
                yield from _module_level(node.body)
            yield from _module_level(node.orelse)
        elif isinstance(node, ast.Try):
            for block in (node.body, node.orelse, node.finalbody,
                          *(h.body for h in node.handlers)):
                yield from _module_level(block)
        elif isinstance(node, ast.With):
            yield from _module_level(node.body)


def _everywhere(body: list[ast.stmt], type_only: bool = False
                ) -> Iterator[ast.Import | ast.ImportFrom]:
    """Every import statement, in functions too, except under ``if TYPE_CHECKING:`` (unless
    ``type_only``)."""
    todo: list[ast.AST] = list(body)
    while todo:
        node = todo.pop()
        if isinstance(node, (ast.Import, ast.ImportFrom)):
            yield node
        elif isinstance(node, ast.If) and _is_type_checking(node.test) and not type_only:
            todo.extend(node.orelse)
        else:
            todo.extend(ast.iter_child_nodes(node))


def _with_parents(name: str) -> list[str]:
    parts = name.split(".")
    return [".".join(parts[:i]) for i in range(1, len(parts) + 1)]


def imports(name: str, path: Path, known: Mapping[str, Path], *, lazy: bool = False,
            type_only: bool = False) -> set[str]:
    """The modules of ``known`` that importing ``name`` (the file ``path``) imports at once.

    The packages ``name`` is inside are being imported already when it runs; they are edges
    only when ``name`` takes a name defined in one (``from . import X``, X not a module).
    ``lazy``: the imports inside functions count too (what the module depends on at all);
    ``type_only`` (with ``lazy``): those under ``if TYPE_CHECKING:`` too."""
    is_package = path.name == "__init__.py"
    package = name if is_package else name.rpartition(".")[0]
    ancestors = set(_with_parents(name))
    found: set[str] = set()

    def add(target: str) -> None:
        found.update(m for m in _with_parents(target) if m in known and m not in ancestors)

    body = ast.parse(path.read_text(encoding="utf-8")).body
    for node in (_everywhere(body, type_only) if lazy else _module_level(body)):
        if isinstance(node, ast.Import):
            for alias in node.names:
                add(alias.name)
            continue
        if node.level:
            base = package.split(".")
            base = base[: len(base) - (node.level - 1)]
            origin = ".".join(base + ([node.module] if node.module else []))
        else:
            origin = node.module or ""
        add(origin)
        for alias in node.names:
            if f"{origin}.{alias.name}" in known:
                add(f"{origin}.{alias.name}")
            elif origin in known:
                found.add(origin)  # a name defined in the package's __init__
    found.discard(name)
    return found


def graph(src: Path, package: str, *, lazy: bool = False, type_only: bool = False
          ) -> dict[str, set[str]]:
    """Module -> the modules it imports at module level (within ``package`` only); with
    ``lazy``, the imports inside functions too; with ``type_only`` as well, those under
    ``if TYPE_CHECKING:``."""
    known = modules(src, package)
    return {name: imports(name, path, known, lazy=lazy, type_only=type_only)
            for name, path in known.items()}


def cycles(edges: Mapping[str, set[str]]) -> list[list[str]]:
    """The strongly connected components with more than one module (Tarjan), each sorted:
    every import cycle is inside one of them."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        on_stack.add(v)
        for w in edges.get(v, ()):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component = []
            while True:
                w = stack.pop()
                on_stack.discard(w)
                component.append(w)
                if w == v:
                    break
            if len(component) > 1:
                found.append(sorted(component))

    for v in sorted(edges):
        if v not in index:
            visit(v)
    return found
