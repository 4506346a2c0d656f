"""The kit's factory area: the factory describes itself; sessions declare honest
capabilities (``ignore_eos`` honoured or refused at open).
"""

from __future__ import annotations

from pathlib import Path

import pytest

from ..backend.context import InferenceContext
from ..backend.factory import Factory
from ..backend.session import Session
from ..backend.types import Capabilities
from ..config import StreamConfig
from ..errors import UnsupportedOperationError
from .fixtures import KitFixtures


class FactoryChecks(KitFixtures):
    """The factory describes itself and the session declares honest capabilities."""

    def test_factory_describes_itself(self, factory: Factory, bundle_dir: Path,
                                      tmp_path: Path) -> None:
        assert isinstance(factory.name, str) and factory.name
        assert all(isinstance(a, str) and a for a in factory.aliases)
        assert all(isinstance(n, str) and n for n in factory.native_loggers)
        avail = factory.available()
        assert avail, f"backend must be available to run the kit: {avail.reason}"
        assert isinstance(factory.preference_rank(), int)
        assert factory.can_serve(bundle_dir)
        assert not factory.can_serve(tmp_path)
        assert not factory.can_serve(tmp_path / "missing")

    def test_capabilities_are_declared(self, session: Session) -> None:
        caps = session.capabilities
        assert isinstance(caps, Capabilities)
        assert "none" in caps.drafters
        assert session.vocab_size > 0
        assert session.context_size >= 16
        assert all(0 <= t < session.vocab_size for t in session.eog_token_ids)

    def test_ignore_eos_is_honoured_or_refused(self, factory: Factory,
                                               context: InferenceContext) -> None:
        """A session either honours ``ignore_eos`` or refuses it at open: never accepts and
        ignores it."""
        with context.opening():
            plain = factory.open(context, StreamConfig.build(self.base_config))
        with plain:
            honours = plain.capabilities.ignore_eos
        cfg = StreamConfig.build({**self.base_config, "ignore_eos": True})
        if honours:
            try:
                with context.opening():
                    factory.open(context, cfg).close()
            except UnsupportedOperationError as exc:
                pytest.fail(f"open() refused ignore_eos=True ({exc}) but "
                            "capabilities.ignore_eos is True")
        else:
            with pytest.raises(UnsupportedOperationError), context.opening():
                factory.open(context, cfg).close()


__all__ = ["FactoryChecks"]
