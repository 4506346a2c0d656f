"""File hashing, in one place: the sha256 of a file's bytes, the cached digest of a file version
and the fingerprint of a model artifact.

* :func:`sha256_file` reads every byte, every time: what a bundle manifest records and what
  ``verify_bundle`` checks (a flipped bit is found even when the file's stat is unchanged).
* :func:`file_digest` is the same sha256, computed once per version of each file and cached, in
  this process and on disk, under the file's (device, inode, size, mtime, ctime): after the
  first time, a ``stat`` per file.
* :func:`fingerprint_artifact` is the identity of a model artifact (a file or a directory), the
  sha256 over each file's name and :func:`file_digest`: strong (a model whose middle weights
  differ has another fingerprint) and cheap. Slot files and the structured-output vocabulary
  cache are keyed by it.

The on-disk cache lives under :func:`cache_dir` (also the conversion cache's root). Threads:
every function is safe from any thread.
"""

from __future__ import annotations

import os
import threading
from pathlib import Path

from .errors import SlotError, Status

CACHE_ENV = "ELIZA_CACHE_DIR"
CHUNK = 1 << 20

_memo: dict[tuple[int, ...], str] = {}
_memo_lock = threading.Lock()


def cache_dir() -> Path:
    """Where eliza-backends keeps what it can recompute (``$ELIZA_CACHE_DIR``, else
    ``$XDG_CACHE_HOME/eliza-backends``, else ``~/.cache/eliza-backends``)."""
    if os.environ.get(CACHE_ENV):
        return Path(os.environ[CACHE_ENV])
    base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return Path(base) / "eliza-backends"


def sha256_file(path: str | os.PathLike[str], chunk: int = CHUNK) -> str:
    """Hex sha256 of every byte of a file, read ``chunk`` bytes at a time (no cache)."""
    import hashlib  # on first use: opening a stream does not start OpenSSL

    h = hashlib.sha256()
    buf = bytearray(chunk)
    view = memoryview(buf)
    with open(path, "rb", buffering=0) as f:
        while n := f.readinto(buf):
            h.update(view[:n])  # hashlib releases the GIL for large updates
    return h.hexdigest()


def file_digest(path: str | os.PathLike[str]) -> str:
    """sha256 of every byte of the file, cached by (device, inode, size, mtime_ns, ctime_ns):
    any write to the file changes its ctime, so a stale digest is never reused. The first call
    for a file version reads it once (about 0.5-2 GB/s); later ones cost a ``stat``."""
    import hashlib  # on first use: opening a stream does not start OpenSSL

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
        digest = sha256_file(p)
        _store(entry, f"{repr(key).replace(' ', '')} {digest}\n")
    with _memo_lock:
        _memo[key] = digest
    return digest


def _store(entry: Path, text: str) -> None:
    """Write a cache entry atomically; a cache that cannot be written is simply not used."""
    import tempfile  # (with shutil and random) only when an entry is written

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
    file's relative name and :func:`file_digest`. An unreadable artifact is a
    :class:`~eliza_backends.errors.SlotError` with ``ERR_IO``."""
    import hashlib  # on first use: opening a stream does not start OpenSSL

    root = Path(path)
    h = hashlib.sha256(b"eliza-fingerprint-2\0")
    try:
        files = [root] if root.is_file() else sorted(p for p in root.rglob("*") if p.is_file())
        for f in files:
            name = f.relative_to(root).as_posix() if f != root else f.name
            h.update(f"{name}\0{file_digest(f)}\0".encode())
    except OSError as exc:
        reason = exc.strerror or str(exc)
        raise SlotError(f"cannot fingerprint the model artifact {root}: {reason}",
                        code=Status.ERR_IO) from None
    return h.hexdigest()


__all__ = ["CACHE_ENV", "cache_dir", "file_digest", "fingerprint_artifact", "sha256_file"]
