"""Structural validation of a TFLite flatbuffer, before either LiteRT runtime sees it.

ai-edge-litert's Interpreter and CompiledModel, and the LiteRT-LM engine, trust the model's
flatbuffer: an offset past the end, a vtable that overlaps nothing, or an *index* that is out of
range (a signature naming subgraph 7 of 3, an operator input naming tensor 9000 of 40, a tensor
naming a buffer that does not exist) reads outside the file and crashes the process
(``get_input_details()`` segfaults on an out-of-range signature subgraph index).

:func:`check_tflite_buffer` walks every table the runtimes read, with bounds checks on each
offset, vtable, vector and string (what the flatbuffers verifier does), and checks the indices
between them (subgraphs, tensors, buffers, operator codes, subgraph references inside operator
options), the tensor types, shapes and byte sizes. It reads only the flatbuffer's tables, never
the weights' bytes, so on a memory-mapped file it touches a few pages per megabyte of tables.
Anything wrong is a :class:`~eliza_backends.BundleError` that says what and where.

Field numbers follow TensorFlow Lite's ``schema.fbs`` (``ai_edge_litert.schema_py_generated``).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from eliza_backends import BundleError

from .flatbuffer import Flatbuffer, FlatbufferError

IDENTIFIER = b"TFL3"
_MAX_DEPTH = 64  # nested vectors/tables the walk follows (the schema needs fewer than 8)

# TensorType -> bytes per element (0 = sub-byte or variable: not size-checked)
TENSOR_TYPE_BYTES = {0: 4, 1: 2, 2: 4, 3: 1, 4: 8, 5: 0, 6: 1, 7: 2, 8: 8, 9: 1, 10: 8,
                     11: 16, 12: 8, 13: 0, 14: 0, 15: 4, 16: 2, 17: 0, 18: 2, 19: 0, 20: 0,
                     21: 1, 22: 1}
# A tensor may take at most this many bytes, or 16x the model's size if that is more: a shape
# damaged into millions of rows would otherwise make a prefill allocate or compute for hours.
_MIN_TENSOR_LIMIT = 1 << 30
_MAX_RANK = 16

# Option tables whose fields are not plain scalars: field -> (kind, element size). "subgraph" is
# a scalar subgraph index, "subgraphs" a vector of them. Builtin options, then options 2.
_OPTIONS: dict[int, dict[int, tuple[str, int]]] = {
    3: {1: ("vector", 4), 2: ("vector", 4)}, 8: {5: ("vector", 1)}, 17: {0: ("vector", 4)},
    30: {0: ("vector", 4)}, 92: {0: ("subgraph", 4), 1: ("subgraph", 4)},
    93: {0: ("subgraph", 4), 1: ("subgraph", 4)}, 103: {0: ("subgraph", 4)},
    111: {0: ("string", 1), 1: ("string", 1)}, 115: {0: ("vector", 4)},
}
_OPTIONS_2: dict[int, dict[int, tuple[str, int]]] = {
    2: {0: ("vector", 8)}, 3: {0: ("vector", 8), 1: ("vector", 8), 2: ("vector", 8)},
    4: {0: ("vector", 8), 1: ("vector", 8), 2: ("vector", 8), 3: ("vector", 8),
        4: ("vector", 1), 7: ("vector", 8), 10: ("vector", 8), 13: ("vector", 8),
        16: ("vector", 4)},
    5: {0: ("string", 1), 2: ("string", 1), 4: ("subgraphs", 4), 5: ("vector", 1)},
    6: {0: ("vector", 8), 1: ("subgraph", 4)},
    7: {1: ("vector", 8), 2: ("vector", 8), 3: ("vector", 8), 6: ("subgraph", 4)},
    9: {0: ("vector", 8)}, 10: {0: ("vector", 8), 1: ("vector", 8), 2: ("vector", 8)},
    12: {0: ("vector", 8), 1: ("vector", 8), 2: ("vector", 8), 3: ("vector", 8),
         4: ("vector", 4)},
    13: {0: ("vector", 8), 1: ("vector", 8), 2: ("vector", 8), 3: ("vector", 8),
         4: ("vector", 8), 5: ("subgraph", 4)},
    14: {2: ("subgraph", 4)}, 15: {0: ("subgraph", 4), 1: ("subgraph", 4)},
    16: {0: ("vector", 8), 1: ("vector", 8), 2: ("vector", 8), 4: ("vector", 8)},
    17: {0: ("vector", 8)}, 21: {0: ("string", 1), 1: ("subgraph", 4), 2: ("vector", 1)},
    23: {0: ("subgraphs", 4)},
}


# Operators that may omit an input (tensor index -1), and which inputs (None: any but the first).
# Elsewhere an omitted input is refused: CompiledModel kernels dereference it (a segfault).
_OPTIONAL_INPUTS: dict[int, frozenset[int] | None] = {
    3: frozenset({2}), 4: frozenset({2}), 9: frozenset({2}), 67: frozenset({3}),
    27: frozenset({3}), 132: frozenset({2}), 141: frozenset({3}),
    16: None, 44: None, 52: None, 46: None, 32: None,  # LSTM/RNN families, custom ops
}


# The fewest inputs a builtin operator reads (from TFLite's kernels; conservative: a model with
# fewer crashes some kernels, which read input k without checking the count). Operators not
# listed are only bounds-checked.
_MIN_INPUTS: dict[int, int] = {
    0: 2, 1: 1, 2: 1, 3: 2, 4: 2, 5: 1, 6: 1, 7: 2, 8: 1, 9: 2, 11: 1, 14: 1, 17: 1, 18: 2,
    19: 1, 20: 1, 21: 1, 22: 1, 23: 2, 25: 1, 26: 1, 28: 1, 34: 2, 36: 2, 39: 2, 40: 2, 41: 2,
    42: 2, 43: 1, 45: 4, 47: 1, 49: 2, 50: 1, 53: 1, 54: 2, 55: 2, 56: 2, 57: 2, 58: 2, 59: 1,
    61: 2, 62: 2, 63: 2, 64: 3, 65: 3, 66: 1, 69: 2, 70: 2, 71: 2, 72: 2, 73: 1, 74: 2, 75: 1,
    76: 1, 77: 1, 78: 2, 81: 2, 82: 2, 83: 1, 89: 2, 92: 1, 94: 2, 96: 3, 99: 2, 101: 1,
    102: 3, 107: 2, 108: 1, 114: 1, 122: 3, 123: 3, 126: 2, 150: 1, 151: 3,
}


def check_tflite_buffer(buf: Any, name: str) -> None:
    """Validate a whole TFLite model held in ``buf`` (bytes, memoryview or mmap)."""
    if len(buf) < 16 or bytes(buf[4:8]) != IDENTIFIER:
        raise _fail(name, "bad header (expected the flatbuffer identifier b'TFL3' at byte 4)")
    fb = Flatbuffer(buf)
    fb.where = ("the model table",)
    try:
        _walk(fb)
    except FlatbufferError as exc:
        where = " ".join(str(w) for w in fb.where)
        raise _fail(name, f"{where}: {exc}") from None


def _fail(name: str, what: str) -> BundleError:
    return BundleError(f"{name} is not a valid TFLite model: {what}. The file may be truncated "
                       "or corrupted; export it again")


def _walk(fb: Flatbuffer) -> None:
    model = fb.table(fb.deref(0))
    builtin_codes = []
    for i, f in enumerate(fb.tables(model, 1)):
        fb.where = ("operator code", i)
        fb.string(f, 1)
        builtin_codes.append(max(fb.scalar(f, 0, "<b"), fb.scalar(f, 3, "<i")))
        fb.scalar(f, 2, "<i")
    fb.where = ("the model table",)
    subgraphs = fb.tables(model, 2)
    if not subgraphs:
        raise FlatbufferError("it has no subgraphs")
    fb.string(model, 3)
    buffers = fb.tables(model, 4)
    buffer_sizes: list[int | None] = []
    for i, f in enumerate(buffers):
        fb.where = ("buffer", i)
        size = fb.vector(f[0], 1)[1] if f and f[0] else None
        offset, extent = fb.scalar(f, 1, "<Q"), fb.scalar(f, 2, "<Q")
        if offset > 1:  # data stored after the flatbuffer (models over 2 GB)
            if offset + extent > fb.size:
                raise FlatbufferError(f"its data spans bytes {offset}..{offset + extent}")
            size = extent
        buffer_sizes.append(size)
    n_buffers, n_subgraphs = len(buffers), len(subgraphs)
    fb.where = ("the model table",)
    if any(not 0 <= i < n_buffers for i in fb.ints(model, 5)):
        raise FlatbufferError(f"metadata_buffer names a buffer outside 0..{n_buffers - 1}")
    for i, f in enumerate(fb.tables(model, 6)):
        fb.where = ("metadata", i)
        fb.string(f, 0)
        if fb.scalar(f, 1, "<I") >= n_buffers:
            raise FlatbufferError(f"it names buffer {fb.scalar(f, 1, '<I')} of {n_buffers}")
    for i, f in enumerate(fb.tables(model, 8)):  # external buffer groups: a name each
        fb.where = ("external buffer group", i)
        fb.string(f, 0)
    fb.where = ("the model table",)
    fb.tables(model, 9)  # external buffers: scalars only

    limit = max(_MIN_TENSOR_LIMIT, 16 * fb.size)
    n_tensors_of = [_check_subgraph(fb, g, sg, builtin_codes, n_subgraphs, buffer_sizes, limit)
                    for g, sg in enumerate(subgraphs)]
    _check_signatures(fb, model, subgraphs, n_tensors_of)


def _check_subgraph(fb: Flatbuffer, g: int, sg: Sequence[int], builtin_codes: Sequence[int],
                    n_subgraphs: int, buffer_sizes: Sequence[int | None], limit: int) -> int:
    """Check subgraph ``g`` (its tensors, its operators in order, its inputs and outputs);
    returns its number of tensors."""
    n_opcodes = len(builtin_codes)
    fb.where = ("subgraph", g)
    tensors = fb.tables(sg, 0)
    n_t = len(tensors)
    given: set[int] = set()  # constants and variables: there before any operator runs
    for t, tf in enumerate(tensors):
        fb.where = ("subgraph", g, "tensor", t)
        if _check_tensor(fb, tf, n_t, buffer_sizes, limit):
            given.add(t)
    fb.where = ("subgraph", g)
    inputs, outputs = fb.ints(sg, 1), fb.ints(sg, 2)
    for i in (*inputs, *outputs):
        if not 0 <= i < n_t:
            raise FlatbufferError(f"its inputs or outputs name tensor {i} of {n_t}")
    ready = given | set(inputs)  # what an operator may read
    written: set[int] = set()
    for o, of in enumerate(fb.tables(sg, 3)):
        fb.where = ("subgraph", g, "operator", o)
        for t in _check_operator(fb, of, builtin_codes, n_opcodes, n_t, n_subgraphs):
            if t in written or (t in ready and t not in given):
                raise FlatbufferError(f"it writes tensor {t}, which a subgraph input or an "
                                      "earlier operator already provides")
            written.add(t)
        ready |= written
    fb.where = ("subgraph", g)
    missing = [t for t in outputs if t not in ready]
    if missing:
        raise FlatbufferError(f"its outputs {missing[:4]} are produced by no operator")
    fb.string(sg, 4)
    return n_t


def _check_signatures(fb: Flatbuffer, model: Sequence[int], subgraphs: Sequence[Sequence[int]],
                      n_tensors_of: Sequence[int]) -> None:
    """Check the model's signatures: each names a subgraph and distinct inputs / outputs of it."""
    n_subgraphs = len(subgraphs)
    io_of = [(set(fb.ints(sg, 1)), set(fb.ints(sg, 2))) for sg in subgraphs]
    for s, sf in enumerate(fb.tables(model, 7)):
        fb.where = ("signature", s)
        key = fb.string(sf, 2)
        fb.where = ("signature", s, f"({key.decode('utf-8', 'replace')})" if key else "")
        g = fb.scalar(sf, 4, "<I")
        if g >= n_subgraphs:
            raise FlatbufferError(f"it names subgraph {g} of {n_subgraphs}")
        for idx in (0, 1):
            seen: set[int] = set()
            for mf in fb.tables(sf, idx):
                fb.string(mf, 0)
                t = fb.scalar(mf, 1, "<I")
                if t >= n_tensors_of[g]:
                    raise FlatbufferError(
                        f"it names tensor {t} of subgraph {g}'s {n_tensors_of[g]}")
                if t not in io_of[g][idx] or t in seen:  # a runtime aborts on anything else
                    kind = "input" if idx == 0 else "output"
                    raise FlatbufferError(f"its {kind} names tensor {t}, which is not a "
                                          f"distinct {kind} of subgraph {g}")
                seen.add(t)


