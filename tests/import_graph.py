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


def _module_path(roots: Mapping[str, Path], parts: list[str]) -> Path | None:
    base = roots.get(parts[0])
    if base is None:
        return None
    folder = base.joinpath(*parts)
    if (folder / "__init__.py").is_file():
        return folder / "__init__.py"
    file = folder.with_suffix(".py")
    return file if len(parts) > 1 and file.is_file() else None


def _bindings(body: list[ast.stmt]) -> dict[str, ast.AST]:
    """Name -> the statement that binds it, at the top of ``body`` (in top-level ``if`` and
    ``try`` blocks too; a package's lazy ``_LAZY = {name: module}`` table counts)."""
    out: dict[str, ast.AST] = {}
    for node in body:
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            out[node.name] = node
        elif isinstance(node, (ast.Assign, ast.AnnAssign)):
            targets = node.targets if isinstance(node, ast.Assign) else [node.target]
            for target in targets:
                for name in ast.walk(target):
                    if isinstance(name, ast.Name):
                        out[name.id] = node
                        if name.id == "_LAZY" and isinstance(node.value, ast.Dict):
                            out.update((k.value, node) for k in node.value.keys
                                       if isinstance(k, ast.Constant) and isinstance(k.value, str))
        elif isinstance(node, (ast.Import, ast.ImportFrom)):
            for alias in node.names:
                out[(alias.asname or alias.name).split(".")[0]] = node
        elif isinstance(node, ast.If):
            out.update(_bindings(node.body))
            out.update(_bindings(node.orelse))
        elif isinstance(node, ast.Try):
            for block in (node.body, node.orelse, node.finalbody, *(h.body for h in node.handlers)):
                out.update(_bindings(block))
    return out


def resolves(dotted: str, roots: Mapping[str, Path], depth: int = 0) -> bool:
    """True when ``dotted`` (``pkg.module.Name.attr``) names a module of one of ``roots``
    (package name -> the folder holding it), a name bound in it, or an attribute of a class
    defined there (read from the source, nothing imported; a name a module imports is followed
    to where it comes from; an attribute a class may inherit is taken on trust)."""
    parts = dotted.split(".")
    cut = next((k for k in range(len(parts), 0, -1) if _module_path(roots, parts[:k])), 0)
    if not cut or depth > 8:
        return False
    if cut == len(parts):
        return True
    path = _module_path(roots, parts[:cut])
    assert path is not None
    name, rest = parts[cut], parts[cut + 1:]
    node = _bindings(ast.parse(path.read_text(encoding="utf-8")).body).get(name)
    if node is None:
        return False
    if isinstance(node, ast.ImportFrom) and rest:
        package = parts[:cut] if path.name == "__init__.py" else parts[:cut - 1]
        origin = (package[:len(package) - node.level + 1] if node.level else []) + \
            (node.module.split(".") if node.module else [])
        real = next(a.name for a in node.names if (a.asname or a.name) == name)
        return resolves(".".join([*origin, real, *rest]), roots, depth + 1)
    if isinstance(node, ast.ClassDef) and rest:
        own = _bindings(node.body)
        return rest[0] in own or bool(node.bases)
    return True
