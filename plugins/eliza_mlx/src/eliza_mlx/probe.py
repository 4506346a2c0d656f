"""Cheap host and artifact probes for the MLX / Core ML backend. Never imports mlx, mlx-lm or
coremltools: installed distributions are read with the plugin kit's
:func:`~eliza_backends.backend.distribution_version` (their dist-info folders, not
``importlib.metadata``'s scan of every distribution) / :func:`importlib.util.find_spec`, and
the runtime libraries are looked for as files.

* :func:`mlx_status`: can mlx-lm run here, and on what (Metal, CUDA, CPU)?
* :func:`coreml_status`: can Core ML *predict* here (macOS 15+ with coremltools)?
* :func:`check_mlx_folder`: is ``text/<dir>/`` a loadable MLX weights folder (config.json,
  safetensors, tokenizer.json)? A broken folder is a :class:`BundleError`, never a crash.
* :func:`check_mtp_assistant`: does an MLX folder under ``text/draft/mtp/`` hold a
  multi-token-prediction assistant of the target (Gemma 4's, for ``drafter="mtp"``)?
"""

from __future__ import annotations

import importlib.util
import json
import platform
import sys
from dataclasses import dataclass, field
from functools import lru_cache
from pathlib import Path
from typing import Any

from eliza_backends import BundleError
from eliza_backends.backend import distribution_version

MIN_MLX = (0, 32)
MIN_MACOS_COREML = (15, 0)
#: Distributions that give the Linux ``mlx`` package its native library.
LINUX_BACKENDS = ("mlx-cpu", "mlx-cuda-13", "mlx-cuda-12", "mlx-cuda")


@dataclass(frozen=True)
class RuntimeStatus:
    """One runtime's verdict: usable or not, why not, and facts for ``explain()``."""

    ok: bool
    reason: str = ""
    device: str = ""  # "metal" | "cuda" | "cpu" | "ane" (Core ML)
    detail: dict[str, str] = field(default_factory=dict)
    installed: bool = True  # False: the runtime's package is missing (the reason says which)


def _version_tuple(v: str) -> tuple[int, ...]:
    parts = []
    for p in v.split(".")[:3]:
        digits = "".join(c for c in p if c.isdigit())
        parts.append(int(digits) if digits else 0)
    return tuple(parts)


def _package_dirs(name: str) -> list[Path]:
    """Every directory of package ``name`` (mlx is a namespace package: any ``mlx/`` folder
    on sys.path, e.g. a cache directory in the working directory, is one more portion)."""
    try:
        spec = importlib.util.find_spec(name)
    except (ImportError, ValueError):
        return []
    if spec is None or not spec.submodule_search_locations:
        return []
    return [Path(p) for p in spec.submodule_search_locations]


def _mlx_dir() -> Path | None:
    """The portion of the ``mlx`` package that holds the compiled ``mlx.core``."""
    dirs = _package_dirs("mlx")
    for d in dirs:
        if any(d.glob("core.*")):  # core.cpython-*.so / core.*.pyd
            return d
    return dirs[0] if dirs else None


@lru_cache(maxsize=1)
def mlx_status() -> RuntimeStatus:
    """Whether mlx-lm can run on this host, decided from files and metadata (cached)."""
    pkg = _mlx_dir()
    if pkg is None or not any(pkg.glob("core.*")):
        return RuntimeStatus(False, "mlx is not installed: pip install 'eliza-backends[mlx]'",
                             installed=False)
    version = distribution_version("mlx") or "?"
    if version != "?" and _version_tuple(version) < MIN_MLX:
        return RuntimeStatus(False, f"mlx {version} is too old: this backend needs mlx>=0.32")
    if importlib.util.find_spec("mlx_lm") is None:
        return RuntimeStatus(False, "mlx-lm is not installed: pip install 'mlx-lm>=0.32.2'",
                             installed=False)
    if importlib.util.find_spec("tokenizers") is None:
        return RuntimeStatus(False, "tokenizers is not installed: pip install tokenizers")
    lib_dir = pkg / "lib"
    libs = sorted(p.name for p in lib_dir.glob("libmlx.*")) if lib_dir.is_dir() else []
    detail = {"mlx_version": version, "mlx_lm_version": distribution_version("mlx-lm") or "?"}
    if sys.platform == "darwin":
        if platform.machine() != "arm64":
            return RuntimeStatus(False, "mlx runs on Apple silicon only; this Mac is "
                                 f"{platform.machine()}", detail=detail)
        if not libs:
            return RuntimeStatus(False, f"mlx at {pkg} has no libmlx: install mlx-metal "
                                 "(pip install --force-reinstall mlx)", detail=detail)
        metal = (lib_dir / "mlx.metallib").is_file()
        detail["metal"] = "yes" if metal else "no"
        return RuntimeStatus(True, device="metal" if metal else "cpu", detail=detail)
    backends = {d: v for d in LINUX_BACKENDS if (v := distribution_version(d)) is not None}
    if not libs:
        return RuntimeStatus(
            False, f"mlx {version} is installed without a backend library ({pkg}/lib/libmlx.so "
            "is missing): on Linux plain `mlx` cannot load; pip install 'mlx[cpu]' (or "
            "'mlx[cuda12]')", detail=detail)
    mismatched = {d: v for d, v in backends.items() if version != "?" and v != version}
    if mismatched and len(mismatched) == len(backends):
        listing = ", ".join(f"{d} {v}" for d, v in mismatched.items())
        return RuntimeStatus(False, f"mlx {version} does not match its backend ({listing}): "
                             "reinstall them at one version (pip install 'mlx[cpu]==<ver>')",
                             detail=detail)
    cuda = any(d.startswith("mlx-cuda") for d in backends)
    detail["mlx_backend"] = ", ".join(f"{d} {v}" for d, v in backends.items()) or "source build"
    detail["metal"] = "no"
    return RuntimeStatus(True, device="cuda" if cuda else "cpu", detail=detail)


