"""MkDocs hook: drop the test suite's ``title="not run: ..."`` marker from code fences.

``tests/test_docs.py`` runs every ``python`` block of a page unless its info string says
``title="not run: why"``; the reason is for the suite and the page's editors, not for
readers, so the rendered page shows a plain code block.
"""

from __future__ import annotations

import re
from typing import Any

_MARKER = re.compile(r'^(\s*```+\s*python)\s+title="not run[^"]*"', re.M)


def on_page_markdown(markdown: str, **_: Any) -> str:
    """Strip the marker, keep the fence and its language."""
    return _MARKER.sub(r"\1", markdown)
