"""The GGUF fixed header, checked in Python before llama.cpp opens a file.

A GGUF starts with 24 fixed bytes: the magic ``b"GGUF"``, a u32 version and two u64 counts
(tensors, metadata pairs). :func:`check_gguf` reads only those, in microseconds whatever the
file's size, and refuses what is plainly not a GGUF llama.cpp reads (wrong magic, version, an
implausible count, a file too short to hold what the counts promise) with a clear
:class:`~eliza_backends.BundleError`.

:func:`gguf_metadata` reads a few metadata values (the multimodal projector's kinds,
:func:`projector_kinds`) for ``explain()`` and ``can_serve``-time probes, without importing
llama_cpp. Everything after those bytes (metadata, the vocabulary, the tensor table) is walked by
llama.cpp's own GGUF reader, which bounds-checks it in C at load time; that load runs contained
(:mod:`eliza_llamacpp.native_guard`), so a file whose *values* make llama.cpp abort is a
``BundleError`` too, and the values that would only fail later, inside a decode, are checked
on the loaded model (:mod:`eliza_llamacpp.model_checks`). A pure-Python walk of the whole
header cost 0.3 s on Gemma 3's 262k-string vocabulary; this check costs O(1).
"""

from __future__ import annotations

import os
import struct
from dataclasses import dataclass
from pathlib import Path
from typing import Any, BinaryIO

from eliza_backends import BundleError, EmbeddingSpec
from eliza_backends.backend import find_artifacts, matryoshka_dimensions

MAGIC = b"GGUF"
VERSIONS = (2, 3)
_MAX_COUNT = 1 << 24
_FIXED = struct.Struct("<4sIQQ")
# the smallest possible metadata pair and tensor info, in bytes
_MIN_KV = 8 + 1 + 4 + 1
_MIN_TENSOR = 8 + 1 + 4 + 8 + 4 + 8


@dataclass(frozen=True)
class GGUFHeader:
    """What the fixed header says: version and counts, and the file's size in bytes."""

    version: int
    n_tensors: int
    n_kv: int
    size: int


def _bad(path: Path, what: str) -> BundleError:
    return BundleError(f"{path} is not a valid GGUF file: {what}. The download may be "
                       "truncated or corrupted; fetch it again")


def check_gguf(path: str | os.PathLike[str]) -> GGUFHeader:
    """Validate the fixed header of ``path``; raise :class:`BundleError` on anything wrong."""
    p = Path(path)
    try:
        with open(p, "rb") as f:
            size = os.fstat(f.fileno()).st_size
            head = f.read(_FIXED.size)
    except OSError as exc:
        raise BundleError(f"cannot open {p}: {exc.strerror or exc}") from None
    if len(head) < 4 or head[:4] != MAGIC:
        raise _bad(p, "bad magic (expected b'GGUF')")
    if len(head) < _FIXED.size:
        raise _bad(p, f"the file ends inside its {_FIXED.size}-byte header ({size} bytes)")
    _, version, n_tensors, n_kv = _FIXED.unpack(head)
    if version not in VERSIONS:
        raise _bad(p, f"unsupported version {version} (llama.cpp reads 2 and 3)")
    if n_tensors > _MAX_COUNT or n_kv > _MAX_COUNT:
        raise _bad(p, f"implausible counts ({n_tensors} tensors, {n_kv} metadata keys)")
    if _FIXED.size + n_kv * _MIN_KV + n_tensors * _MIN_TENSOR > size:
        raise _bad(p, f"{n_kv} metadata keys and {n_tensors} tensors cannot fit in "
                   f"{size} bytes (truncated?)")
    return GGUFHeader(version, n_tensors, n_kv, size)


#: Architectures of an MTP assistant over a target's context (``gemma4-assistant``: Gemma 4's),
#: each with the target architectures it can run over: what llama.cpp's MTP context
#: (``LLAMA_CONTEXT_TYPE_MTP``) implements. :func:`gguf_architecture` finds them under
#: text/draft/ without importing llama_cpp.
MTP_ARCHITECTURES: dict[str, frozenset[str]] = {"gemma4-assistant": frozenset({"gemma4"})}