def _check_operator(fb: Flatbuffer, of: Sequence[int], builtin_codes: Sequence[int],
                    n_opcodes: int, n_tensors: int, n_subgraphs: int) -> tuple[int, ...]:
    """Check one operator; returns the tensors it writes."""
    code_index = fb.scalar(of, 0, "<I")
    if code_index >= n_opcodes:
        raise FlatbufferError(f"it names operator code {code_index} of {n_opcodes}")
    code = builtin_codes[code_index]
    inputs, outputs = fb.ints(of, 1), fb.ints(of, 2)
    if code in _MIN_INPUTS and (len(inputs) < _MIN_INPUTS[code] or not outputs):
        raise FlatbufferError(f"builtin operator {code} has {len(inputs)} inputs and "
                              f"{len(outputs)} outputs; it needs at least {_MIN_INPUTS[code]} "
                              "and 1")
    for k, i in enumerate(inputs):
        if i == -1:
            allowed = _OPTIONAL_INPUTS.get(code, frozenset())
            if k == 0 if allowed is None else k not in allowed:
                raise FlatbufferError(
                    f"builtin operator {code} omits its input {k}, which it needs")
        elif not 0 <= i < n_tensors:
            raise FlatbufferError(f"an input names tensor {i} of {n_tensors}")
    for i in (*outputs, *fb.ints(of, 8)):
        if not 0 <= i < n_tensors:
            raise FlatbufferError(f"an output or intermediate names tensor {i} of {n_tensors}")
    fb.ints(of, 5, "B")  # custom options
    fb.ints(of, 7, "B")  # mutating variable inputs
    large_at, large_n = fb.scalar(of, 9, "<Q"), fb.scalar(of, 10, "<Q")
    if large_at and large_at + large_n > fb.size:
        raise FlatbufferError(f"its custom options span bytes {large_at}..{large_at + large_n}")
    for type_idx, table_idx, schema in ((3, 4, _OPTIONS), (11, 12, _OPTIONS_2)):
        opt = fb.sub(of, table_idx)
        if opt is None:
            continue
        for fi, (fkind, size) in schema.get(fb.scalar(of, type_idx, "<B"), {}).items():
            if fi >= len(opt) or not opt[fi]:
                continue
            if fkind == "string":
                fb.string(opt, fi)
            elif fkind == "vector":
                fb.vector(opt[fi], size)
            else:
                refs = fb.ints(opt, fi) if fkind == "subgraphs" else (fb.scalar(opt, fi, "<i"),)
                if any(not 0 <= ref < n_subgraphs for ref in refs):
                    raise FlatbufferError(
                        f"its options name a subgraph outside 0..{n_subgraphs - 1}")
    return outputs