@lru_cache(maxsize=1)
def coreml_status() -> RuntimeStatus:
    """Whether Core ML can run predictions here: macOS 15+ (stateful models) and coremltools."""
    if sys.platform != "darwin":
        host = {"linux": "Linux", "win32": "Windows"}.get(sys.platform, sys.platform)
        return RuntimeStatus(False, f"Core ML prediction needs macOS 15+; this host is {host}")
    mac = platform.mac_ver()[0]
    if not mac or _version_tuple(mac)[:2] < MIN_MACOS_COREML:
        return RuntimeStatus(False, f"Core ML stateful models need macOS 15+; this is macOS "
                             f"{mac or '?'}")
    version = distribution_version("coremltools")
    if version is None or importlib.util.find_spec("coremltools") is None:
        return RuntimeStatus(False, "coremltools is not installed: pip install "
                             "'coremltools>=9.0'", installed=False)
    if _version_tuple(version) < (9, 0):
        return RuntimeStatus(False, f"coremltools {version} is too old: need >=9.0")
    return RuntimeStatus(True, device="ane", detail={"coremltools_version": version, "macos": mac})


# -------------------------------------------------------------------------------- MLX folders


def _read_json(path: Path, what: str) -> dict[str, Any]:
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except FileNotFoundError:
        raise BundleError(f"MLX folder {path.parent} has no {path.name}; {what}") from None
    except OSError as exc:
        raise BundleError(f"cannot read {path}: {exc.strerror}") from None
    except (ValueError, UnicodeDecodeError) as exc:
        raise BundleError(f"{path} is not valid JSON ({exc}); re-export the MLX folder") from None
    if not isinstance(data, dict):
        raise BundleError(f"{path} must hold a JSON object, not {type(data).__name__}")
    return data


def _positive_int(config: dict[str, Any], key: str, where: Path) -> int | None:
    value = config.get(key)
    if value is None and isinstance(config.get("text_config"), dict):
        value = config["text_config"].get(key)
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int) or value <= 0:
        raise BundleError(f"{where}: {key} must be a positive integer, got {value!r}")
    return value


def _check_safetensors(path: Path) -> None:
    """Read a safetensors header (not the data) and check the file holds every tensor."""
    try:
        size = path.stat().st_size
        with open(path, "rb") as fh:
            head = fh.read(8)
            n = int.from_bytes(head, "little") if len(head) == 8 else -1
            if n <= 0 or n > min(size - 8, 100 << 20):
                raise BundleError(f"{path} is not a safetensors file (bad header length); "
                                  "re-copy the MLX folder")
            header = json.loads(fh.read(n))
    except OSError as exc:
        raise BundleError(f"cannot read {path}: {exc.strerror}") from None
    except (ValueError, UnicodeDecodeError):
        raise BundleError(f"{path} has a corrupted safetensors header") from None
    if not isinstance(header, dict):
        raise BundleError(f"{path} has a corrupted safetensors header")
    end = 0
    for name, info in header.items():
        if name == "__metadata__":
            continue
        offsets = info.get("data_offsets") if isinstance(info, dict) else None
        if not (isinstance(offsets, list) and len(offsets) == 2
                and all(isinstance(o, int) for o in offsets) and 0 <= offsets[0] <= offsets[1]):
            raise BundleError(f"{path}: tensor {name!r} has no valid data_offsets")
        end = max(end, offsets[1])
    if 8 + n + end > size:
        raise BundleError(f"{path} is truncated: its tensors need {8 + n + end} bytes, the "
                          f"file has {size}; re-copy the MLX folder")


@dataclass(frozen=True)
class MLXFolder:
    """What :func:`check_mlx_folder` learned about an MLX weights folder."""

    path: Path
    config: dict[str, Any]
    model_type: str
    vocab_size: int
    max_positions: int | None
    weight_files: tuple[Path, ...]