_STRING = 8  # gguf_type GGUF_TYPE_STRING
_ARCH_KEY = b"general.architecture"


def gguf_architecture(path: str | os.PathLike[str]) -> str | None:
    """The ``general.architecture`` of a GGUF when it is the first metadata pair (where every
    converter writes it), read from the first few hundred bytes; None when the file is not a
    GGUF or the first pair is something else. A cheap probe for choosing among draft files
    (``gemma4-assistant`` is Gemma 4's MTP assistant); llama.cpp's load is the real check."""
    try:
        with open(path, "rb") as f:
            head = f.read(_FIXED.size + 8 + len(_ARCH_KEY) + 4 + 8 + 64)
    except OSError:
        return None
    if len(head) < _FIXED.size + 8 or head[:4] != MAGIC:
        return None
    at = _FIXED.size
    (n_key,) = struct.unpack_from("<Q", head, at)
    at += 8
    if n_key != len(_ARCH_KEY) or head[at:at + n_key] != _ARCH_KEY:
        return None
    at += n_key
    if len(head) < at + 12 or struct.unpack_from("<I", head, at)[0] != _STRING:
        return None
    (n_val,) = struct.unpack_from("<Q", head, at + 4)
    value = head[at + 12:at + 12 + n_val]
    if n_val > 64 or len(value) != n_val:
        return None
    return value.decode("ascii", "replace")


# ------------------------------------------------------------------ metadata probes

#: GGUF metadata value types (``gguf_type``) read by :func:`gguf_metadata`: scalars by struct
#: format; strings and arrays walked.
def find_projector(bundle_dir: str | os.PathLike[str]) -> Path | None:
    """The bundle's projector GGUF (role ``mmproj``: the first under ``text/mmproj/`` by
    name), or None."""
    found = find_artifacts(bundle_dir, ("gguf",), role="mmproj")
    return found[0] if found else None


_SCALARS = {0: "<B", 1: "<b", 2: "<H", 3: "<h", 4: "<I", 5: "<i", 6: "<f", 7: "<?", 10: "<Q",
            11: "<q", 12: "<d"}
_ARRAY = 9


def _read(f: BinaryIO, fmt: str) -> Any:
    size = struct.calcsize(fmt)
    data = f.read(size)
    if len(data) != size:
        raise EOFError
    return struct.unpack(fmt, data)[0]


_U64 = struct.Struct("<Q")
_MAX_STRING = 1 << 20
_CHUNK = 1 << 20


def _skip_strings(f: BinaryIO, count: int) -> None:
    """Move ``f`` past ``count`` GGUF strings (a u64 length, then the bytes), read a chunk at
    a time: the vocabulary arrays hold 49k-262k strings, which a read and a decode per
    string took 30 ms (SmolLM2) to 0.3 s (Gemma 3) to walk. Raises :class:`EOFError` on a
    short file and :class:`ValueError` on a string over 1 MiB, as :func:`_value` does."""
    pos = f.tell()
    while count:
        chunk = f.read(_CHUNK)
        if len(chunk) < 8:
            raise EOFError
        at, last, unpack = 0, len(chunk) - 8, _U64.unpack_from
        while count and at <= last:
            (length,) = unpack(chunk, at)
            if length > _MAX_STRING:
                raise ValueError("string too long")
            if at + length > last:
                break
            at += 8 + length
            count -= 1
        if count and at == 0:  # one string longer than what is left of the chunk
            at, count = 8 + _U64.unpack_from(chunk, 0)[0], count - 1
        pos += at
        f.seek(pos)


