"""``eliza-backends serve`` in a child process, for tests that talk to it over loopback.

:class:`ServerProcess` starts the real command (``python -m eliza_backends serve ... --port 0``),
reads the announced URL from its stdout, and stops it with SIGINT (the graceful path), so
every test exercises the same startup and shutdown a user gets.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import threading
import time
import urllib.request
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent


class ServerProcess:
    """A running server; ``url`` is its API base (``http://127.0.0.1:PORT/v1``)."""

    def __init__(self, bundle: str | os.PathLike[str], *args: str, timeout: float = 120.0,
                 env: dict[str, str] | None = None) -> None:
        cmd = [sys.executable, "-m", "eliza_backends", "serve", str(bundle), "--port", "0",
               "--log-format", "json", *args]
        child_env = {k: v for k, v in os.environ.items() if k != "ELIZA_LLM_BACKEND"}
        child_env.update(env or {})
        self.proc = subprocess.Popen(cmd, cwd=ROOT, stdout=subprocess.PIPE,
                                     stderr=subprocess.PIPE, text=True, env=child_env)
        self.stdout: list[str] = []
        self.stderr: list[str] = []
        self._stderr_reader = threading.Thread(target=self._drain, daemon=True)
        self._stderr_reader.start()
        self.url = self._wait_for_url(timeout)
        self.root = self.url.removesuffix("/v1")

    def _drain(self) -> None:
        assert self.proc.stderr is not None
        for line in self.proc.stderr:
            self.stderr.append(line)

    def _wait_for_url(self, timeout: float) -> str:
        assert self.proc.stdout is not None
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            line = self.proc.stdout.readline()
            if not line:
                break
            self.stdout.append(line)
            if line.startswith("eliza-backends serve: http://"):
                threading.Thread(target=self._drain_stdout, daemon=True).start()
                return line.split()[2]
        self.proc.kill()
        self.proc.wait(10)
        raise RuntimeError("the server did not start:\n" + "".join(self.stdout)
                           + "".join(self.stderr))

    def _drain_stdout(self) -> None:
        assert self.proc.stdout is not None
        for line in self.proc.stdout:
            self.stdout.append(line)

    @property
    def announcement(self) -> str:
        """The startup line."""
        return next(line for line in self.stdout if line.startswith("eliza-backends serve:"))

    def get(self, path: str) -> tuple[int, Any]:
        """GET ``path`` (from the server root); (status, decoded JSON)."""
        try:
            with urllib.request.urlopen(self.root + path, timeout=30) as resp:
                return resp.status, json.loads(resp.read())
        except urllib.error.HTTPError as exc:
            return exc.code, json.loads(exc.read())

    def health(self) -> dict[str, Any]:
        """``GET /health``."""
        return self.get("/health")[1]  # type: ignore[no-any-return]

    def wait_idle(self, timeout: float = 10.0) -> dict[str, Any]:
        """Poll /health until no session is busy; returns the last health."""
        deadline = time.monotonic() + timeout
        while True:
            health = self.health()
            if health["busy"] == 0 or time.monotonic() > deadline:
                return health
            time.sleep(0.02)

    def access_records(self) -> list[dict[str, Any]]:
        """The JSON access-log records written so far."""
        out = []
        for line in list(self.stderr):
            try:
                record = json.loads(line)
            except ValueError:
                continue
            if record.get("logger") == "eliza_backends.server.access":
                out.append(record)
        return out

    def rss_bytes(self) -> int:
        """The server's resident memory."""
        import psutil

        return int(psutil.Process(self.proc.pid).memory_info().rss)

    def stop(self, timeout: float = 60.0) -> int:
        """SIGINT, then wait; returns the exit status (kills it past ``timeout``)."""
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGINT)
            try:
                self.proc.wait(timeout)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(10)
        self._stderr_reader.join(5)
        return self.proc.returncode

    def __enter__(self) -> ServerProcess:
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()


def backend_params() -> list[Any]:
    """pytest params of the default session of every first-party backend (skipped where its
    runtime is not installed), by backend name."""
    import importlib.util

    import pytest

    out = []
    for backend, module in [("llama.cpp", "llama_cpp"), ("litert-lm", "ai_edge_litert"),
                            ("mlx", "mlx_lm")]:
        marks = [] if importlib.util.find_spec(module) else [
            pytest.mark.skip(reason=f"{module} is not installed")]
        out.append(pytest.param(backend, marks=marks, id=backend))
    return out
