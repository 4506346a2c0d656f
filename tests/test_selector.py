"""The selector's full resolution table, through real entry-point discovery.

Every scenario installs small plugin distributions on a temporary ``sys.path`` entry and lets
the registry find them with ``importlib.metadata``; nothing in the registry is patched.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from conftest import PluginSite, make_bundle

from eliza_backends import BackendSelectionError, Registry, Status, explain, select

LLAMA = '"llama.cpp", aliases=("llamacpp",), rank=0, suffix=".gguf"'


def _select(site: PluginSite, bundle: Path, **env: str) -> str:
    environ = site.environ(**env)
    return select(bundle, environ=environ, registry=Registry(environ=environ)).name


def _error(site: PluginSite, bundle: Path, **env: str) -> BackendSelectionError:
    environ = site.environ(**env)
    with pytest.raises(BackendSelectionError) as info:
        select(bundle, environ=environ, registry=Registry(environ=environ))
    return info.value


@pytest.fixture
def bundle(tmp_path: Path) -> Path:
    return make_bundle(tmp_path / "bundle", "m.gguf", "m.alpha", "m.beta", "m.gamma")


def test_env_hit_and_alias(plugin_site: PluginSite, bundle: Path) -> None:
    plugin_site.add_scripted("llama", LLAMA)
    plugin_site.add_scripted("alpha", '"alpha", aliases=("al",), rank=5, suffix=".alpha"')
    plugin_site.add_scripted("beta", '"beta", rank=9, suffix=".beta"')
    assert _select(plugin_site, bundle, ELIZA_LLM_BACKEND="alpha") == "alpha"
    assert _select(plugin_site, bundle, ELIZA_LLM_BACKEND="  ALPHA ") == "alpha"
    assert _select(plugin_site, bundle, ELIZA_LLM_BACKEND="Al") == "alpha"


def test_env_forces_llama_cpp_over_higher_ranks(plugin_site: PluginSite, bundle: Path) -> None:
    plugin_site.add_scripted("llama", LLAMA)
    plugin_site.add_scripted("beta", '"beta", rank=9, suffix=".beta"')
    assert _select(plugin_site, bundle) == "beta"
    assert _select(plugin_site, bundle, ELIZA_LLM_BACKEND="llama.cpp") == "llama.cpp"
    assert _select(plugin_site, bundle, ELIZA_LLM_BACKEND="llamacpp") == "llama.cpp"


def test_env_unknown_name_fails_loudly(plugin_site: PluginSite, bundle: Path) -> None:
    plugin_site.add_scripted("llama", LLAMA)
    plugin_site.add_scripted("alpha", '"alpha", rank=5, suffix=".alpha"')
    err = _error(plugin_site, bundle, ELIZA_LLM_BACKEND="alpah")
    assert "not installed" in err.message and "'alpha'" in err.message
    assert "llama.cpp, alpha" in err.message or "alpha, llama.cpp" in err.message
    assert err.code == Status.ERR_BACKEND_NOT_INSTALLED  # not "installed but unavailable"
    err = _error(plugin_site, bundle, ELIZA_LLM_BACKEND="litert-lm")
    assert "pip install 'eliza-backends[litert]'" in err.message


def test_env_unavailable_fails_loudly(plugin_site: PluginSite, bundle: Path) -> None:
    plugin_site.add_scripted("llama", LLAMA)
    plugin_site.add_scripted("alpha", '"alpha", rank=5, suffix=".alpha", available=False, '
                                      'reason="no NPU here"')
    err = _error(plugin_site, bundle, ELIZA_LLM_BACKEND="alpha")
    assert "not available on this host: no NPU here" in err.message
    assert err.code == Status.ERR_BACKEND_UNAVAILABLE


def test_env_cannot_serve_fails_loudly(plugin_site: PluginSite, tmp_path: Path) -> None:
    plugin_site.add_scripted("llama", LLAMA)
    plugin_site.add_scripted("alpha", '"alpha", rank=5, suffix=".alpha"')
    only_gguf = make_bundle(tmp_path / "g", "m.gguf")
    err = _error(plugin_site, only_gguf, ELIZA_LLM_BACKEND="alpha")
    assert "cannot serve" in err.message
    assert err.code == Status.ERR_CANNOT_SERVE


def test_rank_order_and_ties(plugin_site: PluginSite, bundle: Path, tmp_path: Path) -> None:
    plugin_site.add_scripted("llama", LLAMA)
    plugin_site.add_scripted("alpha", '"alpha", rank=5, suffix=".alpha"')
    plugin_site.add_scripted("beta", '"beta", rank=9, suffix=".beta"')
    plugin_site.add_scripted("gamma", '"gamma", rank=5, suffix=".gamma"')
    assert _select(plugin_site, bundle) == "beta"
    no_beta = make_bundle(tmp_path / "nb", "m.gguf", "m.alpha", "m.gamma")
    assert _select(plugin_site, no_beta) == "alpha"  # tie at 5: alphabetical


def test_llama_cpp_is_the_fallback(plugin_site: PluginSite, bundle: Path) -> None:
    plugin_site.add_scripted("llama", LLAMA)
    plugin_site.add_scripted("alpha", '"alpha", rank=5, suffix=".alpha", available=False')
    report = explain(bundle, environ=plugin_site.environ(),
                     registry=Registry(environ=plugin_site.environ()))
    assert report.chosen == "llama.cpp"
    verdicts = {c.name: c.verdict for c in report.candidates}
    assert verdicts == {"llama.cpp": "chosen", "alpha": "unavailable"}


def test_rank_not_above_zero_loses_to_llama_cpp_but_serves_otherwise(
        plugin_site: PluginSite, bundle: Path, tmp_path: Path) -> None:
    plugin_site.add_scripted("llama", LLAMA)
    plugin_site.add_scripted("slow", '"slow", rank=-10, suffix=".alpha"')
    environ = plugin_site.environ()
    report = explain(bundle, environ=environ, registry=Registry(environ=environ))
    assert report.chosen == "llama.cpp"
    slow = next(c for c in report.candidates if c.name == "slow")
    assert slow.verdict == "below-llama.cpp" and "scripted rank -10" in slow.reason
    assert _select(plugin_site, make_bundle(tmp_path / "a", "m.alpha")) == "slow"
    assert _select(plugin_site, bundle, ELIZA_LLM_BACKEND="slow") == "slow"


def test_nothing_can_serve_lists_what_each_lacked(plugin_site: PluginSite,
                                                  tmp_path: Path) -> None:
    plugin_site.add_scripted("llama", LLAMA)
    plugin_site.add_scripted("alpha", '"alpha", rank=5, suffix=".alpha", available=False, '
                                      'reason="runtime missing"')
    empty = make_bundle(tmp_path / "e", "readme.txt")
    err = _error(plugin_site, empty)
    assert "no installed backend can serve" in err.message
    assert "alpha: runtime missing" in err.message and "llama.cpp: no" in err.message
    assert err.code == Status.ERR_CANNOT_SERVE


def test_missing_bundle_is_a_bundle_error(plugin_site: PluginSite, tmp_path: Path) -> None:
    plugin_site.add_scripted("llama", LLAMA)
    err = _error(plugin_site, tmp_path / "nope")
    assert err.code == Status.ERR_BUNDLE and "does not exist" in err.message


def test_broken_plugins_are_isolated(plugin_site: PluginSite, bundle: Path) -> None:
    plugin_site.add_scripted("llama", LLAMA)
    plugin_site.add_scripted("alpha", '"alpha", rank=5, suffix=".alpha"')
    plugin_site.add("importfails", "raise ImportError('missing native lib')\n")
    plugin_site.add("garbage", """
        from eliza_backends import hookimpl

        @hookimpl
        def eliza_backends_factories():
            return ["not a factory"]
        """)
    plugin_site.add("raises", """
        from eliza_backends import hookimpl

        @hookimpl
        def eliza_backends_factories():
            raise RuntimeError("boom")
        """)
    plugin_site.add("unknownhook", """
        from eliza_backends import hookimpl

        @hookimpl
        def eliza_backends_factoriez():
            return []
        """)
    environ = plugin_site.environ()
    registry = Registry(environ=environ)
    assert sorted(f.name for f in registry.factories()) == ["alpha", "llama.cpp"]
    problems = {p.plugin: p.error for p in registry.problems()}
    assert set(problems) == {"importfails", "garbage", "raises", "unknownhook"}
    assert "missing native lib" in problems["importfails"]
    assert "not a Factory" in problems["garbage"]
    assert "boom" in problems["raises"]
    assert "eliza_backends_factoriez" in problems["unknownhook"]
    report = explain(bundle, environ=environ, registry=registry)
    assert report.chosen == "alpha" and len(report.broken_plugins) == 4


def test_duplicate_names_are_reported(plugin_site: PluginSite, bundle: Path) -> None:
    plugin_site.add_scripted("alpha", '"alpha", rank=5, suffix=".alpha"')
    plugin_site.add_scripted("alpha2", '"ALPHA", rank=7, suffix=".alpha"')
    registry = Registry(environ=plugin_site.environ())
    assert [f.name for f in registry.factories()] == ["alpha"]
    assert "clashes" in registry.problems()[0].error


def test_allowlist_pins_plugins(plugin_site: PluginSite, bundle: Path) -> None:
    plugin_site.add_scripted("llama", LLAMA)
    plugin_site.add_scripted("beta", '"beta", rank=9, suffix=".beta"')
    environ = {"ELIZA_BACKENDS_PLUGINS": "llama"}
    assert select(bundle, environ=environ, registry=Registry(environ=environ)).name == \
        "llama.cpp"
    err_env = {"ELIZA_BACKENDS_PLUGINS": "llama", "ELIZA_LLM_BACKEND": "beta"}
    with pytest.raises(BackendSelectionError):
        select(bundle, environ=err_env, registry=Registry(environ=err_env))


def test_backend_argument_wins_over_env(plugin_site: PluginSite, bundle: Path) -> None:
    plugin_site.add_scripted("llama", LLAMA)
    plugin_site.add_scripted("alpha", '"alpha", rank=5, suffix=".alpha"')
    environ = plugin_site.environ(ELIZA_LLM_BACKEND="alpha")
    chosen = select(bundle, backend="llama.cpp", environ=environ,
                    registry=Registry(environ=environ))
    assert chosen.name == "llama.cpp"


def test_discovery_is_lazy_and_idempotent(plugin_site: PluginSite) -> None:
    plugin_site.add("counted", """
        from eliza_backends import hookimpl
        from scripted_backend import ScriptedFactory
        CALLS = []

        @hookimpl
        def eliza_backends_factories():
            CALLS.append(1)
            return [ScriptedFactory("counted")]
        """)
    registry = Registry(environ=plugin_site.environ())
    assert "fake_plugin_counted" not in sys.modules  # nothing happens until first use
    registry.factories()
    registry.factories()
    registry.get("counted")
    assert sys.modules["fake_plugin_counted"].CALLS == [1]


def test_discovery_reads_only_its_group_without_importlib_metadata(
        plugin_site: PluginSite, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Issue 42: the registry scans the ``eliza_backends`` sections of the distributions on
    the path itself (importlib.metadata would parse every installed distribution): the
    distribution's own name and version are reported, a distribution earlier on the path
    hides a later one of the same name (as importlib.metadata does), an ``.egg-info`` counts,
    other groups and comments are ignored."""
    from importlib import metadata

    from eliza_backends.entry_points import group_entry_points

    plugin_site.add("alpha", """
        from eliza_backends import hookimpl
        from scripted_backend import ScriptedFactory

        @hookimpl
        def eliza_backends_factories():
            return [ScriptedFactory("alpha", rank=5, suffix=".alpha")]
        """, dist="Alpha.Plugin")
    later = tmp_path / "later"
    info = later / "alpha_plugin-9.9.dist-info"
    info.mkdir(parents=True)
    (info / "METADATA").write_text("Metadata-Version: 2.1\nName: alpha-plugin\nVersion: 9.9\n")
    (info / "entry_points.txt").write_text("[eliza_backends]\nalpha = nowhere_at_all\n")
    egg = plugin_site.root / "eggy.egg-info"
    egg.mkdir()
    (egg / "PKG-INFO").write_text("Metadata-Version: 1.1\nName: eggy\nVersion: 2.0\n\nName: x\n")
    (egg / "entry_points.txt").write_text(
        "[console_scripts]\nbeta = not_this:one\n\n[eliza_backends]\n# a comment\n"
        "beta = fake_plugin_beta:thing [extra]\n")
    refs = group_entry_points("eliza_backends", [str(plugin_site.root), str(later)])
    assert [(r.name, r.value, r.distribution, r.version) for r in refs] == [
        ("alpha", "fake_plugin_alpha", "Alpha.Plugin", "0.1"),
        ("beta", "fake_plugin_beta:thing [extra]", "eggy", "2.0")]

    def no_metadata(*args: object, **kwargs: object) -> None:
        raise AssertionError("discovery called importlib.metadata")

    monkeypatch.setattr(metadata, "entry_points", no_metadata)
    monkeypatch.setattr(metadata, "distributions", no_metadata)
    environ = {"ELIZA_BACKENDS_PLUGINS": "alpha"}
    (info_row,) = Registry(environ=environ).info()
    assert (info_row.name, info_row.distribution, info_row.version) == \
        ("alpha", "Alpha.Plugin", "0.1")


