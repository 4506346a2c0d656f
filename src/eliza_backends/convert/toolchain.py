"""The converter's tool-time dependencies: which are installed, their versions, and the
error that says what to install when one is missing.

The heavy tools (torch, transformers, litert-torch, coremltools) are never needed to install,
import or test eliza-backends: ``pip install 'eliza-backends[convert]'`` brings them, pinned
(``scripts/install-convert.sh`` makes a separate ``.venv-convert`` from the repo's files).
"""

from __future__ import annotations

import hashlib
import importlib.metadata
import importlib.util
import os
import sys
from pathlib import Path

from ..errors import MissingToolError

EXTRA = "convert"

#: format -> (import name, distribution) pairs it needs
NEEDS: dict[str, tuple[tuple[str, str], ...]] = {
    "hf": (("gguf", "gguf"), ("safetensors", "safetensors"), ("numpy", "numpy"),
           ("sentencepiece", "sentencepiece")),
    "gguf": (("gguf", "gguf"), ("llama_cpp", "llama-cpp-python")),
    "mlx": (("mlx_lm", "mlx-lm"),),
    #: a multimodal model's MLX folder (Gemma 4 with towers) is mlx-vlm's
    "mlx-vlm": (("mlx_vlm", "mlx-vlm"),),
    "litert": (("litert_lm_builder", "litert-lm-builder"),),
    "coreml": (("coremltools", "coremltools"), ("torch", "torch"),
               ("transformers", "transformers")),
    "verify": (("torch", "torch"), ("transformers", "transformers")),
    #: architectures whose GGUF llama.cpp's own convert_hf_to_gguf.py writes (Gemma 4)
    "hf-llama-cpp": (("torch", "torch"), ("transformers", "transformers"),
                     ("safetensors", "safetensors"), ("numpy", "numpy")),
}

#: distributions whose versions key the conversion cache
VERSIONED = ("gguf", "llama-cpp-python", "safetensors", "sentencepiece", "tokenizers", "mlx",
             "mlx-lm", "mlx-vlm", "torch", "transformers", "litert-lm-builder",
             "ai-edge-litert", "litert-lm-api", "coremltools", "numpy")


def missing(what: str) -> list[str]:
    """Distributions ``what`` (a key of :data:`NEEDS`) needs that are not installed."""
    return [dist for module, dist in NEEDS[what] if importlib.util.find_spec(module) is None]


def litert_torch_python() -> str | None:
    """The interpreter that runs litert-torch's exporter: ``$ELIZA_LITERT_TORCH_PYTHON``, the
    venv ``scripts/install-convert.sh`` recorded beside this one, or this interpreter when
    litert-torch is importable here; None when there is none."""
    env = os.environ.get("ELIZA_LITERT_TORCH_PYTHON")
    if env:
        return env
    recorded = Path(sys.prefix) / "eliza-litert-torch-venv"
    if recorded.is_file():
        py = Path(recorded.read_text().strip()) / "bin" / "python"
        if py.is_file():
            return str(py)
    if importlib.util.find_spec("litert_torch") is not None:
        return sys.executable
    return None


def litert_torch_version(python: str) -> str:
    """litert-torch's version in ``python`` (keys the LiteRT stage cache)."""
    import subprocess

    code = "import importlib.metadata as m; print(m.version('litert-torch'))"
    done = subprocess.run([python, "-c", code], capture_output=True, text=True, check=False)
    return done.stdout.strip() or "-"


def llama_cpp_converter() -> Path | None:
    """llama.cpp's own ``convert_hf_to_gguf.py`` (with its ``conversion/`` and ``gguf-py/``
    beside it, as in llama.cpp's tree): ``$ELIZA_LLAMA_CPP_CONVERTER``, or the copy
    ``scripts/install-convert.sh`` unpacked from the installed llama-cpp-python's sdist and
    recorded beside this venv; None when there is none. Gemma 4 GGUFs are written by it."""
    env = os.environ.get("ELIZA_LLAMA_CPP_CONVERTER")
    if env:
        return Path(env)
    recorded = Path(sys.prefix) / "eliza-llama-cpp-converter"
    if recorded.is_file():
        script = Path(recorded.read_text().strip())
        if script.is_file():
            return script
    return None


def require(what: str) -> None:
    """Raise :class:`MissingToolError` naming the extra to install if ``what`` cannot run."""
    absent = missing(what)
    if what == "litert" and litert_torch_python() is None:
        absent.append("litert-torch (its own venv: pip install -r requirements-litert-torch.txt"
                      ", then set ELIZA_LITERT_TORCH_PYTHON)")
    if what == "hf-llama-cpp" and llama_cpp_converter() is None:
        absent.append("llama.cpp's convert_hf_to_gguf.py (scripts/install-convert.sh unpacks "
                      "it from the llama-cpp-python sdist; or set ELIZA_LLAMA_CPP_CONVERTER to "
                      "the script in a llama.cpp tree of the installed version)")
    if absent:
        raise MissingToolError(
            f"converting to {what} needs {', '.join(absent)}, which are not installed here: "
            f"pip install 'eliza-backends[{EXTRA}]' (from a clone: bash "
            "scripts/install-convert.sh, then run .venv-convert/bin/eliza-backends)")


def can_make(what: str) -> bool:
    """True when every tool ``what`` needs is installed (found, not imported)."""
    return not missing(what) and (what != "litert" or litert_torch_python() is not None) \
        and (what != "hf-llama-cpp" or llama_cpp_converter() is not None)


def versions() -> dict[str, str]:
    """Installed versions of the tools that shape a conversion's output."""
    out = {}
    for dist in VERSIONED:
        try:
            out[dist] = importlib.metadata.version(dist)
        except importlib.metadata.PackageNotFoundError:
            out[dist] = "-"
    return out


def code_hash(*modules: str) -> str:
    """sha256 of the named modules of this package (paths below it without ``.py``, e.g.
    ``families/gemma4``; all of them when none is named): a stage keyed by the code it runs is
    redone when that code changes, and only then."""
    h = hashlib.sha256()
    here = Path(__file__).parent
    paths = [here / f"{m}.py" for m in modules] if modules else sorted(here.rglob("*.py"))
    for path in paths:
        h.update(path.relative_to(here).as_posix().encode())
        h.update(path.read_bytes())
    return h.hexdigest()


__all__ = ["EXTRA", "MissingToolError", "can_make", "code_hash", "llama_cpp_converter",
           "missing", "require", "versions"]

