"""The kit's sampling area: a seed makes sampling reproducible (when the session samples).
"""

from __future__ import annotations

from typing import Any

import pytest

from .fixtures import KitFixtures
from .helpers import generated_tokens, run_to_end


class SamplingChecks(KitFixtures):
    """A seed makes sampling reproducible (if the session samples at all)."""

    def test_sampling_is_seeded(self, open_session: Any, prompt: list[int]) -> None:
        with open_session() as probe:
            if not probe.capabilities.sampling:
                pytest.skip("capabilities.sampling is False (greedy only)")
        outs = []
        for seed in (7, 7):
            with open_session(temperature=1.0, seed=seed, ignore_eos=True) as s:
                s.prefill(prompt)
                outs.append(generated_tokens(run_to_end(s)))
        assert outs[0] == outs[1]


__all__ = ["SamplingChecks"]