def test_select_asks_no_availability_of_a_backend_that_cannot_serve(
        plugin_site: PluginSite, tmp_path: Path) -> None:
    """Issue 42: opening a stream probes availability only of the backends that can serve
    the bundle; explain() still reports every backend's verdict."""
    plugin_site.add("counting", """
        from eliza_backends import hookimpl
        from scripted_backend import ScriptedFactory
        ASKED = []

        class Counting(ScriptedFactory):
            def available(self):
                ASKED.append(self.name)
                return super().available()

        @hookimpl
        def eliza_backends_factories():
            return [Counting("llama.cpp", rank=0, suffix=".gguf"),
                    Counting("alpha", rank=5, suffix=".alpha", available=False)]
        """)
    gguf_only = make_bundle(tmp_path / "gguf", "m.gguf")
    environ = plugin_site.environ()
    registry = Registry(environ=environ)
    assert select(gguf_only, environ=environ, registry=registry).name == "llama.cpp"
    asked = sys.modules["fake_plugin_counting"].ASKED
    assert asked == ["llama.cpp"]
    report = explain(gguf_only, environ=environ, registry=registry)
    assert {c.name: c.verdict for c in report.candidates} == {
        "llama.cpp": "chosen", "alpha": "unavailable"}
    assert sorted(set(asked)) == ["alpha", "llama.cpp"]


