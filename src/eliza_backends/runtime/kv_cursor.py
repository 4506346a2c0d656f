"""The lazy-by-one bookkeeping of a KV cache that a backend appends to position by position.

A backend that decodes lazily feeds the last sampled token to the model at the start of the
next step (a step of n tokens costs n samples and n forward passes, and the first token after a
prefill is sampled straight from the prefill's logits). Between calls the KV cache therefore
holds ``history[:n_kv]`` and the rest of the history, ``pending``, waits to be fed: usually the
one token sampled last, after a rewind or a slot restore possibly more, after a prefill none.
:class:`KVCursor` keeps those two numbers right across prefill, decode, rewind and restore, so
the llama.cpp and LiteRT sessions share one rule, and :meth:`KVCursor.decode` is the one
decode loop under it: the session supplies the feed (a forward pass) and the sampler.

Invariant: ``history[:n_kv] + pending == history`` whenever no call is running.
"""

from __future__ import annotations

from collections.abc import Callable, Container, Sequence
from dataclasses import dataclass, field


@dataclass(slots=True)
class KVCursor:
    """``n_kv``: positions the KV cache holds (``history[:n_kv]``). ``pending``: the history
    tokens after them, not fed yet. Owned by one session, used on its consumer thread."""

    n_kv: int = 0
    pending: list[int] = field(default_factory=list)

    def decode(self, max_tokens: int, feed: Callable[[], None],
               sample: Callable[[list[int]], int], stops: Container[int],
               check_cancel: Callable[[], None]) -> list[int]:
        """Up to ``max_tokens`` tokens, lazily: before each sample the pending tokens are fed
        (``feed()`` runs the forward pass over ``pending`` at ``n_kv`` and moves the cursor past
        them, leaving the last one's logits), after it the sampled token becomes the pending
        one. ``sample(out)`` draws from the current logits (``out``: this step's tokens so far);
        the loop ends after a token in ``stops``. ``check_cancel()`` runs before each feed."""
        out: list[int] = []
        for _ in range(max_tokens):
            if self.pending:
                check_cancel()
                feed()
            tok = sample(out)
            out.append(tok)
            self.pending = [tok]
            if tok in stops:
                break
        return out

    def reset(self) -> None:
        """The cache was cleared."""
        self.n_kv = 0
        self.pending = []

    def truncate(self, history: Sequence[int], n_keep: int) -> bool:
        """The sequence is cut to ``history[:n_keep]``. Returns True when the cache holds
        positions ``>= n_keep`` that the runtime must drop (the cursor already counts them
        gone); when it holds fewer, the missing history tokens become pending."""
        if n_keep >= self.n_kv:
            self.pending = list(history[self.n_kv:n_keep])
            return False
        self.n_kv = n_keep
        self.pending = []
        return True

    def restore(self, tokens: Sequence[int], n_kv: int) -> bool:
        """A saved cache of ``n_kv`` positions for the sequence ``tokens`` was loaded.

        Slots do not save logits, so when the cache holds the whole sequence its last token is
        fed again: returns True when the runtime must drop position ``n_kv - 1`` for that
        (the cursor then counts ``n_kv - 1`` positions and the last token pending)."""
        self.n_kv = n_kv
        self.pending = list(tokens[n_kv:])
        if self.pending:
            return False
        self.n_kv = n_kv - 1
        self.pending = [tokens[-1]]
        return True


__all__ = ["KVCursor"]
