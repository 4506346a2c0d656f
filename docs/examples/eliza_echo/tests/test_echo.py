"""eliza-echo's tests: the whole conformance kit, plus discovery through the entry point."""

from __future__ import annotations

from pathlib import Path
from typing import Any, ClassVar

import pytest
from eliza_echo import EchoFactory

from eliza_backends import list_backends, open_stream
from eliza_backends.testing import BackendConformance

BUNDLE = Path(__file__).resolve().parent.parent / "bundle"


class TestEchoConformance(BackendConformance):
    """Every contract check, run against the echo backend."""

    base_config: ClassVar[dict[str, Any]] = {
        **BackendConformance.base_config,
        # a real model takes time per token; give cancel() something to interrupt
        "options": {"echo": {"delay": 0.0001}},
    }

    @pytest.fixture
    def factory(self) -> EchoFactory:
        return EchoFactory()

    @pytest.fixture
    def bundle_dir(self) -> Path:
        return BUNDLE


def test_installed_plugin_is_discovered() -> None:
    names = {info.name: info for info in list_backends()}
    assert "echo" in names
    assert names["echo"].distribution == "eliza-echo"
    assert names["echo"].available


def test_selected_for_an_echo_bundle() -> None:
    with open_stream(BUNDLE, max_tokens=24) as stream:
        assert stream.backend == "echo"
        stream.prefill("Hello, echo!")
        assert stream.text() == "Hello, echo!" * 2