def test_distribution_version_agrees_with_importlib_metadata() -> None:
    """The plugins' availability probes read versions through the kit's cheap reader."""
    from importlib import metadata

    from eliza_backends.backend import distribution_version

    for name in ("pydantic", "pluggy", "llama-cpp-python", "llama_cpp_python", "Eliza.Backends"):
        assert distribution_version(name) == metadata.version(name), name
    assert distribution_version("no-such-distribution-here") is None


def test_cli_select_uses_real_discovery(plugin_site: PluginSite, bundle: Path) -> None:
    plugin_site.add_scripted("llama", LLAMA)
    plugin_site.add_scripted("beta", '"beta", rank=9, suffix=".beta"')
    tests_dir = str(Path(__file__).parent)
    env = {**os.environ, **plugin_site.environ(),
           "PYTHONPATH": os.pathsep.join([str(plugin_site.root), tests_dir])}
    env.pop("ELIZA_LLM_BACKEND", None)
    out = subprocess.run([sys.executable, "-m", "eliza_backends", "select", str(bundle),
                          "--json"], env=env, capture_output=True, text=True, check=True)
    report = json.loads(out.stdout)
    assert report["chosen"] == "beta"
    assert {c["name"]: c["verdict"] for c in report["candidates"]} == {
        "llama.cpp": "lower-rank", "beta": "chosen"}
    env["ELIZA_LLM_BACKEND"] = "nosuch"
    out = subprocess.run([sys.executable, "-m", "eliza_backends", "select", str(bundle)],
                         env=env, capture_output=True, text=True)
    assert out.returncode == 1 and "nosuch" in out.stderr and "Traceback" not in out.stderr


