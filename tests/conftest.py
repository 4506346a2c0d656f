"""Shared fixtures: the tiny bundle, and small plugin distributions on a temporary path.

``plugin_site`` writes real distributions (``*.dist-info`` with ``entry_points.txt``) and
their modules into a temporary directory on ``sys.path``, so the registry discovers them through
``importlib.metadata`` exactly as it discovers installed plugins.
"""

from __future__ import annotations

import importlib
import sys
import textwrap
from collections.abc import Iterator
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
TINY_BUNDLE = ROOT / "examples" / "bundles" / "tiny"


class PluginSite:
    """A directory of plugin distributions on ``sys.path``."""

    def __init__(self, root: Path) -> None:
        self.root = root
        self.entry_points: list[str] = []

    def add(self, ep_name: str, source: str, *, dist: str | None = None) -> str:
        """Add a distribution whose ``eliza_backends`` entry point ``ep_name`` is a module
        with ``source``; returns the module name."""
        module = f"fake_plugin_{ep_name}"
        dist = dist or f"fake-{ep_name}"
        (self.root / f"{module}.py").write_text(textwrap.dedent(source))
        info = self.root / f"{dist.replace('-', '_')}-0.1.dist-info"
        info.mkdir()
        (info / "METADATA").write_text(f"Metadata-Version: 2.1\nName: {dist}\nVersion: 0.1\n")
        (info / "entry_points.txt").write_text(f"[eliza_backends]\n{ep_name} = {module}\n")
        self.entry_points.append(ep_name)
        importlib.invalidate_caches()
        return module

    def add_scripted(self, ep_name: str, *factories: str) -> str:
        """Add a plugin returning ScriptedFactory(...) instances; each item of ``factories``
        is the constructor call's argument text, e.g. ``'"alpha", rank=5, suffix=".alpha"'``."""
        made = ", ".join(f"ScriptedFactory({args})" for args in factories)
        return self.add(ep_name, f"""
            from eliza_backends import hookimpl
            from scripted_backend import ScriptedFactory

            @hookimpl
            def eliza_backends_factories():
                return [{made}]
            """)

    def environ(self, **extra: str) -> dict[str, str]:
        """An environment that lets only this site's plugins load."""
        return {"ELIZA_BACKENDS_PLUGINS": ",".join(self.entry_points), **extra}


@pytest.fixture
def plugin_site(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[PluginSite]:
    site = tmp_path / "site"
    site.mkdir()
    monkeypatch.syspath_prepend(str(site))
    yield PluginSite(site)
    for name in [m for m in sys.modules if m.startswith("fake_plugin_")]:
        del sys.modules[name]


def make_bundle(root: Path, *names: str) -> Path:
    """A bundle directory whose text/ holds empty files with the given names."""
    text = root / "text"
    text.mkdir(parents=True, exist_ok=True)
    for name in names:
        (text / name).write_bytes(b"")
    return root


@pytest.fixture
def tiny_bundle() -> Path:
    assert (TINY_BUNDLE / "manifest.json").is_file(), "the tiny bundle is missing"
    return TINY_BUNDLE
