"""The real install path: build every wheel, install them into a fresh virtual environment from
the built files (runtime dependencies from the package index / pip cache), and check that the
entry points register and the CLI sees every backend."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
from conftest import ROOT, TINY_BUNDLE

PLUGINS = sorted(p.parent for p in (ROOT / "plugins").glob("*/pyproject.toml"))


@pytest.mark.slow
def test_wheels_install_and_register(tmp_path: Path) -> None:
    dist = tmp_path / "dist"
    for project in [ROOT, *PLUGINS]:
        subprocess.run([sys.executable, "-m", "pip", "wheel", "--quiet", "--no-deps", "-w",
                        str(dist), str(project)], check=True, timeout=600)
    wheels = sorted(p.name for p in dist.glob("*.whl"))
    assert len(wheels) == 1 + len(PLUGINS), wheels
    venv = tmp_path / "venv"
    subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True)
    py = venv / "bin" / "python"
    subprocess.run([str(py), "-m", "pip", "install", "--quiet", "--find-links", str(dist),
                    "-c", str(ROOT / "constraints.txt"), "eliza-backends[all]"], check=True,
                   timeout=1200)
    out = subprocess.run([str(venv / "bin" / "eliza-backends"), "list", "--json"],
                         capture_output=True, text=True, check=True)
    data = json.loads(out.stdout)
    assert data["broken_plugins"] == []
    found = {b["distribution"] for b in data["backends"]}
    expected = {p.name.replace("_", "-") for p in PLUGINS}
    assert found == expected
    assert all(b["available"] for b in data["backends"]), data["backends"]
    gen = subprocess.run([str(venv / "bin" / "eliza-backends"), "generate", str(TINY_BUNDLE),
                          "Four score", "--max-tokens", "8", "--threads", "1"],
                         capture_output=True, text=True, timeout=300)
    assert gen.returncode == 0, gen.stderr
    assert gen.stdout.strip()


@pytest.mark.slow
def test_every_distribution_carries_its_metadata(tmp_path: Path) -> None:
    """LICENSE and py.typed in every wheel, the classifiers users filter on, no ``dev`` extra,
    and an sdist that holds the package and its metadata only (no tests, docs, models or
    other distributions)."""
    import tarfile
    import zipfile

    for project in [ROOT, *PLUGINS]:
        out = tmp_path / project.name
        subprocess.run([sys.executable, "-m", "build", "--quiet", "-o", str(out), str(project)],
                       check=True, timeout=600, capture_output=True)
        (wheel,) = out.glob("*.whl")
        (sdist,) = out.glob("*.tar.gz")
        with zipfile.ZipFile(wheel) as zf:
            names = zf.namelist()
            meta = zf.read(next(n for n in names if n.endswith(".dist-info/METADATA"))).decode()
        package = wheel.name.split("-")[0]
        assert f"{package}/py.typed" in names, wheel.name
        assert any(n.endswith(".dist-info/licenses/LICENSE") for n in names), wheel.name
        for line in ("License-Expression: Apache-2.0", "Requires-Python: >=3.10",
                     "Classifier: Development Status :: 3 - Alpha",
                     "Classifier: Programming Language :: Python :: 3.11"):
            assert line in meta, (wheel.name, line)
        # the dev tools are a dependency group, never an extra users are offered
        assert "Provides-Extra: dev" not in meta and "Requires-Dist: pytest" not in meta, wheel.name
        with tarfile.open(sdist) as tf:
            members = [m.split("/", 1)[1] for m in tf.getnames() if "/" in m]
        stray = [m for m in members if not (m.startswith(f"src/{package}/") or m in {
            "LICENSE", "README.md", "pyproject.toml", "PKG-INFO", ".gitignore"})]
        assert stray == [], (sdist.name, stray)
