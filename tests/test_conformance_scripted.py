"""The conformance kit runs on the scripted backend (no runtime needed)."""

from __future__ import annotations

from pathlib import Path

import pytest
from conftest import make_bundle
from scripted_backend import ScriptedFactory

from eliza_backends import Factory
from eliza_backends.testing import BackendConformance


class TestScriptedBackend(BackendConformance):
    @pytest.fixture
    def factory(self) -> Factory:
        return ScriptedFactory()

    @pytest.fixture
    def bundle_dir(self, tmp_path: Path) -> Path:
        return make_bundle(tmp_path / "bundle", "model.scripted")
