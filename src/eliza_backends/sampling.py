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

from .config import StreamConfig

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

    def penalize(self, logits: np.ndarray, history: Sequence[int]) -> np.ndarray:
        """Apply the repeat penalty over the last ``repeat_last_n`` ids of ``history``
        (a copy; ``logits`` is left as it was). Positive logits are divided by the penalty,
        negative ones multiplied, as llama.cpp does."""
        import numpy as np

        cfg = self.config
        if cfg.repeat_penalty == 1.0 or cfg.repeat_last_n == 0 or not history:
            return logits
        recent = np.unique(np.asarray(history[-cfg.repeat_last_n:], dtype=np.int64))
        recent = recent[(recent >= 0) & (recent < logits.shape[-1])]
        out = np.array(logits, dtype=np.float32, copy=True)
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
        return int(ids[int(self._generator().choice(probs.shape[0], p=probs))])

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
        """Draw one id from a (token ids, probabilities) pair."""
        return int(ids[int(self._generator().choice(probs.shape[0], p=probs))])

    def _truncated(self, row: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        import numpy as np

        cfg = self.config
        ids = np.arange(row.shape[0])
        vals = row.astype(np.float64)
        if 0 < cfg.top_k < vals.shape[0]:
            keep = np.argpartition(-vals, cfg.top_k - 1)[:cfg.top_k]
            ids, vals = ids[keep], vals[keep]
        order = np.argsort(-vals, kind="stable")
        ids, vals = ids[order], vals[order]
        if cfg.top_p < 1.0 or cfg.min_p > 0.0:
            probs = np.exp(vals - vals[0])
            probs /= probs.sum()
            n = probs.shape[0]
            if cfg.top_p < 1.0:
                n = min(n, int(np.searchsorted(np.cumsum(probs), cfg.top_p)) + 1)
            if cfg.min_p > 0.0:
                n = min(n, max(1, int(np.count_nonzero(probs >= cfg.min_p * probs[0]))))
            ids, vals = ids[:n], vals[:n]
        scaled = (vals - vals[0]) / cfg.temperature
        probs = np.exp(scaled)
        probs /= probs.sum()
        return ids, probs


__all__ = ["Sampler"]
