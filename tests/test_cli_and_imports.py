"""The command line on the real installed backends, and the cheap-import promise."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from conftest import TINY_BUNDLE

HEAVY = ("llama_cpp", "mlx", "mlx_lm", "mlx_vlm", "litert_lm", "ai_edge_litert", "coremltools",
         "torch", "transformers", "tokenizers", "numpy", "ray", "pyarrow")


def _cli(*args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    full_env = {k: v for k, v in os.environ.items() if k != "ELIZA_LLM_BACKEND"}
    full_env.update(env or {})
    return subprocess.run([sys.executable, "-m", "eliza_backends", *args], env=full_env,
                          capture_output=True, text=True, timeout=300)


def test_import_and_list_never_import_a_runtime() -> None:
    code = ("import sys, eliza_backends as e; infos = e.list_backends(); "
            "e.explain(sys.argv[1]); "
            f"print([m for m in {HEAVY!r} if m in sys.modules]); print(len(infos))")
    out = subprocess.run([sys.executable, "-c", code, str(TINY_BUNDLE)], capture_output=True,
                         text=True, check=True)
    loaded, count = out.stdout.strip().splitlines()
    assert loaded == "[]"
    assert int(count) >= 1


def test_list_json_shows_installed_backends() -> None:
    out = _cli("list", "--json")
    assert out.returncode == 0, out.stderr
    data = json.loads(out.stdout)
    names = {b["name"] for b in data["backends"]}
    assert "llama.cpp" in names
    llama = next(b for b in data["backends"] if b["name"] == "llama.cpp")
    assert llama["available"] and llama["rank"] == 0 and llama["formats"] == ["gguf"]
    assert data["broken_plugins"] == []
    table = _cli("list")
    assert table.returncode == 0 and "llama.cpp" in table.stdout


def test_select_explain_on_the_tiny_bundle() -> None:
    out = _cli("select", str(TINY_BUNDLE), "--explain")
    assert out.returncode == 0, out.stderr
    assert "chosen: llama.cpp" in out.stdout


def test_generate_streams_text_and_reports_stats() -> None:
    out = _cli("generate", str(TINY_BUNDLE), "Four score and seven years ago", "--backend",
               "llama.cpp", "--max-tokens", "16", "--threads", "1")
    assert out.returncode == 0, out.stderr
    assert out.stdout.startswith(" our fathers")
    assert "[llama.cpp]" in out.stderr and "tok/s" in out.stderr and "finish: length" in \
        out.stderr


def test_errors_are_one_line_with_exit_code_1(tmp_path: Path) -> None:
    out = _cli("generate", str(tmp_path / "missing"), "hi")
    assert out.returncode == 1
    assert out.stderr.startswith("error: ") and "Traceback" not in out.stderr
    out = _cli("select", str(TINY_BUNDLE), env={"ELIZA_LLM_BACKEND": "nope"})
    assert out.returncode == 1 and "not installed" in out.stderr
    out = _cli("generate", str(TINY_BUNDLE), "hi", "--temperature", "-3")  # a bad argument:
    assert out.returncode == 2 and "temperature" in out.stderr  # usage (issue 32)
    assert _cli("frobnicate").returncode == 2


def test_bundle_create_and_verify(tmp_path: Path) -> None:
    out = _cli("bundle", "create", str(tmp_path / "b"), str(TINY_BUNDLE / "text" /
                                                             "tiny-f16.gguf"), "--name", "t")
    assert out.returncode == 0, out.stderr
    assert "text/tiny-f16.gguf  gguf  llama.cpp  model" in out.stdout
    assert _cli("bundle", "verify", str(tmp_path / "b")).returncode == 0
    (tmp_path / "b" / "text" / "tiny-f16.gguf").write_bytes(b"changed")
    bad = _cli("bundle", "verify", str(tmp_path / "b"))
    assert bad.returncode == 1 and "size 7" in bad.stderr


@pytest.mark.parametrize("option", ["llama.cpp:n_gpu_layers=0", "llama.cpp:use_mmap=false"])
def test_generate_backend_options(option: str) -> None:
    out = _cli("generate", str(TINY_BUNDLE), "Four", "--max-tokens", "4", "--option", option,
               "--threads", "1")
    assert out.returncode == 0, out.stderr


def test_unknown_backend_option_is_refused() -> None:
    out = _cli("generate", str(TINY_BUNDLE), "Four", "--option", "llama.cpp:turbo=1")
    assert out.returncode == 1 and "turbo" in out.stderr
