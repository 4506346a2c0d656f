"""A plugin declares its runtime's native loggers (``Factory.native_loggers``) and the command
line configures whatever the installed plugins declare (issue 36): a third-party plugin's
native output is quiet by default and shown by ``-v``, like the first-party ones'.
"""

from __future__ import annotations

import logging
import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest
from conftest import TINY_BUNDLE, PluginSite

from eliza_backends import Registry
from eliza_backends.cli import configure_logging
from eliza_backends.cli.log_setup import native_logger_names

#: A third-party plugin whose factory declares a native logger and writes to it from
#: ``available()`` (which ``eliza-backends list`` calls), as a runtime's log callback would.
LOUD_PLUGIN = """
    import logging

    from eliza_backends import hookimpl
    from scripted_backend import ScriptedFactory

    class LoudFactory(ScriptedFactory):
        native_loggers = ("thirdparty.native",)

        def available(self):
            native = logging.getLogger("thirdparty.native")
            native.warning("a native warning line")
            native.info("a native info line")
            return super().available()

    @hookimpl
    def eliza_backends_factories():
        return [LoudFactory("loud", suffix=".loud")]
    """


@pytest.fixture
def restore_logging() -> Iterator[None]:
    """Put back the root logger's handlers and level and forget the test's loggers' levels."""
    root = logging.getLogger()
    handlers, level = list(root.handlers), root.level
    yield
    root.handlers[:] = handlers
    root.setLevel(level)
    for name in ("thirdparty.native", "other.native"):
        logging.getLogger(name).setLevel(logging.NOTSET)


def _list(site: PluginSite, *flags: str) -> subprocess.CompletedProcess[str]:
    tests = str(Path(__file__).resolve().parent)
    env = {**os.environ, **site.environ(),
           "PYTHONPATH": os.pathsep.join([str(site.root), tests,
                                          os.environ.get("PYTHONPATH", "")])}
    return subprocess.run([sys.executable, "-m", "eliza_backends", *flags, "list"], env=env,
                          capture_output=True, text=True, timeout=120)


def test_the_cli_configures_a_third_party_plugins_native_logger(plugin_site: PluginSite
                                                                 ) -> None:
    plugin_site.add("loud", LOUD_PLUGIN)
    default, verbose, quiet = _list(plugin_site), _list(plugin_site, "-v"), \
        _list(plugin_site, "-q")
    assert default.returncode == verbose.returncode == quiet.returncode == 0, default.stderr
    assert "loud" in default.stdout
    # unconfigured, the warning would reach the root logger's WARNING handler
    assert "native warning" not in default.stderr and "native info" not in default.stderr
    assert "WARNING thirdparty.native: a native warning line" in verbose.stderr
    assert "INFO thirdparty.native: a native info line" in verbose.stderr
    assert "native" not in quiet.stderr


def test_configure_logging_sets_every_declared_logger(plugin_site: PluginSite,
                                                      restore_logging: None) -> None:
    plugin_site.add("loud", LOUD_PLUGIN)
    plugin_site.add("other", """
        from eliza_backends import hookimpl
        from scripted_backend import ScriptedFactory

        class Other(ScriptedFactory):
            native_loggers = ("other.native", "thirdparty.native")

        @hookimpl
        def eliza_backends_factories():
            return [Other("other", suffix=".other")]
        """)
    registry = Registry(environ=plugin_site.environ())
    assert native_logger_names(registry) == ["other.native", "thirdparty.native"]
    for verbose, quiet, level in ((0, False, logging.ERROR), (1, False, logging.INFO),
                                  (2, False, logging.DEBUG), (2, True, logging.ERROR)):
        configure_logging(verbose, quiet, registry)
        for name in ("other.native", "thirdparty.native"):
            assert logging.getLogger(name).level == level, (verbose, quiet, name)


def test_a_bad_declaration_is_a_broken_plugin(plugin_site: PluginSite) -> None:
    plugin_site.add_scripted("fine", '"fine", suffix=".fine"')
    plugin_site.add("bad", """
        from eliza_backends import hookimpl
        from scripted_backend import ScriptedFactory

        class Bad(ScriptedFactory):
            native_loggers = "bad.native"  # a string, not a tuple of names

        @hookimpl
        def eliza_backends_factories():
            return [Bad("bad", suffix=".bad")]
        """)
    registry = Registry(environ=plugin_site.environ())
    assert [f.name for f in registry.factories()] == ["fine"]
    (problem,) = registry.problems()
    assert problem.plugin == "bad" and "native_loggers" in problem.error


def test_the_first_party_plugins_declare_their_native_loggers() -> None:
    registry = Registry(environ={"ELIZA_BACKENDS_PLUGINS": "llamacpp,litert"})
    assert {"eliza_llamacpp.native", "eliza_litert.native"} <= set(native_logger_names(registry))


def test_a_command_that_loads_no_runtime_discovers_no_plugin() -> None:
    """``bundle verify`` / ``create`` skip the native loggers and so the plugin discovery
    (pluggy, importlib.metadata, every plugin module): a third of a second here."""
    code = ("import contextlib, io, sys\nfrom eliza_backends.cli import main\n"
            "with contextlib.redirect_stdout(io.StringIO()):\n"
            f"    assert main(['bundle', 'verify', {str(TINY_BUNDLE)!r}, '--no-hash']) == 0\n"
            "print([m for m in ('pluggy', 'eliza_backends.registry', 'eliza_llamacpp') "
            "if m in sys.modules])")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         check=True, timeout=120)
    assert out.stdout.strip() == "[]"
