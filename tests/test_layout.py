"""The package's layout is checked, so it cannot drift (issue 27).

* ``eliza_backends/__init__``: one lazy table, and the ``TYPE_CHECKING`` imports type checkers
  read say exactly the same (name -> module);
* no import cycle between the core's modules at module level (read from the source);
* every ``ElizaError`` subclass lives in ``errors.py`` and is drawn in its hierarchy;
* at most 16 modules at the package root, no class over 500 lines and no function over 80;
* plugins import the core only through ``eliza_backends`` and the plugin kit
  ``eliza_backends.backend``, which exports every name they use.
"""

from __future__ import annotations

import ast
import textwrap
from pathlib import Path

import import_graph
import pytest
from conftest import ROOT

SRC = ROOT / "src"
PACKAGE = SRC / "eliza_backends"
PLUGIN_SRCS = sorted(ROOT.glob("plugins/*/src"))
PLUGIN_API = ("eliza_backends", "eliza_backends.backend")


def _python_files(*roots: Path) -> list[Path]:
    return sorted(p for root in roots for p in root.rglob("*.py"))


def _type_checking_imports(tree: ast.Module) -> dict[str, str]:
    """name -> module (relative to the package) of the ``if TYPE_CHECKING:`` imports."""
    out: dict[str, str] = {}
    for node in tree.body:
        if isinstance(node, ast.If) and getattr(node.test, "id", None) == "TYPE_CHECKING":
            for imp in node.body:
                assert isinstance(imp, ast.ImportFrom) and imp.level == 1 and imp.module
                for alias in imp.names:
                    assert alias.asname == alias.name, f"re-export {alias.name} as itself"
                    assert alias.name not in out, f"{alias.name} imported twice"
                    out[alias.name] = imp.module
    return out


def test_the_lazy_table_and_the_type_checking_imports_agree() -> None:
    import eliza_backends

    tree = ast.parse((PACKAGE / "__init__.py").read_text(encoding="utf-8"))
    assert _type_checking_imports(tree) == eliza_backends._LAZY
    assert sorted(eliza_backends.__all__) == sorted(["__version__", *eliza_backends._LAZY])
    for name, module in eliza_backends._LAZY.items():
        real = __import__(f"eliza_backends.{module}", fromlist=[name])
        assert getattr(eliza_backends, name) is getattr(real, name), name


def test_no_import_cycle_between_core_modules() -> None:
    edges = import_graph.graph(SRC, "eliza_backends")
    assert len(edges) > 40 and edges["eliza_backends.stream"], "the graph was read"
    assert import_graph.cycles(edges) == []


def test_the_cycle_check_finds_a_cycle(tmp_path: Path) -> None:
    """The check above can fail: a two-module cycle and a cycle through a package's
    ``__init__`` are found; a ``TYPE_CHECKING`` or function-level import is not an edge."""
    pkg = tmp_path / "pkg"
    (pkg / "sub").mkdir(parents=True)
    files = {
        "__init__.py": "",
        "a.py": "from .b import B\nA = 1\n",
        "b.py": "from __future__ import annotations\nfrom typing import TYPE_CHECKING\n"
                "if TYPE_CHECKING:\n    from .c import C\ntry:\n    from .a import A\n"
                "except ImportError:\n    A = 0\nB = 2\n",
        "c.py": "def f():\n    from .a import A\n    return A\n",
        "sub/__init__.py": "from .d import D\nE = 1\n",
        "sub/d.py": "from . import E\nD = E\n",
    }
    for name, text in files.items():
        (pkg / name).write_text(textwrap.dedent(text))
    edges = import_graph.graph(tmp_path, "pkg")
    assert edges["pkg.c"] == set()
    assert import_graph.cycles(edges) == [["pkg.a", "pkg.b"], ["pkg.sub", "pkg.sub.d"]]


