"""Model bundles: the on-disk layout, the manifest, and the cheap artifact probes.

A bundle is a directory::

    <bundle>/manifest.json          what the bundle ships (source of truth), with sha256
    <bundle>/text/*.gguf            llama.cpp
    <bundle>/text/*.litertlm        LiteRT-LM (also *.tflite with prefill/decode signatures)
    <bundle>/text/<dir>/            MLX weights folder (config.json + *.safetensors)
    <bundle>/text/*.mlpackage       Core ML (also *.mlmodelc)
    <bundle>/text/draft/...         smaller draft models for speculative decoding, same formats
    <bundle>/text/draft/mtp/...     multi-token-prediction heads that read the target's state
                                    (Gemma 4's assistant): role "draft", kind "mtp"; never
                                    opened as a standalone draft model
    <bundle>/text/mmproj/*.gguf     multimodal projectors (llama.cpp's image/audio encoders,
                                    read with the text GGUF by libmtmd): role "mmproj"
    <bundle>/embedding.json         an embedding model's Matryoshka dimensions (optional:
                                    ``{"matryoshka_dimensions": [512, 256, 128]}``)

:func:`find_artifacts` is the probe a factory's ``can_serve`` uses: one directory listing, no
file is opened. The manifest is :mod:`eliza_backends.manifest`'s (pydantic models, sha256:
``verify_bundle``, ``write_manifest``, ``create_bundle``); opening a bundle never reads it, so
this module imports neither pydantic nor hashlib.

A single artifact (a ``.gguf`` / ``.litertlm`` / ``.tflite`` file, an MLX folder, an
``.mlpackage``) is accepted wherever a bundle is: :class:`ImplicitBundle` stages it as a
one-artifact bundle of symbolic links in a temporary folder, without copying a byte.
"""

from __future__ import annotations

import os
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Final, Literal

from .errors import BundleError

MANIFEST_NAME = "manifest.json"
TEXT_DIR = "text"
DRAFT_DIR = "draft"
MTP_DIR = "mtp"
MMPROJ_DIR = "mmproj"
SCHEMA_VERSION: Final = 1

#: What an artifact is for: the model itself, a draft for speculative decoding, or the
#: multimodal projector a model's media go through (``text/mmproj/``).
ArtifactRole = Literal["model", "draft", "mmproj"]
#: What a draft artifact is: a standalone smaller model (``"model"``, the default), or a
#: multi-token-prediction head (``"mtp"``) that drafts from the target's hidden state and KV.
DraftKind = Literal["model", "mtp"]


@dataclass(frozen=True)
class ArtifactFormat:
    """A kind of model artifact and the backend that serves it."""

    name: str
    backend: str
    description: str


#: Formats the core recognises, in probe order. ``backend`` is the serving factory's name.
FORMATS: dict[str, ArtifactFormat] = {
    f.name: f
    for f in (
        ArtifactFormat("gguf", "llama.cpp", "text/*.gguf"),
        ArtifactFormat("litertlm", "litert-lm", "text/*.litertlm"),
        ArtifactFormat("tflite", "litert-lm", "text/*.tflite (prefill/decode signatures)"),
        ArtifactFormat("mlx", "mlx-coreml", "text/<dir>/ with config.json + *.safetensors"),
        ArtifactFormat("mlpackage", "mlx-coreml", "text/*.mlpackage"),
        ArtifactFormat("mlmodelc", "mlx-coreml", "text/*.mlmodelc"),
    )
}


#: Tokenizer files that may sit beside a LiteRT model in ``text/`` (its runtime has no
#: tokenizer of its own): ``<stem>.tokenizer.json`` / ``<stem>.tokenizer.model`` belong to the
#: artifact with that stem, ``tokenizer.json`` / ``tokenizer.model`` to all of them.
SIDECAR_SUFFIXES = (".tokenizer.json", ".tokenizer.model")
SHARED_SIDECARS = ("tokenizer.json", "tokenizer.model")
SIDECAR_FORMAT = "tokenizer"


def is_sidecar(path: Path) -> bool:
    """True for a tokenizer file that :func:`scan_artifacts` lists beside model artifacts."""
    return path.is_file() and (path.name in SHARED_SIDECARS
                               or path.name.endswith(SIDECAR_SUFFIXES))


def sidecars_of(artifact: Path) -> list[Path]:
    """The ``<stem>.tokenizer.*`` files beside a ``.tflite`` / ``.litertlm`` artifact."""
    if artifact.suffix.lower() not in (".tflite", ".litertlm"):
        return []
    return [p for suffix in SIDECAR_SUFFIXES
            if (p := artifact.with_name(artifact.stem + suffix)).is_file()]


def artifact_format(path: Path) -> str | None:
    """The format name of one entry of ``text/``, or None if it is not a model artifact.

    Cheap: looks at the name, and for directories checks for ``config.json``.
    """
    suffix = path.suffix.lower()
    if suffix in (".gguf", ".litertlm", ".tflite"):
        return suffix[1:] if path.is_file() else None
    if suffix in (".mlpackage", ".mlmodelc"):
        return suffix[1:] if path.is_dir() else None
    if path.is_dir() and path.name != DRAFT_DIR and (path / "config.json").is_file():
        try:
            with os.scandir(path) as entries:  # (closed even when any() stops early)
                weights = any(e.name.endswith(".safetensors") for e in entries)
            if weights:
                return "mlx"
        except OSError:
            return None
    return None


