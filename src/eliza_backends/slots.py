"""Slot files: a session's saved state, written atomically and checked before it is trusted.

Layout (all backends)::

    b"ELZSLOT1"                       8-byte magic and format version
    u32 little-endian                 header length in bytes (at most 16 MiB)
    header                            UTF-8 JSON, see :class:`SlotHeader`
    payload                           backend-specific state bytes (``payload_size`` of them)

The header names the backend, fingerprints the model artifact and the runtime version, holds the
token history, and carries the payload's sha256. :func:`read_slot` checks all of it before
anything reaches a native runtime, so a truncated, corrupted or foreign file is a
:class:`~eliza_backends.errors.SlotError`, never a crash. :func:`write_slot` writes a temporary
file beside the target, fsyncs it and renames it over the target: a crash mid-save leaves the
previous slot intact.
"""

from __future__ import annotations

import hashlib
import json
import os
import struct
import tempfile
from pathlib import Path

from pydantic import BaseModel, ConfigDict, Field, ValidationError

from .config import describe_validation_error
from .errors import SlotError, Status

MAGIC = b"ELZSLOT1"
MAX_HEADER = 16 << 20
_HEAD = struct.Struct("<8sI")


class SlotHeader(BaseModel):
    """What a slot file says about itself."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    backend: str
    model_fingerprint: str
    runtime: str
    tokens: tuple[int, ...]
    payload_size: int = Field(ge=0)
    payload_sha256: str = Field(pattern=r"^[0-9a-f]{64}$")
    extra: dict[str, int | str | float | bool] = Field(default_factory=dict)


def fingerprint_artifact(path: str | os.PathLike[str], sample: int = 1 << 20) -> str:
    """A cheap identity for a model artifact (file or directory): sha256 over each file's
    relative name, size, first and last ``sample`` bytes. Reads at most 2 MiB per file."""
    root = Path(path)
    files = [root] if root.is_file() else sorted(p for p in root.rglob("*") if p.is_file())
    h = hashlib.sha256()
    for f in files:
        size = f.stat().st_size
        h.update(f"{f.relative_to(root) if f != root else f.name}\0{size}\0".encode())
        with open(f, "rb") as fh:
            h.update(fh.read(sample))
            if size > 2 * sample:
                fh.seek(size - sample)
                h.update(fh.read(sample))
    return h.hexdigest()


def write_slot(path: str | os.PathLike[str], header_fields: dict[str, object],
               payload: bytes) -> None:
    """Atomically write a slot file: temp file in the same directory, fsync, rename.

    ``header_fields`` are the :class:`SlotHeader` fields except the payload size and hash.
    """
    target = Path(path)
    header = SlotHeader.model_validate(
        {**header_fields, "payload_size": len(payload),
         "payload_sha256": hashlib.sha256(payload).hexdigest()}
    )
    head = header.model_dump_json().encode("utf-8")
    if not target.parent.is_dir():
        raise SlotError(f"cannot save slot: directory {target.parent} does not exist",
                        code=Status.ERR_IO)
    fd, tmp = tempfile.mkstemp(prefix=f".{target.name}.", suffix=".tmp", dir=target.parent)
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(_HEAD.pack(MAGIC, len(head)))
            f.write(head)
            f.write(payload)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, target)
    except OSError as exc:
        Path(tmp).unlink(missing_ok=True)
        raise SlotError(f"cannot save slot to {target}: {exc.strerror or exc}",
                        code=Status.ERR_IO) from None
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
    try:  # make the rename itself durable
        dir_fd = os.open(target.parent, os.O_RDONLY)
        try:
            os.fsync(dir_fd)
        finally:
            os.close(dir_fd)
    except OSError:
        pass


def read_slot(
    path: str | os.PathLike[str], *, backend: str, model_fingerprint: str, runtime: str
) -> tuple[SlotHeader, bytes]:
    """Read and fully validate a slot file made by ``backend`` for this model and runtime."""
    source = Path(path)
    try:
        data = source.read_bytes()
    except FileNotFoundError:
        raise SlotError(f"slot file {source} does not exist", code=Status.ERR_IO) from None
    except OSError as exc:
        raise SlotError(f"cannot read slot file {source}: {exc.strerror}",
                        code=Status.ERR_IO) from None
    if len(data) < _HEAD.size or data[:8] != MAGIC:
        raise SlotError(f"{source} is not an eliza-backends slot file (bad magic or truncated)")
    _, head_len = _HEAD.unpack_from(data)
    body = data[_HEAD.size:]
    if head_len > MAX_HEADER or head_len > len(body):
        raise SlotError(f"{source} is truncated or corrupted (header length {head_len})")
    try:
        header = SlotHeader.model_validate(json.loads(body[:head_len]))
    except (ValueError, UnicodeDecodeError, RecursionError) as exc:
        detail = describe_validation_error(exc, "slot header") if isinstance(
            exc, ValidationError) else str(exc)
        raise SlotError(f"{source} has a corrupted header: {detail}") from None
    payload = body[head_len:]
    if len(payload) != header.payload_size:
        raise SlotError(f"{source} is truncated: payload has {len(payload)} of "
                        f"{header.payload_size} bytes; the save was interrupted, save it again")
    if hashlib.sha256(payload).hexdigest() != header.payload_sha256:
        raise SlotError(f"{source} is corrupted: payload sha256 does not match its header")
    if header.backend != backend:
        raise SlotError(f"{source} was saved by backend {header.backend!r}, not {backend!r}; "
                        "restore it with the backend that saved it")
    if header.model_fingerprint != model_fingerprint:
        raise SlotError(f"{source} was saved with a different model; restore it on the model "
                        "that saved it, or prefill again")
    if header.runtime != runtime:
        raise SlotError(f"{source} was saved by runtime {header.runtime!r}, this is {runtime!r}; "
                        "slot state is not portable across runtime versions, prefill again")
    return header, payload


__all__ = ["SlotHeader", "fingerprint_artifact", "read_slot", "write_slot"]
