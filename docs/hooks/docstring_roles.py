"""MkDocs hook: render the reST roles the docstrings use (:class:`X`, :meth:`~a.b.C`) as code.

The core's docstrings are written for both ``help()`` and the site; mkdocstrings renders them
as Markdown, which leaves ``:class:`` in front of the code span. This strips the role and, as
Sphinx does for ``~``, keeps only the last dotted component.
"""

from __future__ import annotations

import re
from typing import Any

_ROLE = re.compile(r":(?:class|meth|func|data|mod|attr|exc|obj|const):<code>(~?)([^<]+)</code>")


def _replace(match: re.Match[str]) -> str:
    tilde, target = match.groups()
    return f"<code>{target.rsplit('.', 1)[-1] if tilde else target}</code>"


def on_page_content(html: str, **kwargs: Any) -> str:
    """Rewrite the roles in every page's HTML."""
    return _ROLE.sub(_replace, html)
