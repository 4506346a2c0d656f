"""The cache key of the ``--verify`` stage: what decides ``parity.json``, and nothing else.

``parity.json`` is a function of

1. the artifacts: the keys of the stages that made them (source sha256, converter code, tool
   versions, parameters);
2. the runtimes and the reference: the versions of torch, transformers, llama-cpp-python,
   ai-edge-litert, litert-lm-api, mlx, mlx-lm (:func:`.toolchain.versions`);
3. the code that drives them: ``verify.py`` and its prompt text, the installed plugins (entry
   points), and the serving code ``open_stream`` runs: the core's and the plugins' modules.

Which modules serve an artifact is known exactly only after a run, so a run records the names
of the core's and plugins' modules it had loaded (:func:`loaded_modules`; the converter's own
modules are left out: they made the artifacts, whose keys hold their hash) under a record keyed
by 1-3 without the modules (:func:`record_path`). The next run hashes the current source of the
recorded modules (:func:`serving_hash`): a change to a module the verification never loaded
(the CLI, the server, Ray, the docs, the tests, a module moved that serving does not import) keeps
the key; a change to one it loaded, or one of them moved or gone, re-verifies. A module newly
imported by serving code is reached through a loaded module, whose source then changed.
"""

from __future__ import annotations

import hashlib
import importlib.metadata
import importlib.util
import json
import sys
from collections.abc import Iterable
from pathlib import Path
from typing import Any

from .stages import content_key

#: the core's package; the plugins' top-level packages come from their entry points
CORE = "eliza_backends"
#: modules of the core that are not serving code: the converter (its code keys the artifacts'
#: stages; verify.py is hashed on its own) and the command line that started the conversion
NOT_SERVING = (f"{CORE}.convert", f"{CORE}.cli", f"{CORE}.__main__")


def plugin_entry_points() -> list[str]:
    """``name = value`` of every installed ``eliza_backends`` entry point, sorted."""
    return sorted(f"{ep.name} = {ep.value}"
                  for ep in importlib.metadata.entry_points(group=CORE))


def serving_packages() -> set[str]:
    """The core's package and the installed plugins' top-level packages."""
    return {CORE} | {ep.partition(" = ")[2].split(".")[0].split(":")[0]
                     for ep in plugin_entry_points()}


def loaded_modules() -> list[str]:
    """The serving modules this process has imported, sorted (see the module docstring)."""
    roots = serving_packages()
    return sorted(name for name in list(sys.modules)
                  if name.split(".")[0] in roots
                  and not any(name == x or name.startswith(x + ".") for x in NOT_SERVING))


def serving_hash(modules: Iterable[str]) -> str:
    """sha256 over each module's name and current source (``-`` for one that no longer
    exists or has no source file)."""
    h = hashlib.sha256()
    for name in sorted(modules):
        try:
            spec = importlib.util.find_spec(name)
        except (ImportError, ValueError):
            spec = None
        origin = spec.origin if spec is not None else None
        data = Path(origin).read_bytes() if origin and Path(origin).is_file() else b"-"
        h.update(f"{name}\0{len(data)}\0".encode())
        h.update(data)
    return h.hexdigest()


def verify_code() -> str:
    """sha256 of ``verify.py`` and its prompt text."""
    here = Path(__file__).parent
    h = hashlib.sha256()
    for name in ("verify.py", "long_prompt.txt"):
        h.update(name.encode() + b"\0")
        h.update((here / name).read_bytes())
    return h.hexdigest()


def base_parts(stage_keys: Iterable[str], versions: dict[str, str]) -> tuple[Any, ...]:
    """1-3 of the module docstring without the serving modules."""
    return (tuple(stage_keys), versions, verify_code(), plugin_entry_points())


def record_path(work_dir: Path, base: tuple[Any, ...]) -> Path:
    """Where the module names of the last verification with ``base`` are kept."""
    return work_dir / "verify-modules" / f"{content_key(*base)[:24]}.json"


def recorded_modules(work_dir: Path, base: tuple[Any, ...]) -> list[str] | None:
    """The recorded module names, or None when no verification with ``base`` finished."""
    try:
        names = json.loads(record_path(work_dir, base).read_text(encoding="utf-8"))["modules"]
    except (OSError, ValueError, KeyError, TypeError):
        return None
    return [str(n) for n in names]


def record_modules(work_dir: Path, base: tuple[Any, ...], modules: list[str]) -> None:
    """Keep ``modules`` as what the verification with ``base`` loaded (written atomically)."""
    path = record_path(work_dir, base)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(".tmp")
    tmp.write_text(json.dumps({"modules": modules}, indent=0) + "\n", encoding="utf-8")
    tmp.replace(path)


def verify_key_parts(work_dir: Path, base: tuple[Any, ...]) -> tuple[Any, ...]:
    """The ``verify`` stage's key parts now: ``base`` and the hash of the recorded serving
    modules (``unrecorded`` before the first verification with ``base``)."""
    modules = recorded_modules(work_dir, base)
    return (*base, serving_hash(modules) if modules is not None else "unrecorded")


__all__ = ["base_parts", "loaded_modules", "record_modules", "recorded_modules",
           "serving_hash", "verify_key_parts"]
