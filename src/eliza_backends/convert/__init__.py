"""Model conversion: ``eliza-backends bundle convert SRC OUT`` (see :mod:`.pipeline`).

Importing this package is cheap; the tool-time dependencies (``pip install
'eliza-backends[convert]'``) are imported inside the stages that use them.
"""

from __future__ import annotations

from .pipeline import ConvertPlan, convert, default_cache_dir, host_formats, parse_plan
from .toolchain import MissingToolError

__all__ = ["ConvertPlan", "MissingToolError", "convert", "default_cache_dir", "host_formats",
           "parse_plan"]
