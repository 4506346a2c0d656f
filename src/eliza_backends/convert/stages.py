"""Conversion stages: cached by the content hash of everything they depend on, timed, logged.

A stage's key is the sha256 of its name, its parameters and its inputs' keys (a source file's
sha256, an earlier stage's key, tool versions, the converter's own code). Its outputs live in
``<work>/<name>-<key[:16]>/``; a ``.done`` file written last marks them complete, so a rerun
(or a run after a crash) skips every stage that finished and resumes at the first that did not.
"""

from __future__ import annotations

import hashlib
import json
import shutil
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TextIO

_DONE = ".done"


def content_key(*parts: Any) -> str:
    """sha256 hex of the JSON rendering of ``parts`` (sorted keys, str for the rest)."""
    blob = json.dumps(parts, sort_keys=True, default=str).encode()
    return hashlib.sha256(blob).hexdigest()


@dataclass
class StageRecord:
    """What one stage did: its key, whether it came from the cache, and how long it took."""

    name: str
    key: str
    cached: bool
    seconds: float
    directory: Path


@dataclass
class StageRunner:
    """Runs stages under ``work_dir`` and prints one progress line per stage to ``log``."""

    work_dir: Path
    log: TextIO | None = sys.stderr
    records: list[StageRecord] = field(default_factory=list)
    started: float = field(default_factory=time.monotonic)

    def say(self, message: str) -> None:
        """One progress line, prefixed with the elapsed time of the whole conversion."""
        if self.log is not None:
            elapsed = time.monotonic() - self.started
            print(f"[{elapsed:7.1f}s] {message}", file=self.log, flush=True)

    def run(self, name: str, key_parts: tuple[Any, ...],
            build: Callable[[Path], None]) -> StageRecord:
        """Run ``build(out_dir)`` unless the stage with this key already finished."""
        key = content_key(name, *key_parts)
        out = self.work_dir / f"{name}-{key[:16]}"
        if (out / _DONE).is_file():
            rec = StageRecord(name, key, True, 0.0, out)
            self.say(f"{name}: cached ({out.name})")
        else:
            if out.exists():
                shutil.rmtree(out)
            out.mkdir(parents=True)
            self.say(f"{name}: started")
            t0 = time.monotonic()
            try:
                build(out)
            except BaseException:
                self.say(f"{name}: failed after {time.monotonic() - t0:.1f}s")
                raise
            seconds = time.monotonic() - t0
            (out / _DONE).write_text(json.dumps({"key": key, "seconds": seconds}) + "\n")
            rec = StageRecord(name, key, False, seconds, out)
            self.say(f"{name}: done in {seconds:.1f}s")
        self.records.append(rec)
        return rec

    def rekey(self, rec: StageRecord, key_parts: tuple[Any, ...]) -> StageRecord:
        """File the finished stage ``rec`` under the key of ``key_parts`` (for a stage whose
        key is known fully only once it ran); returns its record there."""
        key = content_key(rec.name, *key_parts)
        out = self.work_dir / f"{rec.name}-{key[:16]}"
        if out != rec.directory:
            if out.exists():
                shutil.rmtree(out)
            rec.directory.rename(out)
            (out / _DONE).write_text(json.dumps({"key": key, "seconds": rec.seconds}) + "\n")
        new = StageRecord(rec.name, key, rec.cached, rec.seconds, out)
        self.records[self.records.index(rec)] = new
        return new

    def summary(self) -> list[dict[str, Any]]:
        """The records as JSON-ready dicts (for the conversion report)."""
        return [{"stage": r.name, "key": r.key, "cached": r.cached,
                 "seconds": round(r.seconds, 2)} for r in self.records]


def stage_seconds(directory: Path) -> float | None:
    """How long the stage that made ``directory`` took when it ran (None if unknown)."""
    try:
        data = json.loads((directory / _DONE).read_text())
        return float(data["seconds"])
    except (OSError, ValueError, KeyError, TypeError):
        return None


__all__ = ["StageRecord", "StageRunner", "content_key", "stage_seconds"]