# ----------------------------------------------------- not installed / not available (15.13)

def test_not_installed_and_not_available_have_their_own_codes(plugin_site: PluginSite,
                                                              tmp_path: Path) -> None:
    """A bundle whose .gguf llama.cpp would serve, with llama-cpp-python missing, used to get
    ERR_CANNOT_SERVE and "add a .gguf to text/". It now says what to install."""
    gguf = make_bundle(tmp_path / "g", "m.gguf")
    plugin_site.add_scripted("llama", '"llama.cpp", rank=0, suffix=".gguf", available=False, '
                                      'installed=False, reason="llama-cpp-python is not '
                                      'installed: pip install x"')
    plugin_site.add_scripted("alpha", '"alpha", rank=5, suffix=".alpha", available=False, '
                                      'reason="no NPU here"')
    err = _error(plugin_site, gguf)
    assert err.code == Status.ERR_BACKEND_NOT_INSTALLED, err
    assert "llama-cpp-python is not installed" in err.message and ".gguf" not in err.message
    err = _error(plugin_site, gguf, ELIZA_LLM_BACKEND="llama.cpp")
    assert err.code == Status.ERR_BACKEND_NOT_INSTALLED and "not installed" in err.message
    alpha = make_bundle(tmp_path / "a", "m.alpha")  # installed, but not on this host
    err = _error(plugin_site, alpha)
    assert err.code == Status.ERR_BACKEND_UNAVAILABLE and "no NPU here" in err.message
    err = _error(plugin_site, alpha, ELIZA_LLM_BACKEND="alpha")
    assert err.code == Status.ERR_BACKEND_UNAVAILABLE and "no NPU here" in err.message
    empty = make_bundle(tmp_path / "e", "README.txt")  # no artifact at all
    err = _error(plugin_site, empty)
    assert err.code == Status.ERR_CANNOT_SERVE and "Add one" in err.message


