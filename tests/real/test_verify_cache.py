"""``bundle convert --verify``'s cache end to end, in the converter environment: a rerun on the
same artifacts and serving code verifies nothing, and the record of the serving modules the
verification loaded (``eliza_backends.convert.verify_key``) holds the seam and the backend that
served the artifact, not the converter or the command line. (The tiny bundle's Hugging Face
folder: seconds, where the real models' verification takes minutes.)"""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

import pytest

from .models import ROOT, convert_python

TINY_HF = ROOT / "examples" / "bundles" / "tiny" / "text" / "tiny-mlx"


def test_a_rerun_verifies_nothing(tmp_path: Path) -> None:
    py = convert_python()
    if not py.is_file():
        pytest.fail(f"no converter environment at {py}: run bash scripts/install-convert.sh")
    cmd = [str(py), "-m", "eliza_backends", "bundle", "convert", str(TINY_HF),
           str(tmp_path / "b"), "--formats", "gguf", "--verify", "--name", "tiny",
           "--threads", "1", "--work-dir", str(tmp_path / "work")]
    logs = []
    for _ in range(2):
        done = subprocess.run(cmd, capture_output=True, text=True, timeout=900, check=False)
        assert done.returncode == 0, done.stderr[-3000:]
        logs.append(done.stdout + done.stderr)
    assert "verify: started" in logs[0] and "verify: cached" in logs[1], logs[1][-3000:]
    parity = json.loads((tmp_path / "b" / "parity.json").read_text())
    assert parity["artifacts"] and not any("error" in a for a in parity["artifacts"].values())
    records = list((tmp_path / "work" / "verify-modules").glob("*.json"))
    assert len(records) == 1
    modules = json.loads(records[0].read_text())["modules"]
    assert {"eliza_backends.stream", "eliza_llamacpp"} <= set(modules), modules
    assert not [m for m in modules if m.startswith(("eliza_backends.convert",
                                                    "eliza_backends.cli"))]
