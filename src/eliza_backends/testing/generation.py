"""The kit's generation area: prefill and steps, the budget, multi-token steps, greedy
determinism, UTF-8-safe text, stop strings, a full context.
"""

from __future__ import annotations

from typing import Any

import pytest

from ..backend.session import Session
from .fixtures import KitFixtures
from .helpers import generated_tokens, long_prompt, run_to_end


class GenerationChecks(KitFixtures):
    """Prefill, steps, budget, determinism, UTF-8-safe text, stop strings, a full context."""

    def test_prefill_next_until_final(self, session: Session, prompt: list[int]) -> None:
        session.prefill(prompt)
        assert session.n_past == len(prompt)
        steps = run_to_end(session)
        tokens = generated_tokens(steps)
        assert 1 <= len(tokens) <= session.config.max_tokens
        assert steps[-1].final and steps[-1].finish_reason in ("eos", "stop", "length", "context")
        assert all(not s.final for s in steps[:-1])
        assert all(0 <= t < session.vocab_size for t in tokens)
        again = session.next()
        assert again.final and again.tokens == ()

    def test_budget_ends_with_length(self, open_session: Any, prompt: list[int]) -> None:
        with open_session(max_tokens=5, ignore_eos=True) as s:
            s.prefill(prompt)
            steps = run_to_end(s)
            assert len(generated_tokens(steps)) == 5
            assert steps[-1].finish_reason == "length"

    def test_multi_token_steps_match_single_steps(self, open_session: Any,
                                                  prompt: list[int]) -> None:
        with open_session(ignore_eos=True, max_tokens=12) as one, \
                open_session(ignore_eos=True, max_tokens=12, tokens_per_step=5) as many:
            one.prefill(prompt)
            many.prefill(prompt)
            single = run_to_end(one)
            multi = run_to_end(many)
            assert generated_tokens(single) == generated_tokens(multi)
            assert max(len(s.tokens) for s in multi) > 1
            assert all(len(s.tokens) <= 5 for s in multi)
            assert "".join(s.text for s in single) == "".join(s.text for s in multi)

    def test_greedy_is_deterministic(self, open_session: Any, prompt: list[int]) -> None:
        outs = []
        for _ in range(2):
            with open_session() as s:
                s.prefill(prompt)
                outs.append(generated_tokens(run_to_end(s)))
        assert outs[0] == outs[1]

    def test_text_is_utf8_safe_and_matches_tokens(self, open_session: Any) -> None:
        with open_session(ignore_eos=True, max_tokens=32) as s:
            ids = s.tokenize("héllo wörld ✓ 日本語 🙂 ", add_special=True)
            s.prefill(ids)
            steps = run_to_end(s)
            text = "".join(st.text for st in steps)
            assert text == s.detokenize([t for t in generated_tokens(steps)
                                         if t not in s.eog_token_ids])
            for st in steps:
                st.text.encode("utf-8")  # never a lone surrogate

    def test_stop_string_ends_stream_and_is_not_emitted(self, open_session: Any,
                                                        prompt: list[int]) -> None:
        with open_session(ignore_eos=True, max_tokens=24) as s:
            s.prefill(prompt)
            full = s.detokenize(generated_tokens(run_to_end(s)))
        stop = next((full[i:i + 2] for i in range(len(full) // 3, len(full) - 1)
                     if full[i:i + 2].strip()), None)
        if stop is None:
            pytest.skip("greedy output has no usable stop string candidate")
        with open_session(ignore_eos=True, max_tokens=24, stop=(stop,)) as s:
            s.prefill(prompt)
            steps = run_to_end(s)
            text = "".join(st.text for st in steps)
            assert steps[-1].finish_reason == "stop"
            assert stop not in text
            assert text == full[: full.index(stop)]

    def test_context_end_finishes_stream(self, open_session: Any) -> None:
        with open_session(context_size=32, batch_size=16, max_tokens=100_000,
                          ignore_eos=True, tokens_per_step=16) as s:
            ids = long_prompt(s, s.context_size - 8, self.prompt_text)
            s.prefill(ids)
            steps = run_to_end(s)
            assert steps[-1].finish_reason == "context"
            assert s.n_past == s.context_size


__all__ = ["GenerationChecks"]
