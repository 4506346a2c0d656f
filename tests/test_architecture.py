"""docs/architecture.md's picture of the parts is checked against the real imports (issue 27).

Every import in ``src/eliza_backends`` (at module level and inside functions; not those under
``if TYPE_CHECKING:``) is an arrow from the part of the importing module to the part of the
imported one. The page's table must list exactly those arrows, every module must belong to a
part of the table, and in the picture every arrow must point down (to a later line).
"""

from __future__ import annotations

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

