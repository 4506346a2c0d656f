"""MkDocs hook: generate a backend's options table from its options model (a FrozenModel or a
pydantic model: both list ``model_fields``).

A page writes ``<!-- options-table: eliza_litert:LiteRTOptions -->`` and gets a table of the
model's fields (name, accepted values, default, description), so the backend pages cannot fall
behind the code. Plugin modules are light by contract (no runtime import), so importing them
here is cheap.
"""

from __future__ import annotations

import importlib
import re
import sys
import typing
from pathlib import Path
from typing import Any

# the worked example plugin is documented from its source, installed or not (added at call
# time: mkdocs restores sys.path after loading a hook module)
_EXAMPLE = Path(__file__).resolve().parent.parent / "examples" / "eliza_echo" / "src"

_MARK = re.compile(r"^<!-- options-table: ([\w.]+):(\w+) -->$", re.M)  # on its own line


def _values(annotation: Any) -> str:
    args = typing.get_args(annotation)
    if typing.get_origin(annotation) is typing.Literal:
        return " or ".join(f"`{a}`" for a in args)
    if args:  # Optional[...] and other unions
        return " or ".join(_values(a) for a in args)
    if annotation is type(None):
        return "`null`"
    return f"`{getattr(annotation, '__name__', str(annotation))}`"


def options_table(module: str, name: str) -> str:
    """The Markdown table of one options model."""
    if str(_EXAMPLE) not in sys.path:
        sys.path.append(str(_EXAMPLE))
    model = getattr(importlib.import_module(module), name)
    rows = ["| Option | Values | Default | Meaning |", "|---|---|---|---|"]
    for field, info in model.model_fields.items():
        default = "(required)" if info.is_required() else f"`{info.default!r}`"
        text = (info.description or "").replace("|", "\\|").replace("\n", " ")
        rows.append(f"| `{field}` | {_values(info.annotation)} | {default} | {text} |")
    return "\n".join(rows)


def on_page_markdown(markdown: str, **kwargs: Any) -> str:
    """Replace every marker with its table."""
    return _MARK.sub(lambda m: options_table(m.group(1), m.group(2)), markdown)