def _check_tensor(fb: Flatbuffer, tf: Sequence[int], n_tensors: int,
                  buffer_sizes: Sequence[int | None], limit: int) -> bool:
    """Check one tensor; True when it holds data before anything runs (a constant with
    bytes, or a variable)."""
    shape = fb.ints(tf, 0)
    ttype = fb.scalar(tf, 1, "<B")
    if ttype not in TENSOR_TYPE_BYTES:
        raise FlatbufferError(f"unknown tensor type {ttype}")
    buffer = fb.scalar(tf, 2, "<I")
    if buffer >= len(buffer_sizes):
        raise FlatbufferError(f"it names buffer {buffer} of {len(buffer_sizes)}")
    fb.string(tf, 3)
    if len(shape) > _MAX_RANK or any(d < 0 for d in shape):
        raise FlatbufferError(f"implausible shape {list(shape)[:8]} (rank {len(shape)})")
    n = 1
    for d in shape:
        n *= d
    nbytes = n * TENSOR_TYPE_BYTES[ttype]
    if nbytes > limit:
        raise FlatbufferError(f"shape {list(shape)} would take {nbytes} bytes, implausible for a "
                              f"{fb.size}-byte model")
    stored = buffer_sizes[buffer] if buffer else None
    if stored and TENSOR_TYPE_BYTES[ttype] and stored != nbytes:
        raise FlatbufferError(f"it has {stored} bytes of data for shape {list(shape)} ({nbytes} "
                              "expected)")
    qf = fb.sub(tf, 4)
    if qf is not None:
        fb.ints(qf, 0, "f")  # min
        fb.ints(qf, 1, "f")  # max
        scale = fb.ints(qf, 2, "f")
        fb.ints(qf, 3, "q")  # zero points
        details = fb.sub(qf, 5)
        kind = fb.scalar(qf, 4, "<B")
        if details is not None and kind == 1:  # CustomQuantization: custom bytes
            fb.ints(details, 0, "B")
        elif details is not None and kind == 2:  # BlockwiseQuantization: tensor indices
            for k in (0, 1):
                if not -1 <= fb.scalar(details, k, "<i", -1) < n_tensors:
                    raise FlatbufferError("its blockwise quantization names a missing tensor")
        dim = fb.scalar(qf, 6, "<i")
        if len(scale) > 1 and not 0 <= dim < max(len(shape), 1):
            raise FlatbufferError(f"it is quantized along dimension {dim} of {len(shape)}")
        if len(scale) > 1 and shape and len(scale) != shape[dim]:
            raise FlatbufferError(f"it has {len(scale)} scales for {shape[dim]} channels")
    spf = fb.sub(tf, 6)
    if spf is not None:
        fb.ints(spf, 0)  # traversal order
        fb.ints(spf, 1)  # block map
        for dmf in fb.tables(spf, 2):
            for union_idx in (3, 5):
                vf = fb.sub(dmf, union_idx)
                if vf is not None:
                    kind = fb.scalar(dmf, union_idx - 1, "<B")
                    fb.ints(vf, 0, {1: "i", 2: "H", 3: "B"}.get(kind, "B"))
    fb.ints(tf, 7)  # shape signature
    for vt in fb.tables(tf, 9):  # variant tensors
        fb.ints(vt, 0)
    return bool(stored) or bool(fb.scalar(tf, 5, "<B"))


__all__ = ["IDENTIFIER", "TENSOR_TYPE_BYTES", "check_tflite_buffer"]
