"""The fixtures of the kit (:class:`KitFixtures`): a plugin provides ``factory`` and
``bundle_dir``; every check opens its own sessions on one shared context and closes them.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any, ClassVar

import pytest

from ..backend.context import InferenceContext
from ..backend.factory import Factory
from ..backend.session import Session
from ..config import StreamConfig
from ..errors import UnsupportedOperationError


class KitFixtures:
    """The fixtures every check uses. Provide ``factory`` and ``bundle_dir``; every test opens
    its own sessions on one shared context and closes them."""

    #: StreamConfig fields every session of the kit uses (override per backend if needed).
    base_config: ClassVar[dict[str, Any]] = {
        "context_size": 512, "batch_size": 64, "max_tokens": 24, "threads": 1,
    }
    #: Text the kit tokenizes to make prompts.
    prompt_text: str = "The quick brown fox jumps over the lazy dog. "

    # ------------------------------------------------------------------ fixtures

    @pytest.fixture
    def factory(self) -> Factory:
        raise NotImplementedError("provide a `factory` fixture returning your Factory")

    @pytest.fixture
    def bundle_dir(self) -> Path:
        raise NotImplementedError("provide a `bundle_dir` fixture: a bundle your backend serves")

    @pytest.fixture
    def context(self, bundle_dir: Path) -> Iterator[InferenceContext]:
        ctx = InferenceContext(bundle_dir)
        yield ctx
        ctx.close()

    @pytest.fixture
    def open_session(self, factory: Factory, context: InferenceContext) -> Any:
        """``open_session(**config_overrides) -> Session`` on the shared context."""

        def _open(**overrides: Any) -> Session:
            cfg = StreamConfig.build({**self.base_config, **overrides})
            try:
                with context.opening():
                    session = factory.open(context, cfg)
            except UnsupportedOperationError:
                if not cfg.ignore_eos:
                    raise
                # a runtime that ends at its stop tokens itself refuses ignore_eos (and must
                # declare it): the checks asking for a long run get the longest it gives
                cfg = StreamConfig.build({**self.base_config, **overrides, "ignore_eos": False})
                with context.opening():
                    session = factory.open(context, cfg)
                assert not session.capabilities.ignore_eos, (
                    "open() refused ignore_eos=True but capabilities.ignore_eos is True")
            assert isinstance(session, Session), f"open() returned {session!r}"
            return session

        return _open

    @pytest.fixture
    def session(self, open_session: Any) -> Iterator[Session]:
        s = open_session()
        yield s
        s.close()

    @pytest.fixture
    def prompt(self, session: Session) -> list[int]:
        return session.tokenize(self.prompt_text, add_special=True)


__all__ = ["KitFixtures"]
