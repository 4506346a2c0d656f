"""Pure-Python GGUF header check, run before llama.cpp sees a file.

llama.cpp trusts its input; a file with a bad magic, a truncated metadata section or a tensor
table pointing past the end of the file must be refused here with a clear
:class:`~eliza_backends.BundleError`. :func:`check_gguf` walks the whole header (metadata and
tensor infos) with bounds checks and never reads tensor data.
"""

from __future__ import annotations

import os
import struct
from dataclasses import dataclass
from pathlib import Path
from typing import BinaryIO

from eliza_backends import BundleError

MAGIC = b"GGUF"
_MAX_STRING = 64 << 20
_MAX_ARRAY = 1 << 28
_MAX_COUNT = 1 << 24

# ggml type id -> (elements per block, bytes per block); unknown types are only bounds-checked.
_TYPE_SIZES: dict[int, tuple[int, int]] = {
    0: (1, 4), 1: (1, 2), 2: (32, 18), 3: (32, 20), 6: (32, 22), 7: (32, 24), 8: (32, 34),
    9: (32, 36), 10: (256, 84), 11: (256, 110), 12: (256, 144), 13: (256, 176),
    14: (256, 210), 15: (256, 292), 24: (1, 1), 25: (1, 2), 26: (1, 4), 27: (1, 8),
    28: (1, 8), 30: (1, 2),
}
# gguf value type -> struct format of a scalar
_SCALARS = {0: "<B", 1: "<b", 2: "<H", 3: "<h", 4: "<I", 5: "<i", 6: "<f", 7: "<?",
            10: "<Q", 11: "<q", 12: "<d"}
_STRING, _ARRAY = 8, 9


@dataclass(frozen=True)
class GGUFHeader:
    """What the header says: version, counts, and the metadata keys seen."""

    version: int
    n_tensors: int
    n_kv: int
    keys: tuple[str, ...]
    data_offset: int


class _Reader:
    def __init__(self, f: BinaryIO, size: int, name: str) -> None:
        self.f, self.size, self.name = f, size, name

    def fail(self, what: str) -> BundleError:
        return BundleError(f"{self.name} is not a valid GGUF file: {what}. The download may be "
                           "truncated or corrupted; fetch it again")

    def read(self, n: int) -> bytes:
        data = self.f.read(n)
        if len(data) != n:
            raise self.fail(f"unexpected end of file at byte {self.f.tell()}")
        return data

    def unpack(self, fmt: str) -> int | float | bool:
        value: int | float | bool = struct.unpack(fmt, self.read(struct.calcsize(fmt)))[0]
        return value

    def u32(self) -> int:
        return int(self.unpack("<I"))

    def u64(self) -> int:
        return int(self.unpack("<Q"))

    def string(self) -> bytes:
        n = self.u64()
        if n > _MAX_STRING or self.f.tell() + n > self.size:
            raise self.fail(f"string of {n} bytes runs past the end of the file")
        return self.read(n)

    def skip_value(self, vtype: int, depth: int = 0) -> None:
        if vtype in _SCALARS:
            self.read(struct.calcsize(_SCALARS[vtype]))
        elif vtype == _STRING:
            self.string()
        elif vtype == _ARRAY and depth < 2:
            etype, n = self.u32(), self.u64()
            if n > _MAX_ARRAY:
                raise self.fail(f"array of {n} items")
            if etype in _SCALARS:
                width = struct.calcsize(_SCALARS[etype])
                if self.f.tell() + n * width > self.size:
                    raise self.fail("array runs past the end of the file")
                self.f.seek(n * width, os.SEEK_CUR)
            else:
                for _ in range(n):
                    self.skip_value(etype, depth + 1)
        else:
            raise self.fail(f"unknown metadata value type {vtype}")


def check_gguf(path: str | os.PathLike[str]) -> GGUFHeader:
    """Validate the GGUF header of ``path``; raise :class:`BundleError` on anything wrong."""
    p = Path(path)
    try:
        size = p.stat().st_size
        f = open(p, "rb")  # noqa: SIM115 - closed by the `with f` below
    except OSError as exc:
        raise BundleError(f"cannot open {p}: {exc.strerror}") from None
    with f:
        r = _Reader(f, size, str(p))
        if size < 24 or r.read(4) != MAGIC:
            raise r.fail("bad magic (expected b'GGUF')")
        version = r.u32()
        if version not in (2, 3):
            raise r.fail(f"unsupported version {version} (llama.cpp reads 2 and 3)")
        n_tensors, n_kv = r.u64(), r.u64()
        if n_tensors > _MAX_COUNT or n_kv > _MAX_COUNT:
            raise r.fail(f"implausible counts ({n_tensors} tensors, {n_kv} metadata keys)")
        keys = []
        alignment = 32
        for _ in range(n_kv):
            key = r.string().decode("utf-8", "replace")
            vtype = r.u32()
            if key == "general.alignment" and vtype == 4:
                alignment = r.u32()
                if alignment == 0 or alignment & (alignment - 1):
                    raise r.fail(f"general.alignment {alignment} is not a power of two")
            else:
                r.skip_value(vtype)
            keys.append(key)
        tensors = []
        for _ in range(n_tensors):
            name = r.string()
            n_dims = r.u32()
            if not 1 <= n_dims <= 4:
                raise r.fail(f"tensor {name!r} has {n_dims} dimensions")
            dims = [r.u64() for _ in range(n_dims)]
            ttype, offset = r.u32(), r.u64()
            tensors.append((name, dims, ttype, offset))
        data_offset = -(-f.tell() // alignment) * alignment
        for name, dims, ttype, offset in tensors:
            n_el = 1
            for d in dims:
                n_el *= d
            block, nbytes = _TYPE_SIZES.get(ttype, (1, 0))
            end = data_offset + offset + (n_el // block) * nbytes
            if offset % alignment or end > size:
                raise r.fail(f"tensor {name.decode('utf-8', 'replace')!r} data ends at byte "
                             f"{end}, past the file's {size} bytes (truncated tensor data)")
        return GGUFHeader(version, n_tensors, n_kv, tuple(keys), data_offset)


__all__ = ["GGUFHeader", "check_gguf"]
