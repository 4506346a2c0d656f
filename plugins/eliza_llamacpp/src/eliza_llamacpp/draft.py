"""A smaller GGUF from the bundle's ``text/draft/`` as a speculative drafter.

The draft model runs in its own ``llama_context`` and keeps its KV cache in step with the target
sequence: before each proposal it drops what diverged (rejected drafts) and feeds what is new,
then drafts ``k`` tokens greedily.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any

import llama_cpp as lc

from eliza_backends import BackendRuntimeError, BundleError, InferenceContext, StreamConfig

from . import LlamaCppOptions


def resolve_draft(bundle_dir: Path, config: StreamConfig, factory_artifact: Any) -> Path:
    """The draft GGUF: ``config.draft_model`` (bundle-relative) or the first ``text/draft/``."""
    if config.draft_model is None:
        path: Path = factory_artifact(bundle_dir, role="draft")
        return path
    path = (bundle_dir / config.draft_model).resolve()
    if not path.is_relative_to(bundle_dir.resolve()) or path.suffix != ".gguf" \
            or not path.is_file():
        raise BundleError(f"draft_model {config.draft_model!r} is not a .gguf file inside the "
                          f"bundle {bundle_dir}")
    return path


class DraftModel:
    """Greedy drafts from a small model sharing the target's vocabulary."""

    def __init__(self, model: Any, n_vocab_target: int, config: StreamConfig,
                 threads: int) -> None:
        if model.n_vocab != n_vocab_target:
            raise BundleError(f"draft model {model.path.name} has {model.n_vocab} tokens, the "
                              f"target {n_vocab_target}: a draft model must share the "
                              "target's vocabulary")
        params = lc.llama_context_default_params()
        params.n_ctx = config.context_size
        params.n_batch = config.batch_size
        params.n_ubatch = config.batch_size
        params.n_seq_max = 1
        params.n_threads = params.n_threads_batch = threads
        params.no_perf = True
        self._ctx = lc.llama_init_from_model(model.ptr, params)
        if not self._ctx:
            raise BackendRuntimeError("llama.cpp could not create the draft model's context")
        self._mem = lc.llama_get_memory(self._ctx)
        self._n_batch = lc.llama_n_batch(self._ctx)
        self._batch = lc.llama_batch_init(self._n_batch, 0, 1)
        self._one = lc.llama_batch_init(1, 0, 1)
        self._one.n_tokens = 1
        self._one.n_seq_id[0] = 1
        self._one.seq_id[0][0] = 0
        self._one.logits[0] = 1
        self._smpl = lc.llama_sampler_chain_init(lc.llama_sampler_chain_default_params())
        lc.llama_sampler_chain_add(self._smpl, lc.llama_sampler_init_greedy())
        self._tokens: list[int] = []  # what the draft KV cache holds
        self._synced = 0  # leading tokens known to equal the target sequence

    def _feed(self, tokens: Sequence[int]) -> None:
        batch, cap = self._batch, self._n_batch
        for off in range(0, len(tokens), cap):
            chunk = tokens[off:off + cap]
            pos = len(self._tokens)
            for i, tok in enumerate(chunk):
                batch.token[i] = tok
                batch.pos[i] = pos + i
                batch.n_seq_id[i] = 1
                batch.seq_id[i][0] = 0
                batch.logits[i] = 0
            batch.logits[len(chunk) - 1] = 1
            batch.n_tokens = len(chunk)
            if lc.llama_decode(self._ctx, batch) != 0:
                raise BackendRuntimeError("llama_decode failed in the draft model")
            self._tokens.extend(chunk)

    def propose(self, history: Sequence[int], k: int) -> list[int]:
        """Sync with ``history`` and draft ``k`` tokens greedily."""
        if k <= 0:
            return []
        p, n = self._synced, min(len(self._tokens), len(history))
        while p < n and self._tokens[p] == history[p]:
            p += 1
        if p == len(history):  # everything is cached: re-feed the last token for its logits
            p -= 1
        self.truncate(p)
        self._feed(history[p:])
        self._synced = len(history)
        drafts = []
        for i in range(k):
            tok = lc.llama_sampler_sample(self._smpl, self._ctx, -1)
            drafts.append(tok)
            if i < k - 1:
                self._one.token[0] = tok
                self._one.pos[0] = len(self._tokens)
                if lc.llama_decode(self._ctx, self._one) != 0:
                    raise BackendRuntimeError("llama_decode failed in the draft model")
                self._tokens.append(tok)
        return drafts

    def truncate(self, n: int) -> None:
        """Forget KV positions from ``n`` on."""
        if n < len(self._tokens):
            lc.llama_memory_seq_rm(self._mem, 0, n, -1)
            del self._tokens[n:]
        self._synced = min(self._synced, n)

    def close(self) -> None:
        """Free the draft context (the weights belong to the InferenceContext)."""
        if self._ctx:
            lc.llama_batch_free(self._batch)
            lc.llama_batch_free(self._one)
            lc.llama_sampler_free(self._smpl)
            lc.llama_free(self._ctx)
            self._ctx = None


def open_draft(context: InferenceContext, config: StreamConfig, options: LlamaCppOptions,
               path: Path, n_vocab_target: int, threads: int) -> DraftModel:
    """Load (or reuse) the draft weights on ``context`` and give them a context."""
    from .session import free_model, load_model, use_extra_buffers

    key = ("llama.cpp", str(path), options.n_gpu_layers, options.use_mmap,
           use_extra_buffers(options))
    model = context.shared(key, lambda: load_model(path, options), free_model)
    return DraftModel(model, n_vocab_target, config, threads)
