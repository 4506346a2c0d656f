"""llama.cpp's embedding mode: :class:`LlamaCppEmbeddingSession`, the session of an embedding
model (a GGUF with a pooling type, such as EmbeddingGemma's ``gemma-embedding``; the header
probe that tells one apart is :func:`eliza_llamacpp.gguf_header.embedding_spec`).

As llama-server ``--embeddings`` does it: a context with ``embeddings`` on and the model's own
pooling (``LLAMA_POOLING_TYPE_UNSPECIFIED``: mean / CLS / last from the GGUF), every token of
an input an output, one pooled vector per sequence (``llama_get_embeddings_seq``, after the
model's own Dense layers), L2-normalised as its ``common_embd_normalize(..., 2)`` (the sum of
squares in double precision, then one float scale). Many inputs go through one forward pass,
each its own sequence of a unified cache; a non-causal model (EmbeddingGemma attends both
ways) needs an input's tokens in one micro-batch, so the batch is the context size.
"""

from __future__ import annotations

import ctypes
import math
from typing import Any

import numpy as np

from eliza_backends import (
    BackendRuntimeError,
    BundleError,
    Capabilities,
    Decoded,
    EmbeddingSpec,
    InferenceContext,
    Session,
    StreamConfig,
    UnsupportedOperationError,
)
from eliza_backends.backend import cpu_count

from . import model_checks
from .bindings import lc
from .model import LoadedModel
from .options import LlamaCppOptions

#: Sequences per forward pass. A power of two: llama.cpp (0.3.36) aborts while reserving the
#: pooling graph of a context whose ``n_seq_max`` is not one (measured: 3, 5, 6 abort; 2, 4, 8,
#: 16, 64 do not).
MAX_SEQUENCES = 64
_FLASH_ATTN = {"off": lc.LLAMA_FLASH_ATTN_TYPE_DISABLED, "on": lc.LLAMA_FLASH_ATTN_TYPE_ENABLED,
               "auto": lc.LLAMA_FLASH_ATTN_TYPE_AUTO}


def normalized(vector: Any) -> list[float]:
    """``vector`` (float32) scaled to unit L2 norm as llama.cpp's ``common_embd_normalize``
    with ``embd_norm=2``: the norm in double precision, one float32 scale."""
    v = np.asarray(vector, dtype=np.float32)
    norm = math.sqrt(float(np.dot(v.astype(np.float64), v.astype(np.float64))))
    scale = np.float32(1.0 / norm) if norm > 0 else np.float32(0.0)
    return [float(x) for x in (v * scale)]


def pack(batch: list[list[int]], max_tokens: int, max_seqs: int) -> list[list[int]]:
    """The indices of ``batch`` grouped into forward passes of at most ``max_tokens`` tokens
    and ``max_seqs`` inputs each, in input order (every input fits ``max_tokens``)."""
    groups: list[list[int]] = []
    used = max_seqs
    tokens = 0
    for i, ids in enumerate(batch):
        if used == max_seqs or tokens + len(ids) > max_tokens:
            groups.append([])
            used, tokens = 0, 0
        groups[-1].append(i)
        used += 1
        tokens += len(ids)
    return groups


