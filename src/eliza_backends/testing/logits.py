"""The kit's logits area (``capabilities.logits``): constrained output follows its
constraint, in multi-token steps too; logprobs are consistent; without the hook, constraints
and logprobs are refused, never ignored.
"""

from __future__ import annotations

from typing import Any, ClassVar

import pytest

from ..backend.session import Session
from ..errors import UnsupportedOperationError
from ..structured.constraint import Constraint
from .fixtures import KitFixtures
from .helpers import generated_tokens, run_to_end


class LogitsChecks(KitFixtures):
    """The logits hook (``capabilities.logits``): constrained output follows its constraint,
    the same in multi-token steps, and logprobs are consistent; without it, constraints and
    logprobs are refused, never ignored."""

    #: The JSON schema the kit constrains to (small, so any model finishes it in the budget).
    kit_schema: ClassVar[dict[str, Any]] = {
        "type": "object", "properties": {"ok": {"type": "boolean"},
                                         "n": {"type": "integer", "minimum": 0, "maximum": 99}},
        "required": ["ok", "n"], "additionalProperties": False}

    def _needs_logits(self, session: Session) -> None:
        if not session.capabilities.logits:
            pytest.skip("capabilities.logits is False (no constraints, no logprobs)")
        pytest.importorskip("llguidance", reason="constraints need eliza-backends[structured]")

    def test_without_logits_constraints_are_refused(self, session: Session) -> None:
        if session.capabilities.logits:
            pytest.skip("capabilities.logits is True")
        from ..structured.logits import OutputSpec

        with pytest.raises(UnsupportedOperationError):
            session.set_output(OutputSpec(Constraint.regex("[a-z]+")))
        with pytest.raises(UnsupportedOperationError):
            session.set_output(OutputSpec(logprobs=True))

    def test_json_schema_output_is_valid(self, open_session: Any, prompt: list[int]) -> None:
        import json

        with open_session(max_tokens=48) as probe:
            self._needs_logits(probe)
        with open_session(json_schema=self.kit_schema, max_tokens=48) as s:
            s.prefill(prompt)
            steps = run_to_end(s)
            assert steps[-1].finish_reason == "eos", "the constraint ends the text"
            data = json.loads("".join(st.text for st in steps))
            assert set(data) == {"ok", "n"} and isinstance(data["ok"], bool)
            assert isinstance(data["n"], int) and 0 <= data["n"] <= 99

    def test_regex_output_matches_in_multi_token_steps(self, open_session: Any,
                                                       prompt: list[int]) -> None:
        import re

        pattern = r"[a-z]{2,6}( [a-z]{2,6}){1,3}\."
        with open_session(max_tokens=48) as probe:
            self._needs_logits(probe)
        texts, ids = [], []
        for per_step in (1, 4):
            with open_session(regex=pattern, max_tokens=48, tokens_per_step=per_step) as s:
                s.prefill(prompt)
                steps = run_to_end(s)
                texts.append("".join(st.text for st in steps))
                ids.append(generated_tokens(steps))
        assert re.fullmatch(pattern, texts[0]), texts[0]
        assert ids[0] == ids[1] and texts[0] == texts[1]

    def test_constraint_restarts_at_each_prefill(self, open_session: Any,
                                                 prompt: list[int]) -> None:
        with open_session(max_tokens=48) as probe:
            self._needs_logits(probe)
        with open_session(regex=r"[0-9]{3}", max_tokens=48) as s:
            for _ in range(2):
                s.prefill(prompt)
                text = "".join(st.text for st in run_to_end(s))
                assert len(text) == 3 and text.isdigit(), text

    def test_logprobs_are_consistent(self, open_session: Any, prompt: list[int]) -> None:
        with open_session(max_tokens=8) as probe:
            self._needs_logits(probe)
        with open_session(top_logprobs=3, max_tokens=8, ignore_eos=True) as s:
            s.prefill(prompt)
            steps = run_to_end(s)
            for step in steps:
                assert step.logprobs is not None and len(step.logprobs) == len(step.tokens)
                for tok, lp in zip(step.tokens, step.logprobs, strict=True):
                    assert lp.token == tok and lp.logprob <= 1e-6 and len(lp.top) == 3
                    assert [t.logprob for t in lp.top] == sorted(
                        (t.logprob for t in lp.top), reverse=True)
                    # greedy: the chosen token is the most likely one
                    assert lp.top[0].token == tok and abs(lp.top[0].logprob - lp.logprob) < 1e-9
        with open_session(max_tokens=4) as plain:
            plain.prefill(prompt)
            assert all(st.logprobs is None for st in run_to_end(plain))

    def test_set_output_per_turn(self, open_session: Any, prompt: list[int]) -> None:
        from ..structured.logits import OutputSpec

        with open_session(max_tokens=48) as s:
            self._needs_logits(s)
            s.set_output(OutputSpec(Constraint.regex("(yes|no)"), logprobs=True))
            s.prefill(prompt)
            steps = run_to_end(s)
            assert "".join(st.text for st in steps) in ("yes", "no")
            assert steps[0].logprobs is not None
            s.set_output(None)  # back to the config's: nothing
            s.reset()
            s.prefill(prompt)
            assert all(st.logprobs is None for st in run_to_end(s))

    def test_constraint_with_a_drafter_is_refused(self, open_session: Any) -> None:
        with open_session() as probe:
            self._needs_logits(probe)
            drafters = sorted(probe.capabilities.drafters - {"none"})
        if not drafters:
            pytest.skip("no drafter to combine with")
        from ..stream import check_capabilities

        with open_session(drafter=drafters[0], regex="[a-z]+") as s, \
                pytest.raises(UnsupportedOperationError):
            check_capabilities(s, s.config, "kit")


__all__ = ["LogitsChecks"]
