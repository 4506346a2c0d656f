"""Slot states that restore whatever the KV layout: one stream, or one stream per sequence.

llama.cpp writes a sequence's state as a head (``u32`` magic, ``i32`` sequence id), then its KV
cache: ``u32 n_stream``, then per stream ``u32 cell_count`` and, when it is not 0, that
stream's cells. A context with one KV cache per sequence
(``kv_unified = false``, :mod:`eliza_llamacpp.batch_engine`) has ``n_stream = parallel`` and keeps
sequence ``k`` in stream ``k``, so its state of sequence ``k`` is ``[n, 0 * k, count, cells,
0 * (n - 1 - k)]``; an own context (and a unified cache) writes ``[1, count, cells]``; and
llama.cpp refuses a state whose stream count is not the context's. :func:`to_one_stream` and
:func:`to_streams` convert between the two, so a slot saved on a batched sequence restores into
an own context and back, as it did with one unified cache.

Only a model with one KV cache is converted (the state is then exactly that one cache's);
a sliding-window model keeps two caches back to back, whose boundary the state does not mark:
its states keep the layout they were saved with (restoring one into the other layout is
llama.cpp's typed refusal, a :class:`~eliza_backends.errors.SlotError`).
"""

from __future__ import annotations

import struct

_U32 = struct.Struct("<I")
_ZERO = _U32.pack(0)
#: Bytes before the KV cache's state: llama.cpp's magic and the saved sequence's id.
HEAD = 8


def to_one_stream(state: memoryview, n_stream: int, stream: int) -> memoryview:
    """The one-stream form of ``state``, sequence ``stream``'s state in an ``n_stream`` cache
    of a model with one KV cache; ``state`` unchanged when it is not that layout. Converted in
    place, without copying the cells: the head moves up to where the stream count of the
    one-stream form goes, and the result is a view of ``state`` (a writable view; its bytes
    are reused)."""
    lead, tail = 4 * (stream + 1), 4 * (n_stream - 1 - stream)
    if n_stream <= 1 or len(state) < HEAD + 4 * (n_stream + 1) or \
            _U32.unpack_from(state, HEAD)[0] != n_stream or \
            any(state[HEAD + 4:HEAD + lead]) or any(state[len(state) - tail:]):
        return state
    start = lead - 4  # the one-stream form: head, 1, then the cells where they are
    state[start:start + HEAD] = bytes(state[:HEAD])
    _U32.pack_into(state, start + HEAD, 1)
    return state[start:len(state) - tail]  # (no cells: [1, 0])


def to_streams(state: bytes | memoryview, n_stream: int) -> bytes | memoryview:
    """``state`` in one stream (of a model with one KV cache) as an ``n_stream`` state (its
    cells in stream 0: llama.cpp loads a sequence's cells into that sequence's own stream,
    whichever the state names);
    ``state`` unchanged when it is not a one-stream state."""
    if n_stream <= 1 or len(state) < HEAD + 8 or _U32.unpack_from(state, HEAD)[0] != 1:
        return state
    return b"".join((state[:HEAD], _U32.pack(n_stream), state[HEAD + 4:],
                     _ZERO * (n_stream - 1)))


__all__ = ["HEAD", "to_one_stream", "to_streams"]
