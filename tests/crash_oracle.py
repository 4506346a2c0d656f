"""The crash oracle shared by the fuzzers: a native runtime in a child process, one case a line.

A worker is a Python child that defines ``exercise(case_dir, params)`` and runs
:data:`LOOP`: for each case it prints a verdict, ``ok`` (it worked), ``error`` (an
:class:`~eliza_backends.ElizaError`) or ``untyped`` (any other exception). The parent adds the
outcomes only it can see: ``crash`` (the child died: abort, fault), ``hang`` (no verdict in
time), and a worker may report ``poisoned`` (still alive, but broken for good input afterwards).
Anything but ``ok`` and ``error`` is a finding.
"""

from __future__ import annotations

import json
import os
import select
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

#: Appended to each worker's own code (which defines ``exercise`` and may define ``after``,
#: called with the verdict so far, e.g. to check the process is still sound).
LOOP = r"""
import json as _json, sys as _sys, traceback as _tb
from eliza_backends import ElizaError as _ElizaError
print("ready", flush=True)
for _line in _sys.stdin:
    _case = _json.loads(_line)
    try:
        _verdict = {"outcome": "ok", "detail": exercise(_case["dir"], _case["params"])}
    except _ElizaError as _exc:
        _verdict = {"outcome": "error", "detail": f"{type(_exc).__name__}: {_exc}"[:400]}
    except Exception:
        _verdict = {"outcome": "untyped", "detail": _tb.format_exc()[-800:]}
    if "after" in globals():
        _verdict = after(_verdict)
    print(_json.dumps(_verdict, default=str), flush=True)
"""


@dataclass
class Finding:
    label: Any  # the recipe, or whatever the caller named the case
    outcome: str  # crash | hang | untyped | poisoned
    detail: str


@dataclass
class Report:
    cases: int = 0
    seconds: float = 0.0
    outcomes: dict[str, int] = field(default_factory=dict)
    findings: list[Finding] = field(default_factory=list)
    verdicts: list[tuple[Any, str, str]] = field(default_factory=list)

    def describe_findings(self) -> str:
        def name(label: Any) -> str:
            return label if isinstance(label, str) else json.dumps(label)

        return "\n".join(f"{f.outcome}: {name(f.label)}\n    {f.detail[-500:]}"
                         for f in self.findings)


class Worker:
    """One child process running ``code`` + :data:`LOOP` with ``argv``."""

    def __init__(self, code: str, argv: list[str], *, python: str | None = None,
                 env: dict[str, str] | None = None) -> None:
        python = python or sys.executable
        cmd = [python, "-c", code + LOOP, *argv]
        if os.path.exists("/usr/bin/nice"):
            cmd = ["nice", "-n", "10", *cmd]
        self.proc = subprocess.Popen(cmd, stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                     stderr=subprocess.DEVNULL, text=True,
                                     env={**os.environ, **(env or {})})
        assert self.proc.stdout is not None
        if self.proc.stdout.readline().strip() != "ready":
            raise RuntimeError(f"the fuzz worker did not start ({python})")
        self.parked = 0

    def run(self, case_dir: Path, params: dict[str, Any], timeout: float) -> dict[str, Any]:
        assert self.proc.stdin is not None and self.proc.stdout is not None
        try:
            self.proc.stdin.write(json.dumps({"dir": str(case_dir), "params": params}) + "\n")
            self.proc.stdin.flush()
        except BrokenPipeError:
            return {"outcome": "crash", "detail": f"worker exited {self.proc.poll()}"}
        ready, _, _ = select.select([self.proc.stdout], [], [], timeout)
        if not ready:
            self.close()
            return {"outcome": "hang", "detail": f"no verdict within {timeout:.0f} s"}
        line = self.proc.stdout.readline()
        if not line:
            return {"outcome": "crash", "detail": f"worker died with status {self.proc.wait()}"}
        verdict: dict[str, Any] = json.loads(line)
        self.parked = int(verdict.get("parked", 0))
        return verdict

    def close(self) -> None:
        if self.proc.poll() is None:
            self.proc.kill()
        self.proc.wait()


def run_cases(cases: Iterable[tuple[Any, Callable[[Path], dict[str, Any]]]],
              new_worker: Callable[[Path], Worker], *, timeout: float = 30.0,
              recycle_after_parked: int = 200, log: Callable[[str], None] | None = None
              ) -> Report:
    """Run each ``(label, write)`` case: ``write(case_dir)`` puts the case's files in
    ``case_dir`` and returns the params for the worker. ``new_worker(scratch)`` starts a worker
    (again after a crash or a hang, and after it parked ``recycle_after_parked`` threads)."""
    report = Report()
    scratch = Path("/dev/shm") if Path("/dev/shm").is_dir() else None
    t0 = time.perf_counter()
    with tempfile.TemporaryDirectory(prefix="fuzz-", dir=scratch) as tmp:
        root = Path(tmp)
        case_dir = root / "case"
        worker: Worker | None = None
        for label, write in cases:
            case_dir.mkdir(exist_ok=True)
            params = write(case_dir)
            if worker is None or worker.parked >= recycle_after_parked:
                if worker is not None:
                    worker.close()
                worker = new_worker(root)
            verdict = worker.run(case_dir, params, timeout)
            outcome = verdict["outcome"]
            detail = str(verdict.get("detail"))
            report.cases += 1
            report.outcomes[outcome] = report.outcomes.get(outcome, 0) + 1
            report.verdicts.append((label, outcome, detail))
            if outcome not in ("ok", "error"):
                report.findings.append(Finding(label, outcome, detail))
                if outcome in ("crash", "hang"):
                    worker.close()
                    worker = None
            if log is not None and report.cases % 500 == 0:
                log(f"{report.cases} cases, {report.outcomes}, {time.perf_counter() - t0:.0f} s")
        if worker is not None:
            worker.close()
    report.seconds = time.perf_counter() - t0
    return report
