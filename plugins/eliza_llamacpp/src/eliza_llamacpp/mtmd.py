"""Images and audio through libmtmd (``llama_cpp.mtmd_cpp``, shipped in llama-cpp-python's wheel).

A bundle's multimodal projector (``text/mmproj/*.gguf``: llama.cpp's ``--mmproj`` converter
output, e.g. Gemma 4's ``gemma4v`` + ``gemma4a``) is loaded once per inference context beside
the text model (:func:`shared_projector`). A media item becomes chunks through
``mtmd_tokenize`` of the default marker with one bitmap (RGB pixels, or 16 kHz float PCM), which
inserts the model's own begin / end marker tokens (Gemma 4: ``<|image>`` ... ``<image|>``,
``<|audio>`` ... ``<audio|>``) and preprocesses the media (resize, mel features); the media
chunk is then encoded and decoded into the session's sequence by
``mtmd_helper_eval_chunk_single``, under the model's own attention rule
(``mtmd_decode_use_non_causal``: a Gemma 4 image block is bidirectional except at the E2B/E4B
widths; audio is causal).

llama.cpp aborts the process on input it does not expect, so everything is checked first: the
item is decoded and validated by :mod:`eliza_backends.media` (never here), the chunk layout is
checked after tokenizing, and a media chunk must fit one micro-batch (``n_ubatch``: a
bidirectional block is decoded in one; llama.cpp asserts otherwise).

Cheap probes (:func:`projector_kinds`) read the projector's GGUF metadata in Python, no load.
"""

from __future__ import annotations

import contextlib
import ctypes
import json
import os
import threading
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np

from eliza_backends import (
    BackendRuntimeError,
    BundleError,
    CancelledError,
    InferenceContext,
    MediaError,
)
from eliza_backends.backend import MediaItem, MediaTokens, cpu_count

from .bindings import lc
from .lane import Lane
from .model import LoadedModel, _log_to_logging

_CHUNK_TEXT = 0


def _mtmd() -> Any:
    import llama_cpp.mtmd_cpp as mtmd_cpp  # (not `from llama_cpp import`: see .bindings)

    return mtmd_cpp


# ------------------------------------------------------------------ the projector

_logs_routed = False


def _route_logs() -> None:
    """libmtmd's log lines into :mod:`logging`, as llama.cpp's are (once per process)."""
    global _logs_routed
    if not _logs_routed:
        mt = _mtmd()
        mt.mtmd_log_set(_log_to_logging, ctypes.c_void_p(0))
        mt.mtmd_helper_log_set(_log_to_logging, ctypes.c_void_p(0))
        _logs_routed = True


