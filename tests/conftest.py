"""Shared fixtures: the tiny bundle, small plugin distributions on a temporary path, the one
Ray cluster of the session; and the test tiers.

``plugin_site`` writes real distributions (``*.dist-info`` with ``entry_points.txt``) and
their modules into a temporary directory on ``sys.path``, so the registry discovers them through
``importlib.metadata`` exactly as it discovers installed plugins.

Tiers (markers, listed in pyproject.toml; ``--strict-markers``): every test is in the full tier
(``bash scripts/test.sh``, what CI runs). :data:`QUICK` modules are also in the quick tier
(``bash scripts/test.sh --quick``, ``-m quick``), except their tests marked with one of
:data:`FULL_ONLY`; :data:`KINDS` marks whole modules with those kinds here, and every
``test_fuzz*`` is ``fuzz``, so a test file keeps its imports and bodies and the tiers are read
in one place.
"""

from __future__ import annotations

import importlib
import sys
import textwrap
from collections.abc import Iterator
from pathlib import Path

import pytest

from eliza_backends.testing import BackendConformance

ROOT = Path(__file__).resolve().parent.parent
TINY_BUNDLE = ROOT / "examples" / "bundles" / "tiny"

#: what a developer runs after each change: the contract (these modules, and the conformance kit
#: on every backend: each BackendConformance class), selector, stream, chat, structured output
#: and server tests on the tiny bundle
QUICK = frozenset({
    "test_batching", "test_bundle", "test_chat", "test_chat_tokens", "test_close_abort",
    "test_contract_edges",
    "test_conformance_scripted", "test_gemma4_grammar", "test_gemma4_repair",
    "test_gemma4_tools",
    "test_generate_batch",
    "test_kit_catches_broken_backends", "test_openai_api", "test_openai_server",
    "test_parallel_serving", "test_selector", "test_stream_api", "test_structured",
    "test_text_and_slots", "test_tokenizer", "test_typed_errors",
})
#: markers that keep a test out of the quick tier (full tier only)
FULL_ONLY = ("slow", "fuzz", "crash_oracle", "ray", "real")
#: whole modules of a full-tier-only kind
KINDS: dict[str, tuple[str, ...]] = {
    "test_gguf_fuzz": ("crash_oracle",),
    "test_tflite_fuzz": ("crash_oracle",),
    "test_mlx_batched": ("slow",),
    "test_ray_data": ("ray",),
    "test_ray_serve": ("ray",),
    "test_openai_real": ("real",),
    "test_structured_real": ("real",),
}


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """Mark each test with its tier (see the module docstring)."""
    for item in items:
        module = item.path.stem
        if item.path.parent.name == "real":
            item.add_marker(pytest.mark.real)
        for kind in KINDS.get(module, ()):
            item.add_marker(getattr(pytest.mark, kind))
        if getattr(item, "originalname", item.name).startswith("test_fuzz"):
            item.add_marker(pytest.mark.fuzz)
        cls = getattr(item, "cls", None)
        kit = cls is not None and issubclass(cls, BackendConformance)
        if (module in QUICK or kit) and not any(item.get_closest_marker(m) for m in FULL_ONLY):
            item.add_marker(pytest.mark.quick)


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


@pytest.fixture(scope="session")
def ray_session() -> Iterator[None]:
    """One local Ray cluster (tests/ray_cluster.py) for every Ray test of the session: it used
    to be started and shut down once per module. Tests that use it leave no actors or Serve
    applications behind them."""
    import ray
    from ray_cluster import start_local_ray

    start_local_ray()
    try:
        yield
    finally:
        ray.shutdown()