def find_artifacts(
    bundle_dir: str | os.PathLike[str], formats: Iterable[str], *, role: ArtifactRole = "model",
    kind: DraftKind = "model",
) -> list[Path]:
    """Artifacts of the given formats in the bundle, sorted by name; [] when there are none.

    ``role="model"`` lists ``text/``; ``role="draft"`` lists ``text/draft/`` (with
    ``kind="mtp"``: ``text/draft/mtp/``); ``role="mmproj"`` lists ``text/mmproj/``. Never
    raises for a missing directory (a probe answers "no"), never opens a model file.
    """
    wanted = set(formats)
    base = Path(bundle_dir) / TEXT_DIR
    if role == "draft":
        base = base / DRAFT_DIR
        if kind == "mtp":
            base = base / MTP_DIR
    elif role == "mmproj":
        base = base / MMPROJ_DIR
    try:
        entries = sorted(os.scandir(base), key=lambda e: e.name)
    except OSError:
        return []
    found = []
    for entry in entries:
        if entry.name.startswith("."):
            continue
        path = Path(entry.path)
        if artifact_format(path) in wanted:
            found.append(path)
    return found


def is_bundle_dir(path: str | os.PathLike[str]) -> bool:
    """Whether ``path`` is a bundle folder (it holds ``text/``), as opposed to one artifact."""
    return (Path(path) / TEXT_DIR).is_dir()


#: Files beside a single artifact that belong to it (its tokenizer), staged with it.
_SIDECARS = ("{stem}.tokenizer.json", "tokenizer.json", "tokenizer_config.json")


class ImplicitBundle:
    """One model artifact staged as a bundle: ``<tmp>/<stem>/text/<name>`` is a symbolic link
    to the artifact (and to the tokenizer files beside it, see :data:`_SIDECARS`). Nothing is
    copied and no manifest is written (there is nothing to verify against). :meth:`close`
    removes the links, never the model. Use it as a context manager, or let
    :class:`~eliza_backends.backend.context.InferenceContext` own it.
    """

    def __init__(self, artifact: str | os.PathLike[str]) -> None:
        source = Path(artifact).resolve()
        if artifact_format(source) is None:
            raise not_a_bundle(Path(artifact))
        self.source: Path = source
        import tempfile  # (single artifacts only)

        self._tmp = Path(tempfile.mkdtemp(prefix="eliza-implicit-"))
        self.root: Path = self._tmp / (source.stem or "model")
        text = self.root / TEXT_DIR
        text.mkdir(parents=True)
        (text / source.name).symlink_to(source, target_is_directory=source.is_dir())
        if source.is_file():
            for pattern in _SIDECARS:
                side = source.parent / pattern.format(stem=source.stem)
                if side.is_file() and not (text / side.name).exists():
                    (text / side.name).symlink_to(side)

    def close(self) -> None:
        """Remove the staging folder (links only). Idempotent."""
        import shutil

        shutil.rmtree(self._tmp, ignore_errors=True)

    def __enter__(self) -> ImplicitBundle:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def __repr__(self) -> str:
        return f"<ImplicitBundle {self.source} at {self.root}>"


#: The bundle file that lists an embedding model's Matryoshka dimensions.
EMBEDDING_FILE: Final = "embedding.json"


def matryoshka_dimensions(bundle_dir: str | os.PathLike[str], full: int) -> tuple[int, ...]:
    """The lengths an embedding model's ``full``-dimension vectors may be truncated to, from
    the bundle's ``embedding.json`` (its ``matryoshka_dimensions``: what the model was trained
    for, e.g. EmbeddingGemma's 512/256/128), largest first; () when the bundle has none (a
    model not trained for truncation). :class:`BundleError` for a malformed file."""
    import json  # (only embedding bundles read it)

    path = Path(bundle_dir) / EMBEDDING_FILE
    if not path.is_file():
        return ()
    try:
        dims = json.loads(path.read_text(encoding="utf-8")).get("matryoshka_dimensions", [])
    except (OSError, ValueError, AttributeError) as exc:
        raise BundleError(f"{path} is not a JSON object ({exc}); write "
                          '{"matryoshka_dimensions": [...]}') from None
    if not isinstance(dims, list) or not all(
            isinstance(d, int) and not isinstance(d, bool) and 0 < d < full for d in dims):
        raise BundleError(f"{path}: matryoshka_dimensions must be a list of ints in 1.."
                          f"{full - 1} (the model's vectors have {full}), got {dims!r}")
    return tuple(sorted(set(dims), reverse=True))


def not_a_bundle(path: Path) -> BundleError:
    """The error for a path that is neither a bundle folder nor a model artifact."""
    if not path.exists():
        return BundleError(f"{path} does not exist; pass a model file (.gguf, .litertlm, "
                           ".tflite), an MLX folder, or a bundle folder that holds text/")
    known = ", ".join(f.description.removeprefix("text/") for f in FORMATS.values())
    return BundleError(f"{path} is neither a bundle folder (one that holds text/) nor a model "
                       f"artifact this library knows ({known}); make a bundle with "
                       "`eliza-backends bundle create`")


__all__ = [
    "EMBEDDING_FILE",
    "FORMATS",
    "ArtifactFormat",
    "DraftKind",
    "ImplicitBundle",
    "artifact_format",
    "find_artifacts",
    "is_bundle_dir",
    "is_sidecar",
    "matryoshka_dimensions",
    "not_a_bundle",
    "sidecars_of",
]
