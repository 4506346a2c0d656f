"""docs/architecture.md's picture of the parts is checked against the real imports (issue 27).

Every import in ``src/eliza_backends`` (at module level and inside functions; not those under
``if TYPE_CHECKING:``) is an arrow from the part of the importing module to the part of the
imported one. The page's table must list exactly those arrows, every module must belong to a
part of the table, and in the picture every arrow must point down (to a later line).
"""

from __future__ import annotations

import ast
import re

import import_graph
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
    has one."""
    names = _family_names()
    found = []
    for path in sorted((ROOT / "src" / "eliza_backends").rglob("*.py")):
        if "families" in path.relative_to(ROOT / "src").parts:
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
