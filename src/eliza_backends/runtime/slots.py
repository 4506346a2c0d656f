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

The model fingerprint (:func:`fingerprint_artifact`) is a sha256 of every byte of the artifact,
computed once per version of each file and cached, in this process and on disk, under the
file's (device, inode, size, mtime, ctime): strong (a model whose middle weights differ has
another fingerprint) and, after the first time, a ``stat`` per file.
"""

from __future__ import annotations

import hashlib
import json
import os
import struct
import tempfile
import threading
from pathlib import Path

from pydantic import BaseModel, ConfigDict, Field, ValidationError

from ..config import describe_validation_error
from ..errors import SlotError, Status

MAGIC = b"ELZSLOT2"
MAX_HEADER = 16 << 20
_HEAD = struct.Struct("<8sI32s")
CACHE_ENV = "ELIZA_CACHE_DIR"


class SlotHeader(BaseModel):
    """What a slot file says about itself."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    backend: str
    model_fingerprint: str
    runtime: str
    tokens: tuple[int, ...]
    payload_size: int = Field(ge=0)
    extra: dict[str, int | str | float | bool] = Field(default_factory=dict)


# ------------------------------------------------------------------------------ fingerprints

_memo: dict[tuple[int, ...], str] = {}
_memo_lock = threading.Lock()


def cache_dir() -> Path:
    """Where eliza-backends keeps what it can recompute (``$ELIZA_CACHE_DIR``, else
    ``$XDG_CACHE_HOME/eliza-backends``, else ``~/.cache/eliza-backends``)."""
    if os.environ.get(CACHE_ENV):
        return Path(os.environ[CACHE_ENV])
    base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return Path(base) / "eliza-backends"


def file_digest(path: str | os.PathLike[str]) -> str:
    """sha256 of every byte of the file, cached by (device, inode, size, mtime_ns, ctime_ns):
    any write to the file changes its ctime, so a stale digest is never reused. The first call
    for a file version reads it once (about 0.5-2 GB/s); later ones cost a ``stat``."""
    p = Path(path)
    st = p.stat()
    key = (st.st_dev, st.st_ino, st.st_size, st.st_mtime_ns, st.st_ctime_ns)
    with _memo_lock:
        if key in _memo:
            return _memo[key]
    name = hashlib.sha256(repr(key).encode()).hexdigest()[:32]
    entry = cache_dir() / "fingerprints" / name
    try:
        cached = entry.read_text(encoding="ascii").split()
        if len(cached) == 2 and cached[0] == repr(key).replace(" ", ""):
            digest = cached[1]
        else:
            raise OSError("stale or foreign entry")
    except (OSError, UnicodeDecodeError, ValueError):
        digest = _sha256_of(p)
        _store(entry, f"{repr(key).replace(' ', '')} {digest}\n")
    with _memo_lock:
        _memo[key] = digest
    return digest


def _sha256_of(path: Path) -> str:
    h = hashlib.sha256()
    buf = bytearray(1 << 20)
    view = memoryview(buf)
    with open(path, "rb", buffering=0) as f:
        while n := f.readinto(buf):
            h.update(view[:n])  # hashlib releases the GIL for large updates
    return h.hexdigest()


def _store(entry: Path, text: str) -> None:
    """Write a cache entry atomically; a cache that cannot be written is simply not used."""
    try:
        entry.parent.mkdir(parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(dir=entry.parent, prefix=".fp.")
        with os.fdopen(fd, "w", encoding="ascii") as f:
            f.write(text)
        os.replace(tmp, entry)
    except OSError:
        pass


def fingerprint_artifact(path: str | os.PathLike[str]) -> str:
    """The identity of a model artifact (a file, or a directory of files): sha256 over each
    file's relative name and :func:`file_digest`."""
    root = Path(path)
    h = hashlib.sha256(b"eliza-fingerprint-2\0")
    try:
        files = [root] if root.is_file() else sorted(p for p in root.rglob("*") if p.is_file())
        for f in files:
            name = f.relative_to(root).as_posix() if f != root else f.name
            h.update(f"{name}\0{file_digest(f)}\0".encode())
    except OSError as exc:
        raise _io_error("fingerprint the model artifact", root, exc) from None
    return h.hexdigest()


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


__all__ = ["CACHE_ENV", "SlotHeader", "cache_dir", "file_digest", "fingerprint_artifact",
           "read_slot", "write_slot"]
