"""Conversion stages: cached by the content hash of everything they depend on, timed, logged.

A stage's key is the sha256 of its name, its parameters and its inputs' keys (a source file's
sha256, an earlier stage's key, tool versions, the converter's own code). Its outputs live in
``<work>/<name>-<key[:16]>/``; a ``.done`` file written last marks them complete, so a rerun
(or a run after a crash) skips every stage that finished and resumes at the first that did not.

The cache is bounded, least recently used first, like ccache: a stage found in the cache has its
``.done`` touched, and after a conversion :func:`evict` removes finished stages this run did not
use, oldest first, until the finished stages fit in ``$ELIZA_CONVERT_CACHE_GB`` (default
:data:`DEFAULT_LIMIT_GB`; ``0`` keeps only the last run's stages, and those another
conversion used in the last :data:`RECENT_S` seconds). A bundle made earlier keeps
its files: a bundle's files are hard links (or copies) of the stage outputs.

The tools a stage runs in this process (transformers, coremltools, gguf, torch) print progress
bars and warnings to stdout/stderr; while a stage builds, file descriptors 1 and 2 go to the
stage's ``tools.log`` instead, so the terminal shows the stage lines only (``-v``:
``tool_output=True`` lets the tools print). A stage that fails shows the log's last lines.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import shutil
import sys
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TextIO

from ..errors import InvalidArgumentError

_DONE = ".done"
#: the environment variable that bounds the stage cache, in GiB (a float)
LIMIT_ENV = "ELIZA_CONVERT_CACHE_GB"
#: the bound when it is unset: one float32 set of a 1B model's stages in every format, twice
DEFAULT_LIMIT_GB = 16.0
#: seconds a stage stays after its last use whatever the bound: another conversion running
#: beside this one may have just made it (or found it) and not yet linked it into its bundle
RECENT_S = 600.0


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
    """Runs stages under ``work_dir`` and prints one progress line per stage to ``log``.
    ``tool_output``: let the tools a stage runs print to the terminal (else: ``tools.log``)."""

    work_dir: Path
    log: TextIO | None = sys.stderr
    records: list[StageRecord] = field(default_factory=list)
    started: float = field(default_factory=time.monotonic)
    tool_output: bool = False
    _terminal: TextIO | None = None  # the real fd 2 while a stage's tools are captured

    def say(self, message: str) -> None:
        """One progress line, prefixed with the elapsed time of the whole conversion (on the
        terminal, also from inside a stage whose tools are captured)."""
        log = self.log
        if log is not None and self._terminal is not None and _is_fd(log, 2):
            log = self._terminal
        if log is not None:
            elapsed = time.monotonic() - self.started
            print(f"[{elapsed:7.1f}s] {message}", file=log, flush=True)

    @contextlib.contextmanager
    def _tools_to(self, path: Path) -> Iterator[None]:
        """fd 1 and fd 2 into ``path`` while the block runs (unless ``tool_output``)."""
        if self.tool_output or self._terminal is not None:
            yield
            return
        for stream in (sys.stdout, sys.stderr):
            with contextlib.suppress(ValueError, OSError):
                stream.flush()
        saved = (os.dup(1), os.dup(2))
        try:
            with open(path, "ab") as sink:
                os.dup2(sink.fileno(), 1)
                os.dup2(sink.fileno(), 2)
            self._terminal = open(saved[1], "w", closefd=False, encoding="utf-8",  # noqa: SIM115
                                  errors="replace")
            # Python-level writers too (sys.stdout may not be fd 1: an embedding app, pytest)
            with open(path, "a", encoding="utf-8", errors="replace", buffering=1) as text, \
                    contextlib.redirect_stdout(text), contextlib.redirect_stderr(text):
                yield
        finally:
            for stream in (sys.stdout, sys.stderr):
                with contextlib.suppress(ValueError, OSError):
                    stream.flush()
            os.dup2(saved[0], 1)
            os.dup2(saved[1], 2)
            os.close(saved[0])
            os.close(saved[1])
            self._terminal = None

    def run(self, name: str, key_parts: tuple[Any, ...],
            build: Callable[[Path], None]) -> StageRecord:
        """Run ``build(out_dir)`` unless the stage with this key already finished."""
        key = content_key(name, *key_parts)
        out = self.work_dir / f"{name}-{key[:16]}"
        if (out / _DONE).is_file():
            with contextlib.suppress(OSError):
                (out / _DONE).touch()  # last used: what eviction orders by
            rec = StageRecord(name, key, True, 0.0, out)
            self.say(f"{name}: cached ({out.name})")
        else:
            if out.exists():
                shutil.rmtree(out)
            out.mkdir(parents=True)
            self.say(f"{name}: started")
            t0 = time.monotonic()
            tools_log = out / "tools.log"
            try:
                with self._tools_to(tools_log):
                    build(out)
            except BaseException:
                self.say(f"{name}: failed after {time.monotonic() - t0:.1f}s")
                self._show_tail(tools_log)
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

    def _show_tail(self, path: Path, lines: int = 15) -> None:
        """The last lines the tools printed (after a failure), and where the rest is."""
        try:
            tail = path.read_text(encoding="utf-8", errors="replace").splitlines()[-lines:]
        except OSError:
            return
        if tail and self.log is not None:
            print("\n".join(["  " + line[-300:] for line in tail]
                            + [f"  (the tools' whole output: {path})"]),
                  file=self.log, flush=True)

    def evict_unused(self, limit_bytes: int) -> None:
        """Bound the stage cache to ``limit_bytes`` (:func:`evict`), keeping this run's
        stages, and say what went."""
        gone = evict(self.work_dir, {r.directory for r in self.records}, limit_bytes)
        if gone:
            self.say(f"stage cache: removed {len(gone)} least recently used stages "
                     f"({sum(size for _, size in gone) / 2**30:.1f} GiB) to stay under "
                     f"{limit_bytes / 2**30:g} GiB (${LIMIT_ENV})")

    def summary(self) -> list[dict[str, Any]]:
        """The records as JSON-ready dicts (for the conversion report)."""
        return [{"stage": r.name, "key": r.key, "cached": r.cached,
                 "seconds": round(r.seconds, 2)} for r in self.records]


def cache_limit_bytes() -> int:
    """The stage cache's bound in bytes, from ``$ELIZA_CONVERT_CACHE_GB`` (GiB, >= 0)."""
    text = os.environ.get(LIMIT_ENV, "").strip()
    try:
        gib = float(text) if text else DEFAULT_LIMIT_GB
    except ValueError:
        raise InvalidArgumentError(
            f"{LIMIT_ENV}={text!r} is not a number of GiB (e.g. {DEFAULT_LIMIT_GB:g}; "
            "0 keeps the last run's stages only)") from None
    if gib < 0 or gib != gib:
        raise InvalidArgumentError(f"{LIMIT_ENV}={text!r}: the bound must be 0 or more GiB")
    return int(gib * 2**30)


