"""A smaller MLX folder from the bundle's ``text/draft/`` as a speculative drafter.

The draft model shares the target's vocabulary and runs on the same :class:`InferenceContext`
(its weights are loaded once, like the target's), with its own mlx-lm prompt cache kept in step
with the target sequence by :class:`~eliza_backends.runtime.speculative.ModelDrafter`; this module
supplies the mlx calls. The ``k`` draft forward passes are one lazy mlx graph, evaluated once
per proposal.
"""

from __future__ import annotations

from typing import Any, cast

import mlx.core as mx  # type: ignore[import-not-found,unused-ignore]
from mlx_lm.models.cache import (  # type: ignore[import-not-found,unused-ignore]
    can_trim_prompt_cache,
    make_prompt_cache,
)

from eliza_backends import UnsupportedOperationError
from eliza_backends.backend import ModelDrafter

from .mlx_thread import on_mlx_thread
from .model import COMPUTE_STREAM, LoadedMLX, trim


class MLXDraftModel(ModelDrafter):
    """Greedy drafts from a small MLX model sharing the target's vocabulary."""

    @on_mlx_thread
    def __init__(self, loaded: LoadedMLX, target_vocab: int, batch_size: int) -> None:
        super().__init__(loaded.folder.path.name, loaded.info.vocab_size, target_vocab)
        self._model = loaded.model
        self._step = batch_size
        self._cache: list[Any] = make_prompt_cache(self._model)
        if not can_trim_prompt_cache(self._cache):
            raise UnsupportedOperationError(
                f"draft model {loaded.folder.path.name}: its prompt cache cannot be trimmed, "
                "which a draft model needs")

    @on_mlx_thread
    def _forward(self, feed: list[int], k: int) -> list[int]:
        body, last = feed[:-1], feed[-1:]
        model, cache = self._model, self._cache
        with mx.stream(COMPUTE_STREAM):
            for off in range(0, len(body), self._step):
                chunk = body[off:off + self._step]
                model(mx.array(chunk, dtype=mx.uint32)[None], cache=cache)
                mx.eval([c.state for c in cache])
            y = mx.argmax(model(mx.array(last, dtype=mx.uint32)[None], cache=cache)[:, -1, :],
                          axis=-1)
            ys = [y]
            for _ in range(k - 1):  # lazily chained: one evaluation for the k drafts
                y = mx.argmax(model(y[None], cache=cache)[:, -1, :], axis=-1)
                ys.append(y)
            return cast(list[int], mx.concatenate(ys).tolist())

    @on_mlx_thread
    def _drop(self, n: int) -> bool:
        drop = len(self._tokens) - n
        return trim(self._cache, drop) == drop

    @on_mlx_thread
    def _clear(self) -> None:
        self._cache = make_prompt_cache(self._model)

    @on_mlx_thread
    def close(self) -> None:
        """Drop the draft prompt cache (the weights belong to the InferenceContext)."""
        self._cache = []
        self._tokens = []
        self._synced = 0


__all__ = ["MLXDraftModel"]