def check_mlx_folder(path: Path) -> MLXFolder:
    """Validate ``text/<dir>/`` before mlx sees it: config.json (a JSON object with a string
    ``model_type`` and a positive ``vocab_size``, no ``model_file`` code hook), the safetensors
    files (and every shard its index names), tokenizer.json. Raises :class:`BundleError`."""
    if not path.is_dir():
        raise BundleError(f"MLX weights folder {path} does not exist")
    config = _read_json(path / "config.json", "an MLX folder needs config.json")
    model_type = config.get("model_type")
    if not isinstance(model_type, str) or not model_type:
        raise BundleError(f"{path / 'config.json'} has no model_type string; it is not an "
                          "MLX / Hugging Face model config")
    if "model_file" in config:
        raise BundleError(f"{path / 'config.json'} asks mlx-lm to import custom model code "
                          f"({config['model_file']!r}); bundles may not run code, convert the "
                          "model to a built-in mlx-lm architecture")
    vocab = _positive_int(config, "vocab_size", path / "config.json")
    if vocab is None:
        raise BundleError(f"{path / 'config.json'} has no vocab_size")
    weights = tuple(sorted(path.glob("*.safetensors")))
    if not weights:
        raise BundleError(f"MLX folder {path} has no *.safetensors weights")
    for weight in weights:
        _check_safetensors(weight)
    index = path / "model.safetensors.index.json"
    if index.is_file():
        weight_map = _read_json(index, "").get("weight_map", {})
        if not isinstance(weight_map, dict):
            raise BundleError(f"{index}: weight_map must be an object")
        missing = sorted({str(v) for v in weight_map.values()} - {p.name for p in weights})
        if missing:
            raise BundleError(f"MLX folder {path} is missing weight shards named by its index: "
                              f"{', '.join(missing)}")
    if not (path / "tokenizer.json").is_file():
        raise BundleError(f"MLX folder {path} has no tokenizer.json (this backend tokenizes "
                          "with the Hugging Face tokenizer file)")
    return MLXFolder(path=path, config=config, model_type=model_type, vocab_size=vocab,
                     max_positions=_positive_int(config, "max_position_embeddings",
                                                 path / "config.json"),
                     weight_files=weights)

#: The model types whose vision and audio towers this plugin runs through mlx-vlm (``vlm.py``
#: implements Gemma 4's processor and mask): a runtime fact, as a table.
MLX_VLM_MODEL_TYPES = frozenset({"gemma4", "gemma4_unified"})

#: MTP assistants (``model_type``) mlx-vlm drafts with, each with the mlx-lm target model types
#: whose hidden states and KV cache it reads.
MTP_ASSISTANTS: dict[str, frozenset[str]] = {
    "gemma4_assistant": frozenset({"gemma4_text"}),
    "gemma4_unified_assistant": frozenset({"gemma4_unified"}),
}


def check_mtp_assistant(assistant: MLXFolder, target: MLXFolder) -> None:
    """:class:`BundleError` unless ``assistant`` is an MTP assistant (:data:`MTP_ASSISTANTS`)
    of ``target``'s architecture, vocabulary and hidden size (``backbone_hidden_size``)."""
    name = assistant.path.name
    targets = MTP_ASSISTANTS.get(assistant.model_type)
    if targets is None:
        raise BundleError(f"{name} is a {assistant.model_type} model, not an MTP assistant "
                          f"({', '.join(sorted(MTP_ASSISTANTS))}); drafter='mtp' needs the "
                          "target's assistant (drafter='model' takes a draft model)")
    if target.model_type not in targets:
        raise BundleError(f"{name} assists {' or '.join(sorted(targets))} models; the target "
                          f"{target.path.name} is a {target.model_type} model")
    if assistant.vocab_size != target.vocab_size:
        raise BundleError(f"assistant {name} has {assistant.vocab_size} tokens, the target "
                          f"{target.vocab_size}: it belongs to another model")
    backbone = assistant.config.get("backbone_hidden_size")
    text = target.config.get("text_config")  # a multimodal folder nests its text model's
    hidden = _positive_int(text if isinstance(text, dict) else target.config, "hidden_size",
                           target.path / "config.json")
    if backbone != hidden:
        raise BundleError(f"assistant {name} reads hidden states of width {backbone}, the "
                          f"target {target.path.name} has {hidden}: it belongs to another model")


def multimodal_kinds(folder: Path) -> frozenset[str]:
    """The media kinds a Gemma 4 MLX folder's config.json carries towers for (no load)."""
    try:
        cfg = json.loads((folder / "config.json").read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return frozenset()
    if cfg.get("model_type") not in MLX_VLM_MODEL_TYPES:
        return frozenset()
    return frozenset(k for k, key in (("image", "vision_config"), ("audio", "audio_config"))
                     if isinstance(cfg.get(key), dict))


__all__ = ["MLX_VLM_MODEL_TYPES", "MTP_ASSISTANTS", "MLXFolder", "RuntimeStatus",
           "check_mlx_folder", "check_mtp_assistant", "coreml_status", "mlx_status",
           "multimodal_kinds"]
