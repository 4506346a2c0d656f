"""docs/architecture.md's picture of the parts is checked against the real imports (issue 27).

Every import in ``src/eliza_backends`` (at module level and inside functions; not those under
``if TYPE_CHECKING:``) is an arrow from the part of the importing module to the part of the
imported one. The page's table must list exactly those arrows, every module must belong to a
part of the table, and in the picture every arrow must point down (to a later line).

Across the core and every plugin (issue 36): no import circle between files at all (imports in
functions and under ``if TYPE_CHECKING:`` included), and every dotted name of a module of ours
that a docstring, message or doc page mentions still names something.
"""

from __future__ import annotations

import ast
import re
import textwrap
from pathlib import Path

import import_graph
import pytest
from conftest import ROOT

PAGE = ROOT / "docs" / "architecture.md"


def _section() -> str:
    text = PAGE.read_text(encoding="utf-8")
    return text[text.index("## Layout"):text.index("\n## ", text.index("## Layout") + 1)]


def _parts() -> tuple[dict[str, tuple[str, ...]], dict[str, set[str]]]:
    """part -> its module names / folder prefixes, part -> the parts it imports (the table)."""
    members: dict[str, tuple[str, ...]] = {}
    arrows: dict[str, set[str]] = {}
    table = _section().split("| Part | Modules | Imports |")[1].split("\n\n")[0]
    for line in table.strip().splitlines()[1:]:
        part, modules, imports = (c.strip() for c in line.strip().strip("|").split("|"))
        members[part] = tuple(re.findall(r"`([\w/]+)`", modules))
        arrows[part] = {p.strip() for p in imports.split(",") if p.strip()}
    return members, arrows


def _part_of(module: str, members: dict[str, tuple[str, ...]]) -> str:
    rel = module.removeprefix("eliza_backends").lstrip(".") or "__init__"
    for part, names in members.items():
        for name in names:
            if (name.endswith("/") and (rel + ".").startswith(name[:-1] + ".")) or rel == name:
                return part
    raise AssertionError(f"{module} belongs to no part of docs/architecture.md's table")


def _real_arrows(members: dict[str, tuple[str, ...]]) -> dict[str, set[str]]:
    edges = import_graph.graph(ROOT / "src", "eliza_backends", lazy=True)
    arrows: dict[str, set[str]] = {part: set() for part in members}
    for module, targets in edges.items():
        source = _part_of(module, members)
        arrows[source] |= {_part_of(t, members) for t in targets} - {source}
    return arrows


def test_the_table_lists_exactly_the_real_arrows() -> None:
    members, documented = _parts()
    assert len(members) >= 12
    assert _real_arrows(members) == documented


def test_the_picture_has_every_part_and_every_arrow_points_down() -> None:
    members, documented = _parts()
    picture = _section().split("```text")[1].split("```")[0]
    order: dict[str, int] = {}
    for row, line in enumerate(picture.splitlines()):
        first = line.split()[0].rstrip("/") if line.split() else ""
        if first == "front":
            first = "front door"
        if first in members:
            order[first] = row
    assert set(order) == set(members), "draw every part of the table in the picture"
    for part, imports in documented.items():
        for target in imports:
            assert order[target] > order[part], f"{part} -> {target} points up in the picture"


#: The packages of this repository: name -> the folder holding it.
PACKAGES = {"eliza_backends": ROOT / "src",
            **{src.parent.name: src for src in sorted(ROOT.glob("plugins/*/src"))}}


@pytest.mark.parametrize("package", sorted(PACKAGES))
def test_no_import_circle_between_files(package: str) -> None:
    """Every import counts, at module level, in functions and type-only: a circle between two
    files means neither can be read, tested or moved without the other."""
    edges = import_graph.graph(PACKAGES[package], package, lazy=True, type_only=True)
    assert len(edges) > 5, "the graph was read"
    assert import_graph.cycles(edges) == []


@pytest.mark.parametrize("plugin", sorted(set(PACKAGES) - {"eliza_backends"}))
def test_no_plugin_module_imports_its_plugins_init(plugin: str) -> None:
    """The ``__init__`` is the plugin's front door (the Factory, light); a constant two
    modules share lives in a leaf module."""
    edges = import_graph.graph(PACKAGES[plugin], plugin, lazy=True, type_only=True)
    assert sorted(m for m, targets in edges.items() if plugin in targets) == []


def test_the_full_graph_has_type_only_and_lazy_edges(tmp_path: Path) -> None:
    """The check above can fail: a circle closed by a function-level import and a
    ``TYPE_CHECKING`` one is found only in the full graph."""
    pkg = tmp_path / "pkg"
    pkg.mkdir()
    files = {"__init__.py": "", "a.py": "from .b import B\nA = 1\n",
             "b.py": "from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    from .c import C\n"
                     "B = 2\n",
             "c.py": "def f():\n    from .a import A\n    return A\n"}
    for name, text in files.items():
        (pkg / name).write_text(textwrap.dedent(text))
    assert import_graph.cycles(import_graph.graph(tmp_path, "pkg", lazy=True)) == []
    assert import_graph.cycles(import_graph.graph(tmp_path, "pkg", lazy=True, type_only=True)) == \
        [["pkg.a", "pkg.b", "pkg.c"]]


_DOTTED = re.compile(r"\b(?:" + "|".join(PACKAGES) + r")(?:\.[A-Za-z_]\w*)+")


