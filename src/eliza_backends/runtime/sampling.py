"""A small numpy sampler built from :class:`~eliza_backends.config.StreamConfig`.

For backends whose runtime returns raw logits and has no sampler of its own (LiteRT's
interpreter, MLX sessions): greedy argmax, repeat penalty, top-k, top-p, min-p, temperature,
and a seeded :class:`numpy.random.Generator`. The chain follows llama.cpp's order: repeat
penalty, then (when sampling) top-k, top-p and min-p on the untempered distribution, then
temperature, then a draw.

numpy is imported at first use, so ``import eliza_backends`` stays cheap.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

from ..config import StreamConfig

if TYPE_CHECKING:
    import numpy as np


class Sampler:
    """Picks the next token id from one row of logits. One per session; not thread-safe.

    :meth:`reset` re-seeds the generator (a reset session samples the same sequence again).
    """

    def __init__(self, config: StreamConfig) -> None:
        self.config = config
        self.greedy = config.greedy
        self._rng: Any = None

    def reset(self) -> None:
        """Forget the random state: the next draw starts from ``config.seed`` again."""
        self._rng = None

    def _generator(self) -> np.random.Generator:
        if self._rng is None:
            import numpy as np

            self._rng = np.random.default_rng(self.config.seed)
        rng: np.random.Generator = self._rng
        return rng

    def penalize(self, logits: np.ndarray, history: Sequence[int], *,
                 in_place: bool = False) -> np.ndarray:
        """Apply the repeat penalty over the last ``repeat_last_n`` ids of ``history``: a
        copy (``logits`` left as it was), or ``logits`` itself changed (``in_place``, a
        float32 row). Positive logits are divided by the penalty, negative ones multiplied,
        as llama.cpp does.

        The one definition of the penalty window on every backend and path (drafted rounds
        included): ``history`` is the session's whole sequence so far, prompt and generated
        tokens alike (llama.cpp's ``penalty_last_n`` as llama-server applies it: it feeds the
        prompt to its sampler too)."""
        import numpy as np

        cfg = self.config
        if cfg.repeat_penalty == 1.0 or cfg.repeat_last_n == 0 or not history:
            return logits
        recent = np.unique(np.asarray(history[-cfg.repeat_last_n:], dtype=np.int64))
        recent = recent[(recent >= 0) & (recent < logits.shape[-1])]
        out = logits if in_place else np.array(logits, dtype=np.float32, copy=True)
        vals = out[recent]
        out[recent] = np.where(vals > 0, vals / cfg.repeat_penalty, vals * cfg.repeat_penalty)
        return out

    def sample(self, logits: np.ndarray, history: Sequence[int] = ()) -> int:
        """The next token id from a 1-D row of logits, given the sequence so far."""
        import numpy as np

        row = self.penalize(np.asarray(logits, dtype=np.float32).reshape(-1), history)
        if self.greedy:
            return int(np.argmax(row))
        ids, probs = self._truncated(row)
        return self.choose(ids, probs)

    def distribution(self, logits: np.ndarray, history: Sequence[int] = ()
                     ) -> tuple[np.ndarray, np.ndarray]:
        """The distribution :meth:`sample` draws from, as (token ids, probabilities) over the
        tokens that survive top-k/top-p/min-p (for speculative acceptance)."""
        import numpy as np

        row = self.penalize(np.asarray(logits, dtype=np.float32).reshape(-1), history)
        if self.greedy:
            return np.array([int(np.argmax(row))]), np.array([1.0])
        return self._truncated(row)

    def uniform(self) -> float:
        """One draw from U[0, 1) on this sampler's generator."""
        return float(self._generator().random())

    def choose(self, ids: np.ndarray, probs: np.ndarray) -> int:
        """Draw one id from a (token ids, probabilities) pair: one uniform draw against the
        cumulative distribution (what ``Generator.choice(p=...)`` does, without its O(n)
        checks of ``p``, which cost more than the draw on a 262k vocabulary)."""
        cdf = probs.cumsum()
        i = int(cdf.searchsorted(self._generator().random() * cdf[-1], side="right"))
        return int(ids[min(i, ids.shape[0] - 1)])

    def _truncated(self, row: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """The tempered distribution over the tokens top-k, top-p and min-p keep. Nothing sorts
        the whole vocabulary (a full sort of Gemma 3's 262,144 logits costs ~20 ms, more than a
        token's forward pass): top-k partitions, min-p filters, top-p sorts only the head that
        holds its mass."""
        import numpy as np

        cfg = self.config
        vals = row  # float32; exponentials of (logit - max) <= 0 are exact enough in float32
        ids: np.ndarray | None = None
        if 0 < cfg.top_k < vals.shape[0]:
            ids = np.argpartition(-vals, cfg.top_k - 1)[:cfg.top_k]
            vals = vals[ids]
        if cfg.top_p < 1.0 or cfg.min_p > 0.0:
            keep = self._nucleus(_normalized(np.exp(vals - vals.max())))
            ids = keep if ids is None else ids[keep]
            vals = vals[keep]
        scaled = vals - vals.max()
        scaled /= np.float32(cfg.temperature)
        probs = _normalized(np.exp(scaled, out=scaled))
        return (np.arange(vals.shape[0]) if ids is None else ids), probs

    def _nucleus(self, probs: np.ndarray) -> np.ndarray:
        """Indexes into ``probs`` that top-p and min-p keep: the most likely tokens until their
        mass reaches ``top_p`` (inclusive), those of them at least ``min_p`` times the most
        likely one's probability (always at least one token)."""
        import numpy as np

        cfg = self.config
        floor = cfg.min_p * probs.max()
        if cfg.top_p >= 1.0:
            return np.flatnonzero(probs >= floor)
        n, m = probs.shape[0], 64
        while True:
            if m >= n:
                head = np.argsort(-probs, kind="stable")
            else:
                head = np.argpartition(-probs, m - 1)[:m]
                head = head[np.argsort(-probs[head], kind="stable")]
            mass = np.cumsum(probs[head])
            if m >= n or mass[-1] >= cfg.top_p:
                break
            m *= 8
        keep = min(head.shape[0], int(np.searchsorted(mass, cfg.top_p)) + 1)
        if cfg.min_p > 0.0:
            keep = min(keep, max(1, int(np.count_nonzero(probs[head[:keep]] >= floor))))
        return head[:keep]


def _normalized(weights: np.ndarray) -> np.ndarray:
    """``weights`` (non-negative, any float dtype) as float64 probabilities summing to one."""
    import numpy as np

    probs = weights.astype(np.float64)
    probs /= probs.sum()
    return probs


__all__ = ["Sampler"]
