"""``eliza-backends serve``'s start-up (issue 42): the model's load starts before the web stack
is imported, the request models of the other APIs are built on their first request, and what
the overlap must not change still holds: no socket before the model is loaded and warmed up, a
load failure exits with its typed error, a missing extra is said before any load.

Timings belong to ``benchmarks/bench_serve_start.py``; these tests pin the causes.
"""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

from conftest import TINY_BUNDLE
from server_process import ServerProcess

WEB_STACK = ("starlette", "uvicorn", "pydantic", "eliza_backends.server.app",
             "eliza_backends.server.listen", "eliza_backends.openai.types")
OTHER_APIS = ("eliza_backends.openai.anthropic_types", "eliza_backends.openai.anthropic_messages",
              "eliza_backends.openai.anthropic_events", "eliza_backends.openai.responses",
              "eliza_backends.openai.responses_types", "eliza_backends.openai.responses_events",
              "eliza_backends.openai.embeddings", "eliza_backends.server.embedding_service")


def _loaded_after(code: str, names: tuple[str, ...]) -> list[str]:
    probe = f"{code}\nimport sys\nprint(' '.join(m for m in {names!r} if m in sys.modules))"
    out = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True,
                         check=True, timeout=120)
    return out.stdout.split()


def test_what_serve_runs_before_the_load_imports_no_web_stack() -> None:
    """The CLI's handler, ``serve``, the pool and the key check: none imports Starlette,
    uvicorn, pydantic or the app, so the model's load is not queued behind them."""
    code = ("import eliza_backends.cli.commands, eliza_backends.server\n"
            "from eliza_backends.server.serve import missing_extra, serve\n"
            "from eliza_backends.server.auth import check_api_key, exposure_warning\n"
            "from eliza_backends.server.pool import SessionPool\n"
            "assert missing_extra() is None")
    assert _loaded_after(code, WEB_STACK) == []


def test_the_app_imports_the_other_apis_models_on_their_first_request() -> None:
    code = ("from eliza_backends.server import create_app\n"
            "from eliza_backends.server.listen import run_server")
    assert _loaded_after(code, OTHER_APIS) == []


def test_the_server_announces_only_after_the_warm_up_and_answers_every_api() -> None:
    """The web stack imported on a thread during the load: the server still warms up before it
    announces (binds) its socket, and the APIs whose models are imported lazily answer."""
    import json
    import urllib.request

    with ServerProcess(TINY_BUNDLE, "--backend", "llama.cpp", "--threads", "1",
                       "--parallel", "1", "--log-level", "info") as server:
        def post(path: str, body: dict[str, object]) -> dict[str, object]:
            req = urllib.request.Request(server.root + path, json.dumps(body).encode(),
                                         {"Content-Type": "application/json"})
            with urllib.request.urlopen(req, timeout=60) as resp:
                answer: dict[str, object] = json.loads(resp.read())
                return answer

        said = {"role": "user", "content": "Hi"}
        reply = post("/v1/responses", {"input": "Hi", "max_output_tokens": 2})
        assert reply["object"] == "response" and reply["output"], reply
        assert post("/v1/messages", {"messages": [said], "max_tokens": 2})["type"] == "message"
        assert post("/v1/messages/count_tokens", {"messages": [said]})["input_tokens"] > 0
    logged = "".join(server.stderr)  # read whole once the server stopped
    assert "warmed up in" in logged, logged


def test_a_load_failure_exits_with_its_code_and_never_listens(tmp_path: Path) -> None:
    """A GGUF whose header reads but whose tensors are cut off: the selection accepts it, the
    load fails with the backend's typed error, the process exits 1 without a socket."""
    shutil.copytree(TINY_BUNDLE, tmp_path / "cut")
    gguf = next((tmp_path / "cut" / "text").glob("*.gguf"))
    gguf.write_bytes(gguf.read_bytes()[: gguf.stat().st_size // 2])
    proc = subprocess.run(
        [sys.executable, "-m", "eliza_backends", "serve", str(tmp_path / "cut"), "--port", "0",
         "--backend", "llama.cpp", "--threads", "1"],
        capture_output=True, text=True, timeout=120)
    assert proc.returncode == 1, proc.stderr
    assert "[ELIZA_ERR_" in proc.stderr and "Traceback" not in proc.stderr, proc.stderr
    assert "http://" not in proc.stdout


def test_a_missing_extra_is_said_before_the_model_loads() -> None:
    """Without uvicorn (hidden from this interpreter) ``serve`` says so and loads nothing."""
    code = ("import sys\nsys.modules['uvicorn'] = None\n"
            "from eliza_backends.cli import main\n"
            f"status = main(['serve', {str(TINY_BUNDLE)!r}, '--port', '0'])\n"
            "print(status, 'llama_cpp' in sys.modules)")
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                          timeout=120, check=True)
    assert proc.stdout.split() == ["1", "False"]
    assert "uvicorn is missing" in proc.stderr and "eliza-backends[server]" in proc.stderr