def _mentions() -> dict[str, set[str]]:
    """Dotted names of our modules in src/, plugins/ and docs/ -> the files naming them
    (logger names, given to ``getLogger`` or declared as native loggers, left out)."""
    files = [p for folder in ("src", "plugins", "docs") for p in (ROOT / folder).rglob("*")
             if p.suffix in (".py", ".md") and p.is_file()]
    texts = {p: p.read_text(encoding="utf-8") for p in files}
    loggers = {name for text in texts.values() for name in re.findall(
        r"""getLogger\(["']([\w.]+)["']\)""", text)}
    loggers |= {name for text in texts.values()
                for block in re.findall(r"(?i)native_loggers\b[^=\n]*=\s*\(([^)]*)\)", text)
                for name in re.findall(r"""["']([\w.]+)["']""", block)}
    found: dict[str, set[str]] = {}
    for path, text in texts.items():
        for name in set(_DOTTED.findall(text)) - loggers:
            found.setdefault(name, set()).add(str(path.relative_to(ROOT)))
    return found


def test_no_dotted_name_of_ours_is_stale() -> None:
    """A docstring, message or page that names ``eliza_backends.x.y`` (or a plugin's module)
    names a module, or something defined in one, that exists (read from the source)."""
    mentions = _mentions()
    assert len(mentions) > 100, "the names were read"
    stale = {name: sorted(where) for name, where in mentions.items()
             if not import_graph.resolves(name, PACKAGES)}
    assert stale == {}


def test_the_stale_name_check_finds_a_stale_name() -> None:
    assert import_graph.resolves("eliza_backends.backend.session.Session.prefill", PACKAGES)
    assert import_graph.resolves("eliza_backends.Session", PACKAGES)  # the lazy table
    assert not import_graph.resolves("eliza_backends.completions.Generation", PACKAGES)
    assert not import_graph.resolves("eliza_llamacpp.session.load_model", PACKAGES)


def test_the_plugin_table_names_every_plugin_file() -> None:
    """docs/architecture.md's role table (a file name means the same role in every plugin)
    lists exactly each plugin's modules, in its column."""
    text = PAGE.read_text(encoding="utf-8")
    table = text[text.index("| Role |"):].split("\n\n")[0].splitlines()
    plugins = re.findall(r"`(\w+)`", table[0])
    assert sorted(plugins) == sorted(p for p in PACKAGES if p != "eliza_backends")
    listed: dict[str, set[str]] = {p: set() for p in plugins}
    for row in table[2:]:
        cells = [c.strip() for c in row.strip().strip("|").split("|")]
        for plugin, cell in zip(plugins, cells[1:], strict=True):
            listed[plugin] |= set(re.findall(r"`([a-z_][a-z0-9_]*)`", cell))  # not `Lane`
    for plugin in plugins:
        real = {p.stem for p in (PACKAGES[plugin] / plugin).glob("*.py")}
        assert listed[plugin] == real, plugin

def _convert_rooms() -> list[tuple[str, tuple[str, ...]]]:
    """docs/architecture.md's rooms of convert/, top to bottom: (room, module names)."""
    text = PAGE.read_text(encoding="utf-8")
    table = text.split("| Room of convert/ | Modules | Job |")[1].split("\n\n")[0]
    rooms = []
    for line in table.strip().splitlines()[1:]:
        room, modules, _job = (c.strip() for c in line.strip().strip("|").split("|", 2))
        rooms.append((room, tuple(re.findall(r"`([\w/]+)`", modules))))
    return rooms


def _convert_room(module: str, rooms: list[tuple[str, tuple[str, ...]]]) -> int:
    rel = module.removeprefix("eliza_backends.convert").lstrip(".") or "__init__"
    for row, (_room, names) in enumerate(rooms):
        for name in names:
            if (name.endswith("/") and (rel + ".").startswith(name[:-1] + ".")) or rel == name:
                return row
    raise AssertionError(f"{module} is in no room of convert/ in docs/architecture.md")


def test_convert_rooms_point_down_with_no_circle_type_only_imports_included() -> None:
    """Inside convert/, every import (in functions and under TYPE_CHECKING too) stays in its
    room or goes down, and no two files import each other in a circle."""
    rooms = _convert_rooms()
    edges = {m: {t for t in targets if t.startswith("eliza_backends.convert")}
             for m, targets in import_graph.graph(ROOT / "src", "eliza_backends", lazy=True,
                                                  type_only=True).items()
             if m.startswith("eliza_backends.convert")}
    assert import_graph.cycles(edges) == []
    for module, targets in edges.items():
        for target in targets:
            assert _convert_room(target, rooms) >= _convert_room(module, rooms), \
                f"{module} -> {target} points up the rooms of convert/"


def _family_names() -> set[str]:
    from eliza_backends.convert.families import FAMILIES

    return {name for f in FAMILIES for name in (f.architecture, *f.model_types,
                                                *f.refused_model_types, *f.draft_model_types)}


def test_no_family_name_branch_outside_the_convert_families() -> None:
    """A comparison of an architecture / model type with a family's name (``architecture ==
    "gemma4"``, ``model_type in (...)``) is the family's business: only convert/families/
    has one, in the core and in the plugins (a runtime fact about some architectures is a named
    table beside the code using it: ``MTP_ARCHITECTURES``, ``BFLOAT16_EMBEDDING_SCALE``)."""
    names = _family_names()
    found = []
    for path in sorted(p for src in PACKAGES.values() for p in src.rglob("*.py")):
        if "families" in path.relative_to(ROOT).parts:
            continue
        source = path.read_text(encoding="utf-8")
        for node in ast.walk(ast.parse(source)):
            if not isinstance(node, ast.Compare):
                continue
            text = ast.get_source_segment(source, node) or ""
            constants = {c.value for c in ast.walk(node)
                         if isinstance(c, ast.Constant) and isinstance(c.value, str)}
            if constants & names and re.search(r"arch|model_type", text):
                found.append(f"{path.relative_to(ROOT)}:{node.lineno}: {text}")
    assert found == []
