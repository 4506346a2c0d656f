"""A smaller GGUF from the bundle's ``text/draft/`` as a speculative drafter.

The draft model runs in its own ``llama_context``; :class:`~eliza_backends.runtime.speculative.
ModelDrafter` keeps its KV cache in step with the target sequence (drop what diverged, feed
what is new, draft ``k`` tokens greedily); this module supplies the llama.cpp calls.
"""

from __future__ import annotations

import contextlib
from typing import Any

from eliza_backends import BackendRuntimeError, StreamConfig
from eliza_backends.backend import ModelDrafter

from .bindings import lc
from .llama_context import fill_batch, new_context, one_token_batch
from .model import LoadedModel
from .options import LlamaCppOptions


class DraftModel(ModelDrafter):
    """Greedy drafts from a small model sharing the target's vocabulary."""

    def __init__(self, model: LoadedModel, n_vocab_target: int, config: StreamConfig,
                 options: LlamaCppOptions) -> None:
        super().__init__(model.path.name, model.info.vocab_size, n_vocab_target)
        self._ctx: Any = new_context(model, config, "the draft model's context",
                                     flash_attention=options.flash_attention,
                                     kv_cache_type=options.kv_cache_type)
        self._mem = lc.llama_get_memory(self._ctx)
        self._n_batch = lc.llama_n_batch(self._ctx)
        self._batch = lc.llama_batch_init(self._n_batch, 0, 1)
        self._one = one_token_batch()
        self._smpl = lc.llama_sampler_chain_init(lc.llama_sampler_chain_default_params())
        lc.llama_sampler_chain_add(self._smpl, lc.llama_sampler_init_greedy())

    def _decode(self, batch: Any) -> None:
        if lc.llama_decode(self._ctx, batch) != 0:
            raise BackendRuntimeError("llama_decode failed in the draft model")

    def _forward(self, feed: list[int], k: int) -> list[int]:
        pos, cap = len(self._tokens), self._n_batch
        for off in range(0, len(feed), cap):
            chunk = feed[off:off + cap]
            fill_batch(self._batch, chunk, pos + off, "last")
            self._decode(self._batch)
        pos += len(feed)
        drafts = []
        for i in range(k):
            tok = lc.llama_sampler_sample(self._smpl, self._ctx, -1)
            drafts.append(tok)
            if i < k - 1:
                self._one.token[0] = tok
                self._one.pos[0] = pos + i
                self._decode(self._one)
        return drafts

    def _drop(self, n: int) -> bool:
        return bool(lc.llama_memory_seq_rm(self._mem, 0, n, -1))

    def _clear(self) -> None:
        lc.llama_memory_clear(self._mem, True)

    def close(self) -> None:
        """Free the draft context (the weights belong to the InferenceContext)."""
        if self._ctx:
            lc.llama_batch_free(self._batch)
            lc.llama_batch_free(self._one)
            lc.llama_sampler_free(self._smpl)
            lc.llama_free(self._ctx)
            self._ctx = None

    def __del__(self) -> None:
        with contextlib.suppress(Exception):
            self.close()


__all__ = ["DraftModel"]
