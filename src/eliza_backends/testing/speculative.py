"""The kit's speculative area: every drafter the session offers keeps greedy output
identical, through rewinds too, with honest drafted / accepted counts.
"""

from __future__ import annotations

from typing import Any

import pytest

from ..errors import BundleError
from .fixtures import KitFixtures
from .helpers import generated_tokens, run_to_end


class SpeculativeChecks(KitFixtures):
    """Every drafter keeps greedy output identical, through rewinds too, with honest counts."""

    def _drafters(self, open_session: Any) -> list[str]:
        with open_session() as probe:
            drafters = sorted(probe.capabilities.drafters - {"none"})
        if not drafters:
            pytest.skip("capabilities.drafters offers no speculative drafter")
        return drafters

    def test_drafters_keep_greedy_output(self, open_session: Any, prompt: list[int]) -> None:
        drafters = self._drafters(open_session)
        repeat = prompt + prompt[1:] + prompt[1:]  # something for prompt lookup to find
        with open_session(ignore_eos=True, max_tokens=24) as plain:
            plain.prefill(repeat)
            expected = generated_tokens(run_to_end(plain))
        for kind in drafters:
            try:
                s = open_session(ignore_eos=True, max_tokens=24, drafter=kind, draft_length=4,
                                 draft_policy="fixed")  # the rounds themselves
            except BundleError as exc:
                assert kind in ("model", "mtp"), exc
                continue  # no draft artifact in this bundle: nothing to check for this kind
            with s:
                s.prefill(repeat)
                steps = run_to_end(s)
                assert generated_tokens(steps) == expected, kind
                for st in steps:
                    assert 0 <= st.accepted <= st.drafted
                assert sum(st.drafted for st in steps) > 0, kind

    def test_drafters_follow_rewinds(self, open_session: Any, prompt: list[int]) -> None:
        repeat = prompt + prompt[1:]
        with open_session(ignore_eos=True, max_tokens=12) as plain:
            plain.prefill(repeat)
            expected = generated_tokens(run_to_end(plain))
        for kind in self._drafters(open_session):
            try:
                s = open_session(ignore_eos=True, max_tokens=12, drafter=kind, draft_length=3,
                                 draft_policy="fixed")
            except BundleError as exc:
                assert kind in ("model", "mtp"), exc
                continue
            with s:
                s.prefill(repeat)
                run_to_end(s)
                kept = s.reset_keep(len(repeat) - 2)
                s.prefill(repeat[kept:])
                assert generated_tokens(run_to_end(s)) == expected, kind
                s.reset()
                s.prefill(repeat)
                assert generated_tokens(run_to_end(s)) == expected, kind


__all__ = ["SpeculativeChecks"]
