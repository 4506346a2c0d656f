"""What ``import eliza_backends`` and ``eliza-backends --help`` load (issue 17, goal 1).

Timings belong to ``benchmarks/bench_load.py``; these tests pin the cause instead: neither the
package import nor the CLI's help may load pydantic, asyncio, importlib.metadata or any
runtime, and the package's public names still resolve (lazily) to the real objects.
"""

from __future__ import annotations

import subprocess
import sys

import pytest
from conftest import TINY_BUNDLE

EXPENSIVE = ("pydantic", "asyncio", "importlib.metadata", "pluggy", "jinja2", "llama_cpp",
             "numpy", "mlx", "ai_edge_litert", "litert_lm", "tokenizers")


def _loaded_after(code: str) -> list[str]:
    probe = (f"{code}\nimport sys\n"
             f"print(' '.join(m for m in {EXPENSIVE!r} if m in sys.modules))")
    out = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True,
                         check=True)
    return out.stdout.split()


def test_import_eliza_backends_loads_nothing_expensive() -> None:
    assert _loaded_after("import eliza_backends") == []


def test_cli_help_loads_nothing_expensive() -> None:
    code = ("import contextlib, io\nfrom eliza_backends.cli import main\n"
            "with contextlib.redirect_stdout(io.StringIO()), "
            "contextlib.suppress(SystemExit):\n    main(['--help'])")
    assert _loaded_after(code) == []


def test_public_names_resolve_lazily_to_the_real_objects() -> None:
    import eliza_backends
    from eliza_backends.stream import open_stream

    assert eliza_backends.open_stream is open_stream
    for name in eliza_backends.__all__:
        assert getattr(eliza_backends, name) is not None, name
    assert set(eliza_backends.__all__) <= set(dir(eliza_backends))
    with pytest.raises(AttributeError):
        _ = eliza_backends.no_such_name  # type: ignore[attr-defined]


def test_sync_streaming_does_not_import_asyncio() -> None:
    code = ("from eliza_backends import open_stream\n"
            f"with open_stream({str(TINY_BUNDLE)!r}, backend='llama.cpp', threads=1, "
            "max_tokens=2) as s:\n    s.prefill('Four')\n    s.text()")
    assert "asyncio" not in _loaded_after(code)


def test_opening_a_stream_loads_only_what_a_first_token_needs() -> None:
    """Issue 42: the open path reads no manifest (pydantic models, sha256), renders no chat
    template, loads no bundle tokenizer, slot format or close-match helper, and validates its
    config and the backend's options (given here) without pydantic or its plugin scan."""
    lazy = ("eliza_backends.manifest", "eliza_backends.prompt.chat",
            "eliza_backends.prompt.chat_tokens", "eliza_backends.prompt.tokenizers",
            "eliza_backends.runtime.slots", "difflib", "pydantic", "importlib.metadata")
    code = ("import sys\nfrom eliza_backends import open_stream\n"
            f"with open_stream({str(TINY_BUNDLE)!r}, backend='llama.cpp', threads=1, "
            "max_tokens=2, stop=['zz'], options={'llama.cpp': {'n_ubatch': 64}}) as s:\n"
            "    s.prefill('Four')\n    s.text()\n"
            f"print(' '.join(m for m in {lazy!r} if m in sys.modules))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         check=True)
    assert out.stdout.split() == []