def evict(work_dir: Path, keep: set[Path], limit_bytes: int) -> list[tuple[Path, int]]:
    """Remove finished stages under ``work_dir`` other than ``keep``, least recently used
    first (the mtime of ``.done``), until the finished stages take at most ``limit_bytes``;
    returns what went, with its size in bytes. A stage still building (no ``.done``), one used
    in the last :data:`RECENT_S` seconds and any other file are left alone; a stage another
    process removed first is skipped."""
    recent = time.time() - RECENT_S
    stages: list[tuple[float, Path, int]] = []
    for entry in work_dir.iterdir() if work_dir.is_dir() else ():
        try:
            used = (entry / _DONE).stat().st_mtime
        except OSError:
            continue
        try:
            size = output_bytes(entry)
        except OSError:  # removed meanwhile by another process's eviction
            continue
        stages.append((used, entry, size))
    total = sum(size for _, _, size in stages)
    gone: list[tuple[Path, int]] = []
    for _, entry, size in sorted(stages, key=lambda stage: stage[0]):
        if total <= limit_bytes:
            break
        if entry in keep or used > recent:
            continue
        shutil.rmtree(entry, ignore_errors=True)
        total -= size
        gone.append((entry, size))
    return gone


def _is_fd(stream: TextIO, fd: int) -> bool:
    try:
        return stream.fileno() == fd
    except (AttributeError, ValueError, OSError):
        return False


def stage_seconds(directory: Path) -> float | None:
    """How long the stage that made ``directory`` took when it ran (None if unknown)."""
    try:
        data = json.loads((directory / _DONE).read_text())
        return float(data["seconds"])
    except (OSError, ValueError, KeyError, TypeError):
        return None


def recorded_seconds(stage: StageRecord) -> float:
    """The seconds a stage took: this run's, or, for a cached stage, those of the run that
    made it (0.0 if unknown)."""
    return float(stage.seconds if not stage.cached else (stage_seconds(stage.directory) or 0.0))


def output_bytes(path: Path) -> int:
    """The size in bytes of an output: a file, or every file under a folder."""
    if path.is_dir():
        return sum(p.stat().st_size for p in path.rglob("*") if p.is_file())
    return path.stat().st_size


__all__ = ["DEFAULT_LIMIT_GB", "LIMIT_ENV", "RECENT_S", "StageRecord", "StageRunner",
           "cache_limit_bytes", "content_key", "evict", "output_bytes", "recorded_seconds",
           "stage_seconds"]