class Projector:
    """A loaded ``mtmd_context`` (the projector over one text model), shared by the sessions
    of an inference context. Its calls run under :attr:`lock` (libmtmd keeps the last
    encoding's output in the context)."""

    def __init__(self, path: Path, model: LoadedModel, threads: int,
                 image_max_tokens: int | None = None) -> None:
        mt = _mtmd()
        _route_logs()
        params = mt.mtmd_context_params_default()
        params.use_gpu = False
        params.print_timings = False
        params.n_threads = threads
        params.warmup = False
        if image_max_tokens is not None:
            params.image_max_tokens = image_max_tokens
        self.path = path
        self.threads = threads
        self.image_max_tokens = image_max_tokens
        self.lock = threading.Lock()
        self.ctx = mt.mtmd_init_from_file(str(path).encode(), model.ptr, params)
        if not self.ctx:
            raise BundleError(f"libmtmd could not load the projector {path} for "
                              f"{model.path.name} (a projector for another model, or a damaged "
                              "file?): convert it again with --mmproj from the same checkpoint")
        self.kinds = frozenset(k for k, ok in (("image", mt.mtmd_support_vision(self.ctx)),
                                               ("audio", mt.mtmd_support_audio(self.ctx))) if ok)
        self.marker = mt.mtmd_default_marker()
        self.n_embd = int(lc.llama_model_n_embd_inp(model.ptr))

    def chunks(self, item: MediaItem) -> Chunks:
        """``item`` tokenized: the marker with its bitmap (see the module docstring)."""
        mt = _mtmd()
        if item.kind not in self.kinds:
            raise MediaError(f"the projector {self.path.name} has no {item.kind} encoder")
        # the item's own (read-only, C-contiguous) array: libmtmd copies it into the bitmap
        data = np.ascontiguousarray(item.data)
        if item.kind == "image":
            h, w, _ = data.shape
            bitmap = mt.mtmd_bitmap_init(w, h, data.ctypes.data_as(
                ctypes.POINTER(ctypes.c_uint8)))
        else:
            data = np.ascontiguousarray(data, dtype=np.float32)
            bitmap = mt.mtmd_bitmap_init_from_audio(len(data), data.ctypes.data_as(
                ctypes.POINTER(ctypes.c_float)))
        if not bitmap:
            raise BackendRuntimeError(f"libmtmd could not take {item!r}")
        chunks = mt.mtmd_input_chunks_init()
        try:
            text = mt.mtmd_input_text(text=self.marker, text_len=len(self.marker),
                                      add_special=False, parse_special=True)
            bitmaps = (mt.mtmd_bitmap_p_ctypes * 1)(bitmap)
            with self.lock:
                status = mt.mtmd_tokenize(self.ctx, chunks, ctypes.byref(text), bitmaps, 1)
        finally:
            mt.mtmd_bitmap_free(bitmap)
        out = Chunks(chunks)
        if status != 0:
            out.free()
            raise MediaError(f"libmtmd could not preprocess {item!r} (status {status}); the "
                             "media may be too small or too large for this model's encoder")
        return out

    def encode(self, item: MediaItem) -> np.ndarray:
        """The projected embeddings of ``item`` (``[positions, n_embd]`` float32, a copy): what
        the text model reads in its place (for parity checks and ``bench``)."""
        mt = _mtmd()
        chunks = self.chunks(item)
        try:
            _, media, _ = chunks.layout()
            n = mt.mtmd_input_chunk_get_n_tokens(media)
            with self.lock:
                status = mt.mtmd_encode_chunk(self.ctx, media)
                if status != 0:
                    raise BackendRuntimeError(f"libmtmd could not encode {item!r} ({status})")
                out = mt.mtmd_get_output_embd(self.ctx)
                flat = np.ctypeslib.as_array(out, shape=(n * self.n_embd,)).copy()
        finally:
            chunks.free()
        embeddings: np.ndarray = flat.reshape(n, self.n_embd)
        return embeddings

    def close(self) -> None:
        """Free the context (idempotent)."""
        if self.ctx:
            _mtmd().mtmd_free(self.ctx)
            self.ctx = None


class Chunks:
    """An ``mtmd_input_chunks`` list: text before, one media chunk, text after."""

    def __init__(self, ptr: Any) -> None:
        self.ptr = ptr

    def layout(self) -> tuple[list[int], Any, list[int]]:
        """(ids before, the media chunk, ids after); :class:`BackendRuntimeError` for any
        other layout."""
        mt = _mtmd()
        before: list[int] = []
        after: list[int] = []
        media = None
        for i in range(mt.mtmd_input_chunks_size(self.ptr)):
            chunk = mt.mtmd_input_chunks_get(self.ptr, i)
            if mt.mtmd_input_chunk_get_type(chunk) == _CHUNK_TEXT:
                n = ctypes.c_size_t(0)
                toks = mt.mtmd_input_chunk_get_tokens_text(chunk, ctypes.byref(n))
                (after if media is not None else before).extend(toks[:n.value])
            elif media is None:
                media = chunk
            else:
                raise BackendRuntimeError("libmtmd split one media item into several chunks")
        if media is None:
            raise BackendRuntimeError("libmtmd produced no media chunk")
        return before, media, after

    def free(self) -> None:
        """Free the chunks (idempotent)."""
        if self.ptr:
            _mtmd().mtmd_input_chunks_free(self.ptr)
            self.ptr = None

    def __del__(self) -> None:
        with contextlib.suppress(Exception):  # nothing may escape a finalizer
            self.free()


def shared_projector(context: InferenceContext, path: Path, model: LoadedModel,
                     threads: int | None, image_max_tokens: int | None) -> Projector:
    """The projector at ``path`` over ``model``, loaded once per inference context (and
    image budget)."""
    return context.shared(("mtmd", str(path), id(model), image_max_tokens),
                          lambda: Projector(path, model, threads or cpu_count(),
                                            image_max_tokens),
                          close=Projector.close)


