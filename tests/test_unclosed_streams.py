"""A stream nobody closed frees its model when it is collected, and says so (issue 15.10).

Each backend, in a process of its own (so the resident-memory numbers are its own): 30 streams
opened, used and dropped without ``close()`` must grow the process about as much as 30 closed
ones, warn ``ResourceWarning`` once each (as an unclosed file does) and leave their sessions
closed. Before the fix nothing freed the runtime's native memory: +110 MiB for 30 tiny
streams here, +3.1 GiB for 30 SmolLM2-135M ones.
"""

from __future__ import annotations

import importlib.util
import json
import subprocess
import sys

import pytest
from conftest import TINY_BUNDLE

STREAMS = 30
SCRIPT = """
import gc, json, os, sys, warnings
from eliza_backends import open_stream

bundle, backend, options, mode, n = sys.argv[1:6]
options, n = json.loads(options), int(n)
page = os.sysconf("SC_PAGE_SIZE")

def rss_mib():
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * page / 2**20

def one():
    return open_stream(bundle, backend=backend, options=options, threads=1,
                       context_size=8192, max_tokens=4)

warned = []
warnings.simplefilter("always", ResourceWarning)
warnings.showwarning = lambda message, category, *a, **k: warned.append(
    (category.__name__, str(message)))
one().close()  # the runtime's one-time allocations
gc.collect()
before = rss_mib()
sessions = []
for _ in range(n):
    stream = one()
    stream.prefill(stream.session.tokenize("hello world"))
    stream.next(2)
    sessions.append(stream.session)
    if mode == "closed":
        stream.close()
    del stream
gc.collect()
streams = [m for c, m in warned if c == "ResourceWarning" and m.startswith("unclosed <Stream")]
print("RESULT " + json.dumps({"grown_mib": rss_mib() - before, "warned": len(streams),
      "other_warnings": [m for c, m in warned if not m.startswith("unclosed <Stream")],
      "closed_sessions": sum(s.closed for s in sessions)}))
"""

BACKENDS = [
    pytest.param("llama.cpp", {}, "llama_cpp", id="llama.cpp"),
    pytest.param("litert-lm", {"litert-lm": {"session": "interpreter"}}, "ai_edge_litert",
                 id="litert-interpreter"),
    pytest.param("litert-lm", {"litert-lm": {"session": "engine"}}, "litert_lm",
                 id="litert-engine"),
    pytest.param("mlx", {}, "mlx_lm", id="mlx"),
]


def _run(backend: str, options: dict[str, object], mode: str) -> dict[str, object]:
    proc = subprocess.run(
        [sys.executable, "-c", SCRIPT, str(TINY_BUNDLE), backend, json.dumps(options), mode,
         str(STREAMS)], capture_output=True, text=True, timeout=600)
    lines = [ln for ln in proc.stdout.splitlines() if ln.startswith("RESULT ")]
    assert proc.returncode == 0 and lines, proc.stderr[-3000:]
    result: dict[str, object] = json.loads(lines[-1][len("RESULT "):])
    return result


@pytest.mark.parametrize(("backend", "options", "module"), BACKENDS)
def test_dropped_streams_free_their_model_with_a_resource_warning(
        backend: str, options: dict[str, object], module: str) -> None:
    if importlib.util.find_spec(module) is None:
        pytest.skip(f"{module} is not installed")
    closed = _run(backend, options, "closed")
    dropped = _run(backend, options, "dropped")
    print(f"{backend} {options}: 30 closed +{closed['grown_mib']:.1f} MiB, 30 dropped "
          f"+{dropped['grown_mib']:.1f} MiB")
    assert closed["warned"] == 0 and closed["other_warnings"] == [], closed
    assert dropped["warned"] == STREAMS, dropped  # one ResourceWarning per dropped stream
    assert dropped["other_warnings"] == [], dropped
    assert dropped["closed_sessions"] == STREAMS, dropped
    grown, baseline = dropped["grown_mib"], closed["grown_mib"]
    assert isinstance(grown, float) and isinstance(baseline, float)
    assert grown < baseline + 48, (grown, baseline)  # (each tiny stream held ~7 MiB of KV)