def _error_classes(errors_names: set[str]) -> dict[str, Path]:
    """Every class in the core and the plugins that derives (by name, transitively) from one
    of ``errors_names``: class name -> file."""
    classes: dict[str, tuple[Path, list[str]]] = {}
    for path in _python_files(PACKAGE, *PLUGIN_SRCS):
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if isinstance(node, ast.ClassDef):
                bases = [b.id if isinstance(b, ast.Name) else getattr(b, "attr", "")
                         for b in node.bases]
                classes[f"{path}:{node.name}"] = (path, bases)
    derived = set(errors_names)
    found: dict[str, Path] = {}
    changed = True
    while changed:
        changed = False
        for key, (path, bases) in classes.items():
            name = key.rpartition(":")[2]
            if key not in found and derived.intersection(bases):
                found[key] = path
                derived.add(name)
                changed = True
    return found


def test_every_eliza_error_lives_in_errors_and_is_drawn() -> None:
    from eliza_backends import ElizaError, errors

    defined = {name for name, obj in vars(errors).items()
               if isinstance(obj, type) and issubclass(obj, ElizaError)}
    assert len(defined) >= 18
    outside = {key for key, path in _error_classes({"ElizaError"}).items()
               if path != PACKAGE / "errors.py"}
    assert outside == set(), "define every ElizaError subclass in eliza_backends/errors.py"
    doc = errors.__doc__ or ""
    drawn = {line.split("── ")[1].split()[0] for line in doc.splitlines() if "── " in line}
    assert drawn == defined - {"ElizaError"}, "draw the hierarchy in errors.py's docstring"


def test_at_most_16_modules_at_the_package_root() -> None:
    root = sorted(p.name for p in PACKAGE.glob("*.py"))
    assert len(root) <= 16, root


def _core_imports(path: Path) -> list[str]:
    """The ``eliza_backends...`` modules a file imports, anywhere in it."""
    out = []
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            out.append(node.module)
        elif isinstance(node, ast.Import):
            out.extend(alias.name for alias in node.names)
    return [m for m in out if m.split(".")[0] == "eliza_backends"]


@pytest.mark.parametrize("plugin", PLUGIN_SRCS, ids=lambda p: p.parent.name)
def test_plugins_import_the_core_only_through_the_plugin_kit(plugin: Path) -> None:
    import eliza_backends
    import eliza_backends.backend as kit

    used = 0
    for path in _python_files(plugin):
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if isinstance(node, ast.ImportFrom) and node.module in PLUGIN_API:
                api = eliza_backends if node.module == "eliza_backends" else kit
                for alias in node.names:
                    assert alias.name in api.__all__, (path.name, node.module, alias.name)
                    used += 1
        bad = [m for m in _core_imports(path) if m not in PLUGIN_API]
        assert bad == [], f"{path}: import these through eliza_backends.backend"
    assert used


def test_no_class_over_500_lines() -> None:
    """Every class in the core and the plugins fits in 500 lines (Session is split into its
    hooks, guard, turn, speculation and repair to stay under it)."""
    long = []
    for path in _python_files(PACKAGE, *PLUGIN_SRCS):
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if isinstance(node, ast.ClassDef) and node.end_lineno is not None and \
                    node.end_lineno - node.lineno + 1 > 500:
                long.append(f"{path.relative_to(ROOT)}:{node.name} "
                            f"({node.end_lineno - node.lineno + 1} lines)")
    assert long == []


def _long_functions(paths: list[Path], limit: int = 80) -> list[str]:
    """``path:name (n lines)`` of every function or method over ``limit`` lines (from ``def``
    to its last line; nested functions count in their parent too)."""
    long = []
    for path in paths:
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)) and \
                    node.end_lineno is not None and node.end_lineno - node.lineno + 1 > limit:
                long.append(f"{path}:{node.name} ({node.end_lineno - node.lineno + 1} lines)")
    return long


def test_no_function_over_80_lines() -> None:
    """Every function in the core and the plugins fits in 80 lines (issue 27: cli.build_parser
    and convert's pipeline are tables walked by short loops)."""
    assert _long_functions(_python_files(PACKAGE, *PLUGIN_SRCS)) == []


def test_the_function_length_check_finds_a_long_function(tmp_path: Path) -> None:
    body = "".join(f"    x{i} = {i}\n" for i in range(79))
    (tmp_path / "m.py").write_text(f"def fits():\n{body}\n\nasync def over():\n{body}    "
                                   "return x0\n")
    assert _long_functions([tmp_path / "m.py"]) == [f"{tmp_path / 'm.py'}:over (81 lines)"]
