"""The files the LiteRT runtimes map, so that the weights are mapped and never copied.

ai-edge-litert takes a model as a file path, which it memory-maps, or as Python ``bytes``, a
private heap copy of the whole model (its wrappers accept nothing else, not a memoryview). So:

* a ``.tflite`` is mapped where it is;
* a ``.litertlm``'s TFLite section is copied once, file to file (``os.copy_file_range``, never
  through Python memory), to ``<work dir>/<key>.tflite``, and mapped from there;
* XNNPACK packs fp32 matmul weights into its own layout on first use: a second copy of them on
  the heap. The CompiledModel runtime is given a weight cache file, ``<work dir>/<key>.xnnpack``:
  XNNPACK packs into that file and maps it, so the packed copy is file-backed and a later load
  from the same dir maps it without packing (or touching the original weights it replaces).
  The Interpreter runtime has no such switch in ai-edge-litert's Python API: it still packs on
  the heap.

``<key>`` is the source's stem, size and modification time, so a changed file gets new copies.
The work dir is the ``cache_dir`` option (kept: later loads skip the copy and the packing) or a
temporary directory the loaded model owns, removed with it. Measured on SmolLM2-135M fp32
(benchmarks/bench_memory.py).
"""

from __future__ import annotations

import os
import shutil
import tempfile
from dataclasses import dataclass
from pathlib import Path

from eliza_backends import BundleError, InvalidArgumentError

from .container import Container

_CHUNK = 64 << 20


@dataclass(frozen=True)
class ModelFiles:
    """``model``: the ``.tflite`` to map; ``weight_cache``: XNNPACK's packed-weight file for it
    (made on first use); ``work_dir``: where copies and caches go, removed by :meth:`remove`
    when ``owns_work_dir``."""

    model: Path
    weight_cache: Path
    work_dir: Path
    owns_work_dir: bool

    def remove(self) -> None:
        """Delete the work dir if this object made it (mappings already made stay valid)."""
        if self.owns_work_dir:
            shutil.rmtree(self.work_dir, ignore_errors=True)


def _key(path: Path) -> str:
    st = path.stat()
    return f"{path.stem}-{st.st_size}-{st.st_mtime_ns}"


def _copy_range(src: Path, begin: int, size: int, dst: Path) -> None:
    """``size`` bytes of ``src`` from ``begin`` into a new ``dst``, atomically (a partial copy
    never appears under ``dst``'s name)."""
    tmp = dst.with_name(f".{dst.name}.{os.getpid()}.part")
    try:
        with open(src, "rb") as fin, open(tmp, "wb") as fout:
            done = 0
            while done < size:
                n = min(_CHUNK, size - done)
                if hasattr(os, "copy_file_range"):
                    n = os.copy_file_range(fin.fileno(), fout.fileno(), n, begin + done)
                else:  # pragma: no cover - macOS, Windows
                    fin.seek(begin + done)
                    n = fout.write(fin.read(n))
                if n <= 0:
                    raise BundleError(f"{src} ends inside its TFLite section")
                done += n
        os.replace(tmp, dst)
    finally:
        tmp.unlink(missing_ok=True)


def model_files(path: Path, container: Container | None, cache_dir: str | None) -> ModelFiles:
    """The files for ``path`` (a ``.tflite``, or the ``.litertlm`` ``container`` describes),
    in ``cache_dir`` (must exist) or a new temporary dir. :class:`InvalidArgumentError` for a
    missing ``cache_dir``."""
    if cache_dir is not None and not Path(cache_dir).is_dir():
        raise InvalidArgumentError(f"cache_dir {cache_dir!r} does not exist; make it, or leave it "
                                   "unset for a temporary one")
    owns = cache_dir is None
    work = Path(tempfile.mkdtemp(prefix="eliza-litert-") if cache_dir is None else cache_dir)
    key = _key(path)
    try:
        model = path
        if container is not None:
            sec = container.tflite_section()
            model = work / f"{key}-s{sec.index}.tflite"
            if not model.is_file() or model.stat().st_size != sec.size:
                _copy_range(path, sec.begin, sec.size, model)
    except BaseException:
        if owns:
            shutil.rmtree(work, ignore_errors=True)
        raise
    return ModelFiles(model=model, weight_cache=work / f"{key}.xnnpack", work_dir=work,
                      owns_work_dir=owns)


__all__ = ["ModelFiles", "model_files"]
