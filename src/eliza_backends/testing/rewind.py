"""The kit's rewind area: ``reset()`` forgets, ``reset_keep()`` reuses a prefix (or resets
fully when it cannot), its bounds, and the prefill it needs afterwards.
"""

from __future__ import annotations

from typing import Any

import pytest

from ..backend.session import Session
from ..errors import InvalidArgumentError
from .fixtures import KitFixtures
from .helpers import generated_tokens, run_to_end


class RewindChecks(KitFixtures):
    """reset() forgets; reset_keep() reuses a prefix (or resets fully, if it cannot)."""

    def test_reset_forgets_everything(self, session: Session, prompt: list[int]) -> None:
        session.prefill(prompt)
        first = generated_tokens(run_to_end(session))
        session.reset()
        assert session.n_past == 0
        session.prefill(prompt)
        assert generated_tokens(run_to_end(session)) == first

    def test_reset_keep_reuses_prefix(self, open_session: Any, prompt: list[int]) -> None:
        head, tail = prompt[: len(prompt) // 2], prompt[len(prompt) // 2:]
        with open_session() as fresh:
            fresh.prefill(prompt)
            expected = generated_tokens(run_to_end(fresh))
        with open_session() as s:
            s.prefill(head)
            s.prefill([7 % s.vocab_size] * 3)
            run_to_end(s)
            kept = s.reset_keep(len(head))
            if s.capabilities.prefix_reuse:
                assert kept == len(head)
                assert s.history == tuple(head)
                s.prefill(tail)
            else:
                assert kept == 0
                assert s.n_past == 0
                s.prefill(prompt)
            assert generated_tokens(run_to_end(s)) == expected

    def test_reset_keep_bounds(self, session: Session, prompt: list[int]) -> None:
        session.prefill(prompt)
        assert session.reset_keep(10 * len(prompt)) in (len(prompt), 0)
        with pytest.raises(InvalidArgumentError):
            session.reset_keep(-1)
        assert session.reset_keep(0) == 0
        assert session.n_past == 0

    def test_next_after_reset_keep_needs_prefill(self, session: Session,
                                                 prompt: list[int]) -> None:
        session.prefill(prompt)
        session.reset_keep(len(prompt) - 1)
        with pytest.raises(InvalidArgumentError):
            session.next()


__all__ = ["RewindChecks"]
