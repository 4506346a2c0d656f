"""Gemma 4's multi-token-prediction assistant as a speculative drafter (``drafter="mtp"``).

The assistant (a ``gemma4-assistant`` GGUF) is a few query-only layers whose attention reads
the *target's* KV cache and whose input is a token's embedding joined with the target's last
hidden state. llama.cpp runs it as an MTP context over the target context
(``LLAMA_CONTEXT_TYPE_MTP``, ``ctx_other`` = the session's context): it keeps no cache of its
own, so the only state to keep in step with the sequence is the staged hidden state.

A round, as llama.cpp's own driver (``common_speculative_impl_draft_mtp``, shared-memory mode)
runs it: the sequence's last token ``t`` at position ``p`` is not in the target's cache yet
(the session decodes lazily by one); the assistant decodes ``t`` at ``p`` with the target's
hidden row for position ``p - 1`` and drafts the argmax; each further draft feeds the previous
draft, again at ``p``, with the assistant's own output hidden row. The target's rows come from
the session: after every decode on its context it calls :meth:`MtpDrafter.target_decoded`, and
the rows with outputs are copied then (the next decode overwrites them). A round whose row is
not staged (right after a slot restore) proposes nothing; the verify round stages it.
"""

from __future__ import annotations

import contextlib
import ctypes
from collections.abc import Sequence
from typing import Any

import llama_cpp.llama_cpp_ext as lcx
import numpy as np

from eliza_backends import BackendRuntimeError, BundleError, StreamConfig

from .bindings import lc
from .gguf_header import MTP_ARCHITECTURES
from .llama_context import Outputs, new_context
from .model import LoadedModel, architecture
from .options import LlamaCppOptions


