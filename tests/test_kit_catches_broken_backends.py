"""The conformance kit fails the backends it is meant to catch (issue 15.14).

Each check runs here, exactly as a plugin's test suite runs it, on a deliberately broken copy
of the scripted backend: the check must fail for it (and pass for the honest scripted backend,
which tests/test_conformance_scripted.py runs through the whole kit).
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from conftest import make_bundle
from scripted_backend import ScriptedFactory, ScriptedSession

from eliza_backends import (
    Capabilities,
    Decoded,
    InferenceContext,
    Session,
    StreamConfig,
    UnsupportedOperationError,
)
from eliza_backends.testing import BackendConformance


class IgnoresCancel(ScriptedSession):
    """Never looks at the cancel flag inside a call (the base class still refuses the next
    call, which is why a check that accepts "finished" lets this pass)."""

    def _prefill(self, token_ids: list[int]) -> None:
        import time

        for off in range(0, len(token_ids), self.config.batch_size):
            time.sleep(self._chunk_seconds)
            self._kv.extend(token_ids[off:off + self.config.batch_size])

    def _decode(self, max_tokens: int) -> Decoded:
        import time

        out = []
        for _ in range(max_tokens):
            tok = self._sample()
            self._kv.append(tok)
            out.append(tok)
            time.sleep(0.0002)
        return Decoded(out)


class SaysItHonoursIgnoreEos(ScriptedSession):
    """Declares ``ignore_eos=False`` yet accepts ``ignore_eos=True`` at open."""

    @property
    def capabilities(self) -> Capabilities:
        return Capabilities(slots=True, ignore_eos=False)


class BrokenFactory(ScriptedFactory):
    def __init__(self, session: type[ScriptedSession]) -> None:
        super().__init__()
        self._session = session

    def open(self, context: InferenceContext, config: StreamConfig) -> Session:
        return self._session(config, context)


@pytest.fixture
def context(tmp_path: Path) -> Iterator[InferenceContext]:
    with InferenceContext(make_bundle(tmp_path / "bundle", "model.scripted")) as ctx:
        yield ctx


def _kit_open(factory: ScriptedFactory, context: InferenceContext) -> Any:
    """The kit's ``open_session`` fixture, as a plain function."""

    def _open(**overrides: Any) -> Session:
        cfg = StreamConfig.build({**BackendConformance.base_config, **overrides})
        with context.opening():
            return factory.open(context, cfg)

    return _open


def _prompt(open_session: Any) -> list[int]:
    with open_session() as s:
        ids: list[int] = s.tokenize(BackendConformance.prompt_text)
        return ids


@pytest.mark.parametrize("check", ["test_cancel_during_prefill", "test_cancel_during_decode"])
def test_cancel_checks_fail_a_session_that_ignores_cancel(
        context: InferenceContext, check: str) -> None:
    kit = BackendConformance()
    honest = _kit_open(ScriptedFactory(), context)
    broken = _kit_open(BrokenFactory(IgnoresCancel), context)
    args = () if check == "test_cancel_during_prefill" else (_prompt(honest),)
    getattr(kit, check)(honest, *args)  # the honest backend passes
    with pytest.raises(AssertionError, match="does not check _raise_if_cancelled"):
        getattr(kit, check)(broken, *args)


def test_ignore_eos_check_fails_a_session_that_accepts_and_ignores_it(
        context: InferenceContext) -> None:
    kit = BackendConformance()
    kit.test_ignore_eos_is_honoured_or_refused(ScriptedFactory(), context)
    with pytest.raises(pytest.fail.Exception, match="DID NOT RAISE"):
        kit.test_ignore_eos_is_honoured_or_refused(BrokenFactory(SaysItHonoursIgnoreEos),
                                                   context)


def test_ignore_eos_check_fails_an_undeclared_refusal(
        context: InferenceContext) -> None:
    """A backend refusing ignore_eos must declare it: the kit's long-run fallback checks."""

    class RefusesUndeclared(ScriptedFactory):
        def open(self, context: InferenceContext, config: StreamConfig) -> Session:
            if config.ignore_eos:
                raise UnsupportedOperationError("no ignore_eos here")
            return ScriptedSession(config, context)

    kit = BackendConformance()
    with pytest.raises(pytest.fail.Exception, match=r"capabilities\.ignore_eos is True"):
        kit.test_ignore_eos_is_honoured_or_refused(RefusesUndeclared(), context)