def _value(f: BinaryIO, kind: int) -> Any:
    if kind in _SCALARS:
        return _read(f, _SCALARS[kind])
    if kind == _STRING:
        n = _read(f, "<Q")
        if n > 1 << 20:
            raise ValueError("string too long")
        return f.read(n).decode("utf-8", "replace")
    if kind == _ARRAY:
        inner, n = _read(f, "<I"), _read(f, "<Q")
        if inner in _SCALARS:  # skip the elements
            f.seek(n * struct.calcsize(_SCALARS[inner]), 1)
        elif inner == _STRING:  # a vocabulary: skipped without decoding
            _skip_strings(f, n)
        else:
            for _ in range(n):
                _value(f, inner)
        return None
    raise ValueError(f"unknown GGUF value type {kind}")


def gguf_metadata(path: Path, keys: frozenset[str]) -> dict[str, Any]:
    """The values of ``keys`` in a GGUF's metadata (absent keys are left out); {} for a file
    that is not a readable GGUF."""
    out: dict[str, Any] = {}
    try:
        with open(path, "rb") as f:
            if f.read(4) != b"GGUF":
                return {}
            _read(f, "<I")  # version
            _read(f, "<Q")  # tensors
            for _ in range(min(_read(f, "<Q"), 4096)):
                name_len = _read(f, "<Q")
                name = f.read(name_len).decode("utf-8", "replace")
                value = _value(f, _read(f, "<I"))
                if name in keys:
                    out[name] = value
    except (OSError, EOFError, ValueError, struct.error):
        return out
    return out


_KIND_KEYS = {"image": ("clip.has_vision_encoder", "clip.vision.projector_type"),
              "audio": ("clip.has_audio_encoder", "clip.audio.projector_type")}


def projector_kinds(bundle_dir: str | os.PathLike[str]) -> dict[str, str]:
    """The media kinds the bundle's projector encodes, each with a line for ``explain()``
    (a metadata probe, no load); {} without a projector."""
    path = find_projector(bundle_dir)
    if path is None:
        return {}
    keys = frozenset(k for pair in _KIND_KEYS.values() for k in pair) | {"clip.projector_type"}
    meta = gguf_metadata(path, keys)
    rel = path.relative_to(Path(bundle_dir)).as_posix()
    out = {}
    for kind, (has, proj) in _KIND_KEYS.items():
        if meta.get(has):
            out[kind] = f"{rel} ({meta.get(proj) or meta.get('clip.projector_type', '?')}, " \
                        "libmtmd)"
    return out


#: llama.cpp's ``LLAMA_POOLING_TYPE_*`` values an embedding model may carry.
_POOLING = {1: "mean", 2: "cls", 3: "last"}


def embedding_spec(path: Path, bundle_dir: str | os.PathLike[str]) -> EmbeddingSpec | None:
    """The :class:`EmbeddingSpec` of the GGUF at ``path`` when it is an embedding model (its
    ``<arch>.pooling_type`` is mean, CLS or last), else None; a header probe. The vector length
    is the last Dense layer's output (``dense_3_feat_out`` / ``dense_2_feat_out``) or the
    embedding length; the Matryoshka lengths come from the bundle's ``embedding.json``."""
    arch = gguf_architecture(path)
    if not arch:
        return None
    keys = ("pooling_type", "dense_3_feat_out", "dense_2_feat_out", "embedding_length")
    meta = gguf_metadata(path, frozenset(f"{arch}.{k}" for k in keys))
    pooling = _POOLING.get(meta.get(f"{arch}.pooling_type", 0))
    if pooling is None:
        return None
    dims = next((int(meta[f"{arch}.{k}"]) for k in keys[1:] if f"{arch}.{k}" in meta), 0)
    if dims <= 0:
        return None
    return EmbeddingSpec(dimensions=dims, pooling=pooling,  # type: ignore[arg-type]
                         matryoshka=matryoshka_dimensions(bundle_dir, dims))


__all__ = [
    "MTP_ARCHITECTURES",
    "GGUFHeader",
    "check_gguf",
    "embedding_spec",
    "find_projector",
    "gguf_architecture",
    "gguf_metadata",
    "projector_kinds",
]