def processor_image_tokens(bundle_dir: str | os.PathLike[str]) -> int | None:
    """The image budget of the model's own processor: ``max_soft_tokens`` of a
    ``processor_config.json`` in a folder under ``text/`` (Gemma 4's), or None."""
    for config in sorted(Path(bundle_dir, "text").glob("*/processor_config.json")):
        try:
            data = json.loads(config.read_text(encoding="utf-8"))
        except (OSError, ValueError):
            continue
        value = (data.get("image_processor") or {}).get("max_soft_tokens") if isinstance(
            data, dict) else None
        if isinstance(value, int) and not isinstance(value, bool) and value > 0:
            return value
    return None


class MediaFeeder:
    """A session's way to put media into its sequence: :meth:`tokens` (the session's
    ``_media_tokens``) and :meth:`decode` (its ``_prefill_media``). The projector is loaded
    on the first media item (``load``), shared through the inference context; ``kinds`` is
    what its metadata says it encodes; ``placeholders``: the id the history shows for each
    kind's embeddings (the model's soft token, e.g. ``<|image|>``)."""

    def __init__(self, load: Callable[[], Projector], kinds: frozenset[str],
                 placeholders: dict[str, int], n_ubatch: int) -> None:
        self._load = load
        self.kinds = kinds
        self.placeholders = placeholders
        self.n_ubatch = n_ubatch
        self._projector: Projector | None = None

    @property
    def projector(self) -> Projector:
        """The loaded projector."""
        if self._projector is None:
            self._projector = self._load()
        return self._projector

    def tokens(self, item: MediaItem) -> MediaTokens:
        """Tokenize ``item``; check that a chunk with bidirectional attention (a Gemma 4
        image) fits one micro-batch (llama.cpp asserts otherwise; causal audio is decoded in
        pieces)."""
        chunks = self.projector.chunks(item)
        try:
            before, media, after = chunks.layout()
            count = _mtmd().mtmd_input_chunk_get_n_tokens(media)
            n_pos = _mtmd().mtmd_input_chunk_get_n_pos(media)
        except BaseException:
            chunks.free()
            raise
        if n_pos != count:
            chunks.free()
            raise MediaError(f"{item!r} takes {count} embeddings at {n_pos} positions (M-RoPE); "
                             "this backend does not place such media yet")
        if count > self.n_ubatch and _mtmd().mtmd_decode_use_non_causal(self.projector.ctx,
                                                                         media):
            chunks.free()
            raise MediaError(
                f"{item!r} takes {count} positions, more than this session's micro-batch "
                f"({self.n_ubatch}); a block with bidirectional attention is decoded in one: "
                f"open the stream with batch_size >= {count} (and options n_ubatch >= "
                f"{count})")
        placeholder = self.placeholders.get(item.kind, before[-1] if before else 0)
        return MediaTokens(tuple(before), placeholder, count, tuple(after),
                           handle=(chunks, media))

    def decode(self, lane: Lane, item: MediaItem, tokens: MediaTokens, n_past: int,
               cancelled: Callable[[], bool]) -> int:
        """Encode and decode the media chunk at ``n_past`` of the lane's sequence (through
        :meth:`~eliza_llamacpp.lane.Lane.media`); returns the new ``n_past``."""
        mt = _mtmd()
        chunks: Chunks = tokens.handle[0]  # type: ignore[index]
        media: Any = tokens.handle[1]  # type: ignore[index]
        if not chunks.ptr:
            raise BackendRuntimeError("the media chunks were freed")
        projector, n_batch = self.projector, lane.n_batch

        def run(ctx: Any, seq: int, start: int) -> int:
            new_past = lc.llama_pos(start)
            with projector.lock:
                status = mt.mtmd_helper_eval_chunk_single(
                    projector.ctx, ctx, media, start, seq, n_batch, False,
                    ctypes.byref(new_past))
            if status != 0:
                if cancelled():
                    raise CancelledError("the media prefill was cancelled")
                raise BackendRuntimeError(f"libmtmd could not encode or decode the media "
                                          f"(status {status})")
            return int(new_past.value)

        # a negative id per content: equal media at equal places may share a prefix, no other
        return lane.media(n_past, run, -2 - int(item.digest[:15], 16))


__all__ = ["Chunks", "MediaFeeder", "Projector",
           "processor_image_tokens", "shared_projector"]
