"""llama-cpp-python's own libmtmd path, called directly: what ``eliza-backends bench`` times
beside the seam's media prefill (:meth:`~eliza_backends.backend.Factory.media_reference`).

It is what a user of ``llama_cpp.mtmd_cpp`` writes by hand, with no part of the seam: its own
``mtmd_context`` from ``mtmd_init_from_file`` (the session's projector file, the session's
threads), its own ``llama_context`` (the session's context size, batch sizes, flash attention
and KV type) over the same loaded weights; a media file becomes a bitmap through libmtmd's own
decoder (``mtmd_helper_bitmap_init_from_buf``: stb_image / miniaudio), is tokenized with the
prompt text around libmtmd's marker (``mtmd_tokenize``) and evaluated by
``mtmd_helper_eval_chunks`` (encoder, then the text model under the model's own mask).

Single-threaded use only (the bench's worker); :meth:`MtmdReference.close` frees both
contexts.
"""

from __future__ import annotations

import ctypes
from typing import Any

from eliza_backends import BackendRuntimeError, StreamConfig

from .bindings import lc
from .llama_context import new_context
from .model import LoadedModel
from .mtmd import Projector, _mtmd
from .options import LlamaCppOptions


class MtmdReference:
    """``llama-cpp-python``'s libmtmd path on a session's files (see the module docstring)."""

    name = "llama-cpp-python mtmd_helper_eval_chunks"

    def __init__(self, model: LoadedModel, config: StreamConfig, options: LlamaCppOptions,
                 projector: Projector) -> None:
        """Over a session's loaded ``model`` and ``projector`` (its file and settings), with
        the session's ``config`` and ``options``."""
        mt = _mtmd()
        self._ctx: Any = new_context(model, config, "the bench's reference context",
                                     n_ubatch=options.n_ubatch,
                                     flash_attention=options.flash_attention,
                                     kv_cache_type=options.kv_cache_type)
        params = mt.mtmd_context_params_default()
        params.use_gpu = False
        params.print_timings = False
        params.n_threads = projector.threads
        params.warmup = False
        if projector.image_max_tokens is not None:
            params.image_max_tokens = projector.image_max_tokens
        self._mtmd: Any = mt.mtmd_init_from_file(str(projector.path).encode(), model.ptr,
                                                 params)
        if not self._mtmd:
            lc.llama_free(self._ctx)
            raise BackendRuntimeError(f"libmtmd could not load {projector.path}")
        self._n_batch = int(lc.llama_n_batch(self._ctx))  # the seam's lane.n_batch

    def prefill(self, kind: str, data: bytes, prefix: str, suffix: str) -> int:
        """``prefix`` + the media file + ``suffix`` into an empty KV cache; returns the
        positions taken (``kind`` is what libmtmd's decoder finds in ``data`` itself)."""
        mt = _mtmd()
        lc.llama_memory_clear(lc.llama_get_memory(self._ctx), True)
        buf = (ctypes.c_ubyte * len(data)).from_buffer_copy(data)
        bitmap = mt.mtmd_helper_bitmap_init_from_buf(self._mtmd, buf, len(data), False)
        if not bitmap:
            raise BackendRuntimeError(f"libmtmd could not decode this {kind}")
        chunks = mt.mtmd_input_chunks_init()
        try:
            text = (prefix + mt.mtmd_default_marker().decode() + suffix).encode()
            inp = mt.mtmd_input_text(text=text, text_len=len(text), add_special=True,
                                     parse_special=True)
            bitmaps = (mt.mtmd_bitmap_p_ctypes * 1)(bitmap)
            if mt.mtmd_tokenize(self._mtmd, chunks, ctypes.byref(inp), bitmaps, 1) != 0:
                raise BackendRuntimeError(f"libmtmd could not tokenize this {kind}")
            new_past = lc.llama_pos(0)
            if mt.mtmd_helper_eval_chunks(self._mtmd, self._ctx, chunks, 0, 0, self._n_batch,
                                          True, ctypes.byref(new_past)) != 0:
                raise BackendRuntimeError(f"libmtmd could not evaluate this {kind}")
            return int(new_past.value)
        finally:
            mt.mtmd_bitmap_free(bitmap)
            mt.mtmd_input_chunks_free(chunks)

    def close(self) -> None:
        """Free the two contexts (idempotent)."""
        if self._mtmd:
            _mtmd().mtmd_free(self._mtmd)
            self._mtmd = None
        if self._ctx:
            lc.llama_free(self._ctx)
            self._ctx = None


__all__ = ["MtmdReference"]
