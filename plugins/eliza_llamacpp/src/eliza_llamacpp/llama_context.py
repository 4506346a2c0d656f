"""The llama.cpp calls every decoder of this plugin makes on loaded weights: a ``llama_context``
(:func:`new_context`), ``llama_batch`` filling, and a sequence's saved state.

The lanes (:mod:`~eliza_llamacpp.solo`, :mod:`~eliza_llamacpp.batch_engine`) and the drafters
(:mod:`~eliza_llamacpp.draft`, :mod:`~eliza_llamacpp.mtp`) import this module and
:mod:`~eliza_llamacpp.model`, never each other.
"""

from __future__ import annotations

import ctypes
from typing import Any, Literal

import numpy as np

from eliza_backends import BackendRuntimeError, StreamConfig
from eliza_backends.backend import cpu_count

from . import model_checks
from .bindings import lc
from .model import LoadedModel

#: Which rows of a batch have outputs (logits, hidden states): every one, the last, none.
Outputs = Literal["all", "last", "none"]

_FLASH_ATTN = {"off": lc.LLAMA_FLASH_ATTN_TYPE_DISABLED, "on": lc.LLAMA_FLASH_ATTN_TYPE_ENABLED,
               "auto": lc.LLAMA_FLASH_ATTN_TYPE_AUTO}
_KV_TYPES = {"f16": lc.GGML_TYPE_F16, "f32": lc.GGML_TYPE_F32, "q8_0": lc.GGML_TYPE_Q8_0}


def new_context(model: LoadedModel, config: StreamConfig, what: str, *,
                n_ubatch: int | None = None,
                flash_attention: Literal["off", "on", "auto"],
                kv_cache_type: Literal["f16", "f32", "q8_0"],
                mtp_target: Any = None, n_seq: int = 1, kv_unified: bool = True) -> Any:
    """A ``llama_context`` on ``model`` for ``n_seq`` sequences of ``config.context_size``
    positions each, with ``n_ubatch`` (default: the batch size), flash attention and the KV
    cache's element type (no defaults here: :class:`LlamaCppOptions` holds them); ``what``
    names it in the error message. ``n_seq > 1``: with ``kv_unified``, one KV cache of
    ``n_seq * context_size`` cells that the sequences share (a copied prefix costs no cells),
    else one of ``context_size`` cells per sequence (see :mod:`eliza_llamacpp.batch_engine`).
    ``mtp_target``: a target's ``llama_context``; the context
    is then an MTP one (``LLAMA_CONTEXT_TYPE_MTP``) over it, one token and one output per
    decode (Gemma 4's assistant: its attention reads that context's KV cache, so the flash
    attention setting and cache type must be the target's)."""
    threads = config.threads or cpu_count()
    params = lc.llama_context_default_params()
    params.n_ctx = config.context_size * n_seq
    params.n_batch = config.batch_size
    params.n_ubatch = min(n_ubatch or config.batch_size, config.batch_size)
    if mtp_target is not None:
        params.ctx_type = lc.LLAMA_CONTEXT_TYPE_MTP
        params.ctx_other = mtp_target
        params.n_batch = params.n_ubatch = params.n_outputs_max = 1
    params.n_seq_max = n_seq
    params.kv_unified = n_seq > 1 and kv_unified
    params.n_threads = params.n_threads_batch = threads
    params.no_perf = True
    params.flash_attn_type = _FLASH_ATTN[flash_attention]
    params.type_k = params.type_v = _KV_TYPES[kv_cache_type]
    ctx = model_checks.new_context(model.ptr, params, model.path)
    if not ctx:
        raise BackendRuntimeError(
            f"llama.cpp could not create {what} of {config.context_size * n_seq} tokens; lower "
            "context_size or batch_size" + (" or parallel" if n_seq > 1 else ""))
    return ctx


def one_token_batch() -> Any:
    """A ``llama_batch`` for one token of sequence 0 with its logits (set token and pos)."""
    one = lc.llama_batch_init(1, 0, 1)
    one.n_tokens = 1
    one.n_seq_id[0] = 1
    one.seq_id[0][0] = 0
    one.logits[0] = 1
    return one


def fill_batch(batch: Any, tokens: list[int], start: int, outputs: Outputs) -> None:
    """Put ``tokens`` at positions ``start..`` of sequence 0 into ``batch``, with logits for
    ``outputs``: every position, the last one, or none."""
    every = outputs == "all"
    for i, tok in enumerate(tokens):
        batch.token[i] = tok
        batch.pos[i] = start + i
        batch.n_seq_id[i] = 1
        batch.seq_id[i][0] = 0
        batch.logits[i] = every
    if outputs == "last":
        batch.logits[len(tokens) - 1] = 1
    batch.n_tokens = len(tokens)


def save_seq(ctx: Any, seq: int) -> memoryview:
    """Sequence ``seq``'s state in ``ctx`` (empty when llama.cpp writes nothing): a writable
    view of a buffer this call allocated for llama.cpp to write into, owned by the caller (no
    copy: a state is megabytes, and each copy of fresh pages costs a page fault every 4 KiB;
    slicing the ctypes array instead would build a list of Python ints)."""
    size = lc.llama_state_seq_get_size(ctx, seq)
    area = bytearray(size)  # calloc'd: pages are touched only by llama.cpp's write
    buf = (ctypes.c_uint8 * size).from_buffer(area)
    written = lc.llama_state_seq_get_data(ctx, buf, size, seq)
    del buf  # (its export would pin the bytearray)
    return memoryview(area)[:written]


def load_seq(ctx: Any, seq: int, state: bytes | memoryview) -> bool:
    """Load a saved sequence state into sequence ``seq`` of ``ctx`` (which must be empty).
    llama.cpp reads ``state`` where it lies (no copy; the caller holds it for the call)."""
    size = len(state)
    data = np.frombuffer(state, dtype=np.uint8)  # (a view: read-only buffers too)
    return bool(lc.llama_state_seq_set_data(
        ctx, data.ctypes.data_as(ctypes.POINTER(ctypes.c_uint8)), size, seq))


__all__ = ["Outputs", "fill_batch", "load_seq", "new_context",
           "one_token_batch", "save_seq"]