class MtpDrafter:
    """Greedy drafts from Gemma 4's assistant over the session's target context. Owned by the
    session (built by it once its context exists; see
    :class:`~eliza_llamacpp.lane.TargetLinkedDrafter`); used on its consumer thread."""

    def __init__(self, assistant: LoadedModel, target: LoadedModel, target_ctx: Any,
                 config: StreamConfig, options: LlamaCppOptions) -> None:
        """:class:`BundleError` when ``assistant`` is no MTP assistant of ``target`` (another
        architecture, another vocabulary, another hidden size)."""
        name = assistant.path.name
        arch = architecture(assistant)
        if arch not in MTP_ARCHITECTURES:
            raise BundleError(f"{name} is a {arch or 'unknown'} model, not an MTP assistant "
                              f"({', '.join(sorted(MTP_ARCHITECTURES))}); drafter='mtp' needs "
                              "the target's assistant (drafter='model' takes a draft model)")
        # the assistant's attention reuses the target's last sliding and full KV layers: on a
        # target of another architecture llama.cpp would read a cache of another shape
        target_arch = architecture(target)
        if target_arch not in MTP_ARCHITECTURES[arch]:
            raise BundleError(f"{name} assists {' or '.join(sorted(MTP_ARCHITECTURES[arch]))} "
                              f"models; the target {target.path.name} is a "
                              f"{target_arch or 'unknown'} model")
        if assistant.info.vocab_size != target.info.vocab_size:
            raise BundleError(f"assistant {name} has {assistant.info.vocab_size} tokens, the "
                              f"target {target.info.vocab_size}: it belongs to another model")
        n_embd = int(lc.llama_model_n_embd_out(assistant.ptr))
        n_target = int(lc.llama_model_n_embd_out(target.ptr))
        if n_embd != n_target:
            raise BundleError(f"assistant {name} reads hidden states of width {n_embd}, the "
                              f"target {target.path.name} has {n_target}: it belongs to another "
                              "model")
        self._target = target_ctx
        self._n_vocab = assistant.info.vocab_size
        self._n_embd = n_embd
        self._ctx: Any = new_context(assistant, config, "the MTP assistant's context",
                                     flash_attention=options.flash_attention,
                                     kv_cache_type=options.kv_cache_type, mtp_target=target_ctx)
        # the assistant's batch: one token and its hidden row (llama_batch_init allocates the
        # embedding; the token array is ours, detached again before llama_batch_free)
        self._batch = lc.llama_batch_init(1, n_embd, 1)
        self._token = (lc.llama_token * 1)()
        self._batch.token = self._token
        self._batch.n_tokens = 1
        self._batch.n_seq_id[0] = 1
        self._batch.seq_id[0][0] = 0
        self._batch.logits[0] = 1
        self._embd = np.ctypeslib.as_array(self._batch.embd, shape=(n_embd,))
        # masked: hidden rows only for rows with outputs, so the target's graph is the one it
        # runs without a drafter (unmasked, its last layer would run on every prompt row)
        lcx.llama_set_embeddings_nextn(target_ctx, True, True)
        lcx.llama_set_embeddings_nextn(self._ctx, True, True)
        # the staged target rows: positions start.., their tokens, one row each (None: no
        # output at that position)
        self._start = 0
        self._tokens: list[int] = []
        self._rows: list[np.ndarray | None] = []

    # ------------------------------------------------------------------ the session's side

    def target_decoded(self, start: int, tokens: Sequence[int], outputs: Outputs) -> None:
        """Stage the hidden rows of a decode on the target context (see the module doc)."""
        n = len(tokens)
        rows: list[np.ndarray | None] = [None] * n
        wanted = range(n) if outputs == "all" else range(n - 1, n) if outputs == "last" else ()
        for i in wanted:
            ptr = lcx.llama_get_embeddings_nextn_ith(self._target, i)
            if not ptr:
                raise BackendRuntimeError("llama.cpp gave no hidden state for the MTP assistant "
                                          f"(row {i} of a {n}-token decode)")
            rows[i] = np.ctypeslib.as_array(ptr, shape=(self._n_embd,)).copy()
        self._start, self._tokens, self._rows = start, list(tokens), rows

    # ------------------------------------------------------------------ Drafter

    def propose(self, history: Sequence[int], k: int) -> list[int]:
        """Up to ``k`` greedy drafts after ``history``, whose last token is the one the target
        has not decoded yet; [] when the target's hidden row before it is not staged."""
        p = len(history) - 1  # the position of the last token, not in the target's cache
        i = p - 1 - self._start
        if k <= 0 or p < 1 or not 0 <= i < len(self._rows):
            return []
        row = self._rows[i]
        if row is None or self._tokens[:i + 1] != list(history[self._start:p]):
            return []
        self._embd[:] = row
        batch, ctx, n_vocab = self._batch, self._ctx, self._n_vocab
        batch.pos[0] = p
        tok = history[-1]
        drafts: list[int] = []
        for step in range(k):
            self._token[0] = tok
            status = lc.llama_decode(ctx, batch)
            if status != 0:
                raise BackendRuntimeError(f"llama_decode failed in the MTP assistant ({status})")
            logits = np.ctypeslib.as_array(lc.llama_get_logits_ith(ctx, 0), shape=(n_vocab,))
            tok = int(logits.argmax())
            drafts.append(tok)
            if step < k - 1:  # the next draft reads the assistant's own hidden row, at p again
                ptr = lcx.llama_get_embeddings_nextn_ith(ctx, 0)
                if not ptr:
                    raise BackendRuntimeError("llama.cpp gave no hidden state from the MTP "
                                              "assistant")
                self._embd[:] = np.ctypeslib.as_array(ptr, shape=(self._n_embd,))
        return drafts

    def truncate(self, n: int) -> None:
        """The sequence was cut to ``n`` tokens: forget the rows at positions ``>= n``."""
        keep = max(0, n - self._start)
        del self._tokens[keep:]
        del self._rows[keep:]

    def close(self) -> None:
        """Free the assistant's context (its weights belong to the InferenceContext) and stop
        the target's hidden-state output."""
        if self._ctx:
            with contextlib.suppress(Exception):
                lcx.llama_set_embeddings_nextn(self._target, False, False)
            self._batch.token = ctypes.POINTER(lc.llama_token)()
            lc.llama_batch_free(self._batch)
            lc.llama_free(self._ctx)
            self._ctx = None

    def __del__(self) -> None:
        with contextlib.suppress(Exception):
            self.close()


__all__ = ["MtpDrafter"]
