"""How many tokens to draft per speculative round, or whether to draft at all, from this host's
verify cost and the acceptance seen so far.

A round with ``k`` drafts costs one forward pass over ``k + 1`` tokens, ``cost(k + 1)`` in units
of a one-token decode (the *batch cost curve*, measured once per loaded model by the backend:
:meth:`eliza_backends.Session._batch_cost`), plus the drafting, and produces ``1 + accepted``
tokens. With a per-position acceptance rate ``a`` (a draft is accepted with probability ``a``
when the one before it was), the expected yield is ``(1 - a**(k + 1)) / (1 - a)``, so the
speed-up over plain decoding is ``yield(k) / (cost(k + 1) + k * draft_cost)``
(:func:`speedup_bound`). On a CPU, where small models are compute-bound, ``cost`` grows fast
(SmolLM2 here: a 5-token batch costs ~3x a 1-token one) and only high acceptance pays. The
curve need not grow with ``n``: quantized matmuls that take rows in groups make some longer
batches cheaper than shorter ones (Gemma 3 270M Q4_K_M at 1 thread: 4 tokens 3.1x one, 3 tokens
4.3x), and the policy then drafts the longer length, which yields more for less.

:class:`DraftPolicy` picks the ``k`` in ``0..max_k`` with the best expected speed-up; ``k = 0``
is plain decoding (the round is a one-token forward pass, the drafter is not run). The rate is
learnt from the rounds (exponentially decayed counts of accepted and rejected draft positions,
starting from a prior of ``prior`` accepted in ``prior_weight`` positions), and so is the curve:
it starts from the backend's measurement and follows the verify rounds' own times (an
exponential average per batch size), because a one-off measurement on a shared machine can be
off by a third either way and a round pays for sampling and cache bookkeeping too. While drafting is
off, a drafter that costs nothing to ask (the n-gram one) still proposes one token per round and
is scored against the token the round produced, so drafting resumes when the text starts to
repeat; any other drafter gets a real one-draft round every ``probe_every`` rounds.

Used by :func:`eliza_backends.runtime.speculative.speculate`; one policy per session, on its
consumer thread.
"""

from __future__ import annotations

from collections.abc import Sequence


def expected_yield(acceptance: float, k: int) -> float:
    """Tokens a round with ``k`` drafts produces on average at per-position ``acceptance``."""
    a = min(max(acceptance, 0.0), 1.0)
    if a >= 1.0:
        return float(k + 1)
    return (1.0 - a ** (k + 1)) / (1.0 - a)


def speedup_bound(acceptance: float, k: int, cost: Sequence[float],
                  draft_cost: float = 0.0) -> float:
    """The speed-up over plain decoding of rounds with ``k`` drafts: expected yield over the
    round's cost. ``cost[n - 1]``: a forward pass over ``n`` tokens relative to one token;
    ``draft_cost``: drafting one token, in the same unit."""
    return expected_yield(acceptance, k) / (cost[k] + k * draft_cost)


class DraftPolicy:
    """The draft length for the next round (see the module docstring).

    ``cost_s``: seconds of one forward pass over ``n`` tokens at index ``n - 1``, for ``n`` in
    ``1..max_k + 1`` (shorter: ``max_k`` is cut to fit). ``cheap_drafter``: proposals cost
    nothing (shadow-score them while drafting is off)."""

    def __init__(self, cost_s: Sequence[float], max_k: int, *, cheap_drafter: bool,
                 prior: float = 0.5, prior_weight: float = 4.0, decay: float = 0.97,
                 probe_every: int = 16) -> None:
        if not cost_s or cost_s[0] <= 0:
            raise ValueError("cost_s needs a positive one-token cost")
        self._cost_s = list(cost_s)
        self.cost: list[float] = []  # the curve now, relative to one token
        self._rescale()
        self.measured_cost = list(self.cost)  #: the curve the backend measured
        self.max_k = max(0, min(max_k, len(self.cost) - 1))
        self.cheap_drafter = cheap_drafter
        self.probe_every = probe_every
        self._decay = decay
        self._ok = prior * prior_weight  # decayed accepted positions
        self._seen = prior_weight  # decayed scored positions
        self._draft_s = 0.0  # EMA of seconds per drafted token
        self._off_rounds = 0
        self.k = self._best()

    @property
    def acceptance(self) -> float:
        """The current per-position acceptance estimate."""
        return self._ok / self._seen

    @property
    def draft_cost(self) -> float:
        """Drafting one token, in one-token decodes (measured)."""
        return self._draft_s / self._cost_s[0]

    def _rescale(self) -> None:
        one = self._cost_s[0]
        self.cost = [max(c / one, 1.0) for c in self._cost_s]  # never less than one token

    def _best(self) -> int:
        a, dc = self.acceptance, self.draft_cost
        best_k, best = 0, 1.0
        for k in range(1, self.max_k + 1):
            gain = speedup_bound(a, k, self.cost, dc)
            if gain > best * 1.02:  # a longer draft must clearly pay: its cost is certain
                best_k, best = k, gain
        return best_k

    def next_length(self) -> int:
        """Drafts to ask for this round (0: decode plainly)."""
        if self.k == 0 and not self.cheap_drafter:
            self._off_rounds += 1
            if self._off_rounds >= self.probe_every:
                self._off_rounds = 0
                return 1
        return self.k

    def shadow(self) -> bool:
        """Whether to ask the drafter for a one-token proposal to score, this round not
        drafting (cheap drafters only)."""
        return self.k == 0 and self.cheap_drafter

    def observe(self, drafted: int, accepted: int) -> None:
        """A round verified ``drafted`` drafts (>0) and accepted the first ``accepted``;
        positions past the first rejection were not scored."""
        if drafted <= 0:
            return
        scored = accepted + (1 if accepted < drafted else 0)
        keep = self._decay ** scored
        self._ok = self._ok * keep + accepted
        self._seen = self._seen * keep + scored
        self.k = self._best()

    def observe_round(self, n: int, seconds: float) -> None:
        """A verify round over ``n`` tokens (1: a plain one) took ``seconds``."""
        if 1 <= n <= len(self._cost_s) and seconds > 0:
            self._cost_s[n - 1] += 0.25 * (seconds - self._cost_s[n - 1])
            self._rescale()
            self.k = self._best()

    def observe_drafting(self, seconds: float, drafted: int) -> None:
        """Proposing ``drafted`` tokens took ``seconds``."""
        if drafted > 0:
            per = seconds / drafted
            self._draft_s = per if self._draft_s == 0.0 else 0.8 * self._draft_s + 0.2 * per


__all__ = ["DraftPolicy", "expected_yield", "speedup_bound"]
