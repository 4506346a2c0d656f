"""A session's speculative decoding: its drafter, its draft policy and the step size.

The session owns one :class:`Speculation`. It holds the drafter (from
:meth:`~eliza_backends.backend.factory.Factory.make_drafter`; rewound with the sequence and
closed with the session), the :class:`~eliza_backends.runtime.draft_policy.DraftPolicy` made
on first use from the backend's batch cost curve, and what a default step is: with a drafter
and ``tokens_per_step`` 1, a round's worth (``draft_length + 1`` tokens) made of whole rounds
(a default step ends early rather than cut a round's drafts to fit).

Used on the session's consumer thread, with its lock held.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

from ..config import StreamConfig
from ..errors import UnsupportedOperationError
from ..runtime.draft_policy import DraftPolicy
from ..runtime.speculative import Drafter, NgramDrafter, Verify, speculate
from .types import Decoded


class Speculation:
    """The drafter, the draft policy and the default step of one session."""

    def __init__(self, config: StreamConfig, drafter: Drafter | None) -> None:
        self.config = config
        self.drafter = drafter
        self.policy: DraftPolicy | None = None
        self._policy_made = False
        self.steps = config.drafter != "none" and config.tokens_per_step == 1
        #: tokens a ``next()`` without a count asks for
        self.default_step = config.draft_length + 1 if self.steps else config.tokens_per_step
        #: this step is a default speculative one (set by the session as a step starts)
        self.whole_rounds = False

    def run(self, sequence: Sequence[int], max_tokens: int, verify: Verify, *,
            draft_length: int | None, after: Sequence[int],
            ends_generation: Callable[[int], bool], raise_if_cancelled: Callable[[], None],
            batch_cost: Callable[[int], list[float] | None]) -> Decoded:
        """Speculative rounds (:func:`~eliza_backends.runtime.speculative.speculate`) after
        ``sequence`` until ``max_tokens`` tokens or an end token. ``batch_cost(n)``: the
        backend's cost curve up to ``n`` tokens (for the policy, asked once)."""
        drafter = self.drafter
        if drafter is None:
            raise UnsupportedOperationError("_speculate() needs a drafter")
        k = self.config.draft_length if draft_length is None else draft_length
        if not self._policy_made:
            self._policy_made = True
            self.policy = self._make_policy(drafter, k, batch_cost)
        tokens, drafted, accepted = speculate(
            drafter, [*sequence, *after], max_tokens - len(after), k, verify,
            ends_generation, raise_if_cancelled, self.policy, whole_rounds=self.whole_rounds)
        return Decoded([*after, *tokens], drafted, accepted)

    def _make_policy(self, drafter: Drafter, k: int,
                     batch_cost: Callable[[int], list[float] | None]) -> DraftPolicy | None:
        """The policy for ``config.draft_policy="auto"``, on the batch cost curve."""
        if self.config.draft_policy != "auto":
            return None
        cost = batch_cost(k + 1)
        if not cost:
            return None
        return DraftPolicy(cost, k, cheap_drafter=isinstance(drafter, NgramDrafter))

    def truncate(self, n: int) -> None:
        """The sequence was cut to ``n`` tokens: the drafter forgets the rest."""
        if self.drafter is not None:
            self.drafter.truncate(n)

    def close(self) -> None:
        """Close the drafter (once)."""
        drafter, self.drafter = self.drafter, None
        if drafter is not None:
            drafter.close()


__all__ = ["Speculation"]
