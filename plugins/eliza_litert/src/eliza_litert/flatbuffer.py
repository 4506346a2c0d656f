"""Bounds-checked reads of a flatbuffer, with no flatbuffers dependency and no generated code.

One reader for both flatbuffers this plugin parses before a runtime sees them: a TFLite model
(:mod:`eliza_litert.tflite_check`, every table the runtimes read) and a ``.litertlm``'s header
(:mod:`eliza_litert.container`). Every offset, vtable, vector and string is checked against the
buffer's end (what the flatbuffers verifier does); a table's fields are addressed by their
number in the schema.
"""

from __future__ import annotations

import struct
from collections.abc import Sequence
from typing import Any


class FlatbufferError(Exception):
    """A read outside the buffer or a malformed table; the caller adds which file and where,
    and turns it into a :class:`~eliza_backends.BundleError` (so a read formats no message
    unless something is wrong)."""


class Flatbuffer:
    """Bounds-checked flatbuffer reads over ``buf`` (bytes, memoryview or mmap); every
    failure is a :class:`FlatbufferError`. ``where`` is the caller's note of what it is
    reading, for its message."""

    def __init__(self, buf: Any, what: str = "model") -> None:
        self.buf, self.size, self.what = buf, len(buf), what
        self.where: tuple[Any, ...] = ()
        self._vtables: dict[int, tuple[int, tuple[int, ...]]] = {}

    def need(self, pos: int, n: int, what: str) -> None:
        if pos < 0 or n < 0 or pos + n > self.size:
            raise FlatbufferError(f"{what} at byte {pos} (+{n}) is outside the {self.size}-byte "
                                  f"{self.what}")

    def root(self) -> list[int]:
        """Field positions of the root table."""
        return self.table(self.deref(0))

    def deref(self, pos: int) -> int:
        if pos < 0 or pos + 4 > self.size:
            self.need(pos, 4, "an offset")
        return pos + int(struct.unpack_from("<I", self.buf, pos)[0])

    def table(self, pos: int) -> list[int]:
        """Absolute field positions of the table at ``pos`` (0 for an absent field)."""
        self.need(pos, 4, "a table")
        vtable = pos - int(struct.unpack_from("<i", self.buf, pos)[0])
        layout = self._vtables.get(vtable)
        if layout is None:  # tables of one type usually share a vtable: check it once
            self.need(vtable, 4, "a vtable")
            vsize, tsize = struct.unpack_from("<HH", self.buf, vtable)
            if vsize < 4 or vsize % 2 or tsize < 4:
                raise FlatbufferError(f"a malformed vtable (sizes {vsize}, {tsize})")
            self.need(vtable, vsize, "a vtable")
            offsets = struct.unpack_from(f"<{(vsize - 4) // 2}H", self.buf, vtable + 4)
            if any(off and (off < 4 or off >= tsize) for off in offsets):
                raise FlatbufferError(f"a field outside its table's {tsize} bytes")
            layout = self._vtables[vtable] = (tsize, offsets)
        tsize, offsets = layout
        self.need(pos, tsize, "a table")
        return [pos + off if off else 0 for off in offsets]

    def vector(self, pos: int, elem: int) -> tuple[int, int]:
        """(first element position, length) of the vector ``pos`` points to."""
        vec = self.deref(pos)
        self.need(vec, 4, "a vector")
        n = int(struct.unpack_from("<I", self.buf, vec)[0])
        self.need(vec + 4, n * elem, f"a vector of {n} items")
        return vec + 4, n

    # field readers: ``fields`` from :meth:`table`, ``i`` the field number
    def ints(self, fields: Sequence[int], i: int, fmt: str = "i") -> tuple[int, ...]:
        pos = fields[i] if i < len(fields) else 0
        if not pos:
            return ()
        start, n = self.vector(pos, struct.calcsize(fmt))
        return struct.unpack_from(f"<{n}{fmt}", self.buf, start)

    def tables(self, fields: Sequence[int], i: int) -> list[list[int]]:
        pos = fields[i] if i < len(fields) else 0
        if not pos:
            return []
        start, n = self.vector(pos, 4)
        return [self.table(self.deref(start + 4 * k)) for k in range(n)]

    def sub(self, fields: Sequence[int], i: int) -> list[int] | None:
        pos = fields[i] if i < len(fields) else 0
        return self.table(self.deref(pos)) if pos else None

    def string(self, fields: Sequence[int], i: int) -> bytes | None:
        pos = fields[i] if i < len(fields) else 0
        if not pos:
            return None
        start, n = self.vector(pos, 1)
        self.need(start, n + 1, "a string's terminator")
        return bytes(self.buf[start:start + n])

    def scalar(self, fields: Sequence[int], i: int, fmt: str, default: int = 0) -> int:
        pos = fields[i] if i < len(fields) else 0
        if not pos:
            return default
        self.need(pos, struct.calcsize(fmt), "a field")
        return int(struct.unpack_from(fmt, self.buf, pos)[0])


__all__ = ["Flatbuffer", "FlatbufferError"]