class LlamaCppEmbeddingSession(Session):
    """An embedding model's session: :meth:`Session.embed` only (prefill / next refused).

    Owns its ``llama_context`` and ``llama_batch``; the weights are the inference context's.
    Inputs of up to ``config.context_size`` tokens (at most the model's trained context);
    ``config.threads`` threads."""

    backend_name = "llama.cpp"

    def __init__(self, model: LoadedModel, config: StreamConfig, options: LlamaCppOptions,
                 spec: EmbeddingSpec, context: InferenceContext) -> None:
        self._model = model
        self._spec = spec
        # the longest input: the context asked for, at most the model's trained window
        self._n_tokens = min(config.context_size, lc.llama_model_n_ctx_train(model.ptr))
        params = lc.llama_context_default_params()
        params.n_ctx = params.n_batch = params.n_ubatch = self._n_tokens
        params.n_seq_max = MAX_SEQUENCES
        params.kv_unified = True
        params.embeddings = True
        params.pooling_type = lc.LLAMA_POOLING_TYPE_UNSPECIFIED  # the model's own
        params.n_threads = params.n_threads_batch = config.threads or cpu_count()
        params.flash_attn_type = _FLASH_ATTN[options.flash_attention]
        params.no_perf = True
        self._ctx = model_checks.new_context(model.ptr, params, model.path)
        if not self._ctx:
            raise BackendRuntimeError(f"llama.cpp could not create an embedding context of "
                                      f"{self._n_tokens} tokens; lower context_size")
        self._batch: Any = None
        try:
            n_out = lc.llama_model_n_embd_out(model.ptr)
            if n_out != spec.dimensions:
                raise BundleError(f"{model.path}: llama.cpp makes {n_out}-dimension vectors, "
                                  f"its header says {spec.dimensions}; re-convert it")
            self._batch = lc.llama_batch_init(self._n_tokens, 0, 1)
            super().__init__(config, context, model.info, context_size=self._n_tokens)
        except BaseException:
            self._close()
            raise

    @property
    def capabilities(self) -> Capabilities:
        return Capabilities(prefix_reuse=False, sampling=False, ignore_eos=False,
                            embedding=self._spec)

    def _embed(self, batch: list[list[int]]) -> list[list[float]]:
        out: list[list[float]] = [[] for _ in batch]
        for group in pack(batch, self._n_tokens, MAX_SEQUENCES):
            self._raise_if_cancelled()
            self._forward([batch[i] for i in group])
            for seq, i in enumerate(group):
                ptr = lc.llama_get_embeddings_seq(self._ctx, seq)
                if not ptr:
                    raise BackendRuntimeError(f"llama.cpp returned no embedding for input {i}")
                out[i] = normalized(np.ctypeslib.as_array(
                    ctypes.cast(ptr, ctypes.POINTER(ctypes.c_float)),
                    shape=(self._spec.dimensions,)))
        return out

    def _forward(self, inputs: list[list[int]]) -> None:
        """One forward pass over ``inputs``, input ``j`` as sequence ``j`` from position 0,
        every token an output (the pooling reads them all); the cache cleared first."""
        batch, k = self._batch, 0
        for seq, ids in enumerate(inputs):
            for pos, tok in enumerate(ids):
                batch.token[k] = tok
                batch.pos[k] = pos
                batch.n_seq_id[k] = 1
                batch.seq_id[k][0] = seq
                batch.logits[k] = 1
                k += 1
        batch.n_tokens = k
        memory = lc.llama_get_memory(self._ctx)
        if memory:  # a causal model (last-token pooling) keeps a cache: start it clean
            lc.llama_memory_clear(memory, True)
            rc = lc.llama_decode(self._ctx, batch)
        else:
            rc = lc.llama_encode(self._ctx, batch)
        if rc != 0:
            raise BackendRuntimeError(f"llama.cpp failed to embed a batch of {len(inputs)} "
                                      f"inputs ({k} tokens): status {rc}")

    def _prefill(self, token_ids: list[int]) -> None:
        raise UnsupportedOperationError(_NOT_GENERATING)

    def _decode(self, max_tokens: int) -> Decoded:
        raise UnsupportedOperationError(_NOT_GENERATING)

    def _reset(self) -> None:
        """Nothing to clear: every embed call starts from an empty cache."""

    def _token_bytes(self, token_id: int) -> bytes:
        return self._model.piece(token_id)

    def _tokenize(self, text: str, add_special: bool, parse_special: bool) -> list[int]:
        return self._model.tokenize(text, add_special, parse_special)

    def _close(self) -> None:
        if self._batch is not None:
            lc.llama_batch_free(self._batch)
            self._batch = None
        if self._ctx:
            lc.llama_free(self._ctx)
            self._ctx = None


_NOT_GENERATING = ("this is an embedding model's session: it embeds (Session.embed, "
                   "eliza_backends.embed, POST /v1/embeddings) and does not generate text")

__all__ = ["MAX_SEQUENCES", "LlamaCppEmbeddingSession", "normalized", "pack"]
