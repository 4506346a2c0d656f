"""The one harness every benchmark script uses: contenders interleaved with rotation, fresh-process
workers, medians with min-max, and a plain table or JSON.

* :func:`interleave`: every repetition runs each contender once; the order rotates by one per
  repetition (A B C, B C A, C A B ...) so that drift on a shared machine, and whatever the
  previous run leaves in caches, hits every contender alike;
* :func:`spawn`: one measurement in a fresh Python process (its own load time and peak RSS):
  ``python SCRIPT --worker ...`` printing one JSON object as its last line;
* :func:`summarize` / :func:`cell` / :func:`format_table` (from :mod:`eliza_backends.bench`,
  which ``eliza-backends bench`` uses too) and :func:`emit` for the output.

Benchmark scripts import it as ``from harness import ...`` (they run from ``benchmarks/``).
"""

from __future__ import annotations

import json
import sys
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any, TypeVar

from eliza_backends.bench import cell, format_table, spawn_worker, summarize

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
TINY = ROOT / "examples" / "bundles" / "tiny"
T = TypeVar("T")


def rotated(names: Sequence[str], rep: int) -> list[str]:
    """``names`` rotated left by ``rep`` (the order of repetition ``rep``)."""
    k = rep % len(names) if names else 0
    return [*names[k:], *names[:k]]


def interleave(names: Sequence[str], repeat: int, run: Callable[[str], T], *,
               warmup: bool = False, pause: float = 0.0, progress: bool = True
               ) -> dict[str, list[T]]:
    """``run(name)`` for every contender, ``repeat`` rounds, the order rotated each round;
    returns each contender's results in round order. ``warmup``: one unmeasured run each
    first; ``pause``: seconds to sleep before each run (lets worker threads go idle)."""
    if warmup:
        for name in names:
            run(name)
    results: dict[str, list[T]] = {name: [] for name in names}
    for rep in range(repeat):
        for name in rotated(names, rep):
            if pause:
                time.sleep(pause)
            results[name].append(run(name))
        if progress:
            print(".", end="", file=sys.stderr, flush=True)
    if progress:
        print(file=sys.stderr)
    return results


def spawn(script: str | Path, *args: str, timeout: float = 1800, python: str | None = None,
          cwd: str | None = None) -> dict[str, Any]:
    """Run ``script --worker *args`` in a fresh process (``python``: another interpreter, e.g.
    another checkout's venv); the JSON object it printed last."""
    return spawn_worker([str(script), "--worker", *args], timeout=timeout, python=python,
                        cwd=cwd)


def run_script(name: str, *args: str, timeout: int = 1800) -> dict[str, Any]:
    """Run ``benchmarks/<name> *args --json``; its parsed output, or ``{"error": ...}``."""
    import subprocess

    cmd = [sys.executable, str(HERE / name), *args, "--json"]
    print(f"$ {' '.join(cmd[1:])}", file=sys.stderr, flush=True)
    t0 = time.perf_counter()
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout)
    if proc.returncode != 0:  # the Python error, not LiteRT's native log lines after it
        lines = [ln for ln in proc.stderr.strip().splitlines() if not ln.startswith("INFO: [")]
        return {"error": f"exit {proc.returncode}: {' | '.join(lines[-3:])}"}
    out: dict[str, Any] = json.loads(proc.stdout[proc.stdout.index("{"):])
    out["_wall_s"] = time.perf_counter() - t0
    return out


def emit(report: dict[str, Any], as_json: bool, render: Callable[[dict[str, Any]], str]) -> None:
    """Print ``report`` as JSON, or as the text ``render`` makes of it."""
    print(json.dumps(report, indent=2) if as_json else render(report))


__all__ = ["HERE", "ROOT", "TINY", "cell", "emit", "format_table", "interleave", "rotated",
           "run_script", "spawn", "summarize"]
