"""Slot files: a session's saved state, written atomically and checked before it is trusted.

Layout (all backends)::

    b"ELZSLOT2"                       8-byte magic and format version
    u32 little-endian                 header length in bytes (at most 16 MiB)
    32 bytes                          sha256 of header + payload
    header                            UTF-8 JSON, see :class:`SlotHeader`
    payload                           backend-specific state bytes (``payload_size`` of them)

The digest covers the header as well as the payload, so an edited token id or fingerprint in
the header is caught like a flipped bit in the KV state. The header names the backend,
fingerprints the model artifact and the runtime version, and holds the token history.
:func:`read_slot` checks all of it before anything reaches a native runtime, so a truncated,
corrupted or foreign file is a :class:`~eliza_backends.errors.SlotError`, never a crash.
:func:`write_slot` writes a temporary file beside the target, fsyncs it and renames it over
the target: a crash mid-save leaves the previous slot intact.

The header's model fingerprint is :func:`~eliza_backends.hashing.fingerprint_artifact`
(a sha256 of every byte of the artifact, cached per file version).
"""

from __future__ import annotations

import hashlib
import json
import os
import struct
import tempfile
from pathlib import Path

from pydantic import BaseModel, ConfigDict, Field, ValidationError

from ..errors import SlotError, Status, describe_validation_error

MAGIC = b"ELZSLOT2"
MAX_HEADER = 16 << 20
_HEAD = struct.Struct("<8sI32s")


class SlotHeader(BaseModel):
    """What a slot file says about itself."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    backend: str
    model_fingerprint: str
    runtime: str
    tokens: tuple[int, ...]
    payload_size: int = Field(ge=0)
    #: The media items in the sequence: ``[start, length, kind, digest]`` each.
    media: tuple[tuple[int, int, str, str], ...] = ()
    extra: dict[str, int | str | float | bool] = Field(default_factory=dict)


# ------------------------------------------------------------------------------ slot files

def _io_error(action: str, path: object, exc: OSError | ValueError) -> SlotError:
    reason = exc.strerror if isinstance(exc, OSError) and exc.strerror else str(exc)
    return SlotError(f"cannot {action} {path}: {reason}", code=Status.ERR_IO)


def write_slot(path: str | os.PathLike[str], header_fields: dict[str, object],
               payload: bytes) -> None:
    """Atomically write a slot file: temp file in the same directory, fsync, rename.

    ``header_fields`` are the :class:`SlotHeader` fields except the payload size. An
    unwritable directory or an invalid path is a :class:`SlotError` with ``ERR_IO``.
    """
    header = SlotHeader.model_validate({**header_fields, "payload_size": len(payload)})
    head = header.model_dump_json().encode("utf-8")
    digest = hashlib.sha256(head)
    digest.update(payload)
    target = Path(path)
    try:
        if not target.parent.is_dir():
            raise SlotError(f"cannot save slot: directory {target.parent} does not exist",
                            code=Status.ERR_IO)
        fd, tmp = tempfile.mkstemp(prefix=f".{target.name}.", suffix=".tmp",
                                   dir=target.parent)
    except (OSError, ValueError) as exc:  # permissions, a NUL in the path, a name too long
        raise _io_error("save slot to", target, exc) from None
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(_HEAD.pack(MAGIC, len(head), digest.digest()))
            f.write(head)
            f.write(payload)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, target)
    except OSError as exc:
        Path(tmp).unlink(missing_ok=True)
        raise _io_error("save slot to", target, exc) from None
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
    except (OSError, ValueError) as exc:
        raise _io_error("read slot file", source, exc) from None
    if data[:7] == MAGIC[:7] and data[:8] != MAGIC:
        raise SlotError(f"{source} is a slot file of another format version ({data[:8]!r}, "
                        f"this is {MAGIC!r}); prefill again and save a new one")
    if len(data) < _HEAD.size or data[:8] != MAGIC:
        raise SlotError(f"{source} is not an eliza-backends slot file (bad magic or truncated)")
    _, head_len, digest = _HEAD.unpack_from(data)
    body = memoryview(data)[_HEAD.size:]
    if head_len > MAX_HEADER or head_len > len(body):
        raise SlotError(f"{source} is truncated or corrupted (header length {head_len})")
    if hashlib.sha256(body).digest() != digest:
        raise SlotError(f"{source} is corrupted or truncated: its sha256 (over header and "
                        "payload) does not match; save it again")
    try:
        header = SlotHeader.model_validate(json.loads(bytes(body[:head_len])))
    except (ValueError, UnicodeDecodeError, RecursionError) as exc:
        detail = describe_validation_error(exc, "slot header") if isinstance(
            exc, ValidationError) else str(exc)
        raise SlotError(f"{source} has a corrupted header: {detail}") from None
    payload = bytes(body[head_len:])
    if len(payload) != header.payload_size:
        raise SlotError(f"{source} is truncated: payload has {len(payload)} of "
                        f"{header.payload_size} bytes; the save was interrupted, save it again")
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


__all__ = ["SlotHeader", "read_slot", "write_slot"]
