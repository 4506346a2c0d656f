"""The kit's input area: bad token ids, call order, context overflow, use after close,
tokenization round trips and ``parse_special``.
"""

from __future__ import annotations

from typing import Any

import pytest

from ..backend.session import Session
from ..errors import ContextFullError, InvalidArgumentError, SessionClosedError
from .fixtures import KitFixtures
from .helpers import long_prompt


class InputChecks(KitFixtures):
    """Bad ids, call order, overflow, use after close, tokenization."""

    def test_bad_token_ids_are_refused(self, session: Session) -> None:
        bad_inputs: list[Any] = [[], [-1], [session.vocab_size], [1.5], ["a"], "text", None,
                                 [True]]
        for bad in bad_inputs:
            with pytest.raises(InvalidArgumentError):
                session.prefill(bad)
        assert session.n_past == 0

    def test_next_before_prefill(self, session: Session) -> None:
        with pytest.raises(InvalidArgumentError):
            session.next()
        with pytest.raises(InvalidArgumentError):
            session.next(0)

    def test_context_overflow(self, open_session: Any) -> None:
        with open_session(context_size=64, batch_size=16) as s:
            ids = long_prompt(s, s.context_size + 1, self.prompt_text)
            with pytest.raises(ContextFullError):
                s.prefill(ids)
            s.prefill(ids[:10])
            with pytest.raises(ContextFullError):
                s.prefill(ids[: s.context_size - 9])
            assert s.n_past == 10

    def test_use_after_close(self, open_session: Any, prompt: list[int]) -> None:
        s = open_session()
        s.prefill(prompt)
        s.close()
        s.close()
        for call in (lambda: s.prefill(prompt), s.next, s.reset, lambda: s.tokenize("x")):
            with pytest.raises(SessionClosedError):
                call()

    def test_tokenize_round_trip(self, session: Session) -> None:
        text = "Hello, world! 123"
        ids = session.tokenize(text, add_special=False)
        assert ids and all(0 <= t < session.vocab_size for t in ids)
        assert session.detokenize(ids) == text
        with_bos = session.tokenize(text, add_special=True)
        if session.bos_token_id is not None:
            assert with_bos[0] == session.bos_token_id

    def test_tokenize_parse_special_off_never_gives_control_tokens(self,
                                                                  session: Session) -> None:
        controls = sorted(session.model_info.control_texts)[:16]
        if not controls:
            pytest.skip("the model has no control-token texts")
        text = "a" + "a".join(controls)
        ids = session.tokenize(text, add_special=False, parse_special=False)
        singles = {tuple(session.tokenize(c, add_special=False)) for c in controls}
        assert not any((t,) in singles for t in ids)
        assert session.detokenize(ids) == text


__all__ = ["InputChecks"]