def test_an_artifact_no_installed_plugin_serves_names_the_extra(plugin_site: PluginSite,
                                                                tmp_path: Path) -> None:
    plugin_site.add_scripted("alpha", '"alpha", rank=5, suffix=".alpha"')
    gguf = make_bundle(tmp_path / "g", "m.gguf")
    err = _error(plugin_site, gguf)
    assert err.code == Status.ERR_BACKEND_NOT_INSTALLED, err
    assert "pip install 'eliza-backends[llamacpp]'" in err.message


def test_the_llama_cpp_plugin_reports_a_missing_runtime_as_not_installed(
        monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    pytest.importorskip("eliza_llamacpp")
    import importlib.util

    from eliza_llamacpp import LlamaCppFactory

    real = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec",
                        lambda name, *a: None if name == "llama_cpp" else real(name, *a))
    factory = LlamaCppFactory()
    avail = factory.available()
    assert not avail and not avail.installed and "pip install" in avail.reason
    registry = Registry(environ={})
    registry.register(type("OnlyLlama", (), {"eliza_backends_factories": staticmethod(
        lambda: [factory])})(), name="only-llama")
    with pytest.raises(BackendSelectionError) as err:
        select(make_bundle(tmp_path / "g", "m.gguf"), environ={}, registry=registry)
    assert err.value.code == Status.ERR_BACKEND_NOT_INSTALLED
    assert "llama-cpp-python is not installed" in err.value.message
