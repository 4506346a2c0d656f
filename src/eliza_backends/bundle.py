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

:func:`find_artifacts` is the probe a factory's ``can_serve`` uses: one directory listing, no
file is opened. The manifest is checked by :func:`verify_bundle` (sizes and sha256) and written
by :func:`write_manifest` / :func:`create_bundle`.

A single artifact (a ``.gguf`` / ``.litertlm`` / ``.tflite`` file, an MLX folder, an
``.mlpackage``) is accepted wherever a bundle is: :class:`ImplicitBundle` stages it as a
one-artifact bundle of symbolic links in a temporary folder, without copying a byte.
"""

from __future__ import annotations

import json
import os
import shutil
import tempfile
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path, PurePosixPath
from typing import Annotated, Final, Literal

from pydantic import AfterValidator, BaseModel, ConfigDict, Field, ValidationError

from .errors import BundleError, InvalidArgumentError, Status, describe_validation_error
from .hashing import sha256_file

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


# --------------------------------------------------------------------------------------------
# Manifest


def _check_relative(path: str) -> str:
    p = PurePosixPath(path)
    if not path or p.is_absolute() or "\\" in path or ".." in p.parts or path.startswith("~"):
        raise ValueError(f"{path!r} must be a relative path inside the bundle (no '..', no '/')")
    if not p.parts or p.parts[0] != TEXT_DIR:
        raise ValueError(f"{path!r} must be under {TEXT_DIR}/")
    return str(p)


BundlePath = Annotated[str, AfterValidator(_check_relative)]
"""A POSIX path relative to the bundle root, under ``text/``, with no ``..``."""


class FileRecord(BaseModel):
    """One regular file of an artifact: bundle-relative POSIX path, size in bytes, sha256 hex."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    path: BundlePath
    size: int = Field(ge=0)
    sha256: str = Field(pattern=r"^[0-9a-f]{64}$")


class ArtifactRecord(BaseModel):
    """One model artifact (a file, or a directory such as an MLX folder) and its files."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    path: BundlePath
    format: str
    backend: str | None
    role: ArtifactRole = "model"
    #: ``"mtp"`` for a multi-token-prediction head under ``text/draft/mtp/``; None otherwise
    #: (left out of ``manifest.json``)
    kind: DraftKind | None = None
    files: tuple[FileRecord, ...]

    @property
    def size(self) -> int:
        """Total bytes of the artifact's files."""
        return sum(f.size for f in self.files)


#: The longest bundle name a manifest holds (``BundleManifest.name``).
MAX_NAME = 200


class BundleManifest(BaseModel):
    """``<bundle>/manifest.json``: the source of truth for what the bundle ships."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    schema_version: Literal[1] = SCHEMA_VERSION
    name: str = Field(min_length=1, max_length=MAX_NAME)
    artifacts: tuple[ArtifactRecord, ...]

    def for_backend(self, backend: str, role: ArtifactRole = "model") -> list[ArtifactRecord]:
        """Artifacts the manifest assigns to ``backend`` in ``role``."""
        return [a for a in self.artifacts if a.backend == backend and a.role == role]

    def file_record(self, bundle_dir: str | os.PathLike[str], path: Path) -> FileRecord | None:
        """The record of one file of the bundle, given its path on disk, if the manifest has it."""
        try:
            rel = Path(path).resolve().relative_to(Path(bundle_dir).resolve()).as_posix()
        except ValueError:
            return None
        for art in self.artifacts:
            for rec in art.files:
                if rec.path == rel:
                    return rec
        return None


def load_manifest(bundle_dir: str | os.PathLike[str]) -> BundleManifest:
    """Read and validate ``<bundle>/manifest.json``; :class:`BundleError` says what is wrong."""
    path = Path(bundle_dir) / MANIFEST_NAME
    try:
        raw = path.read_bytes()
    except FileNotFoundError:
        raise BundleError(
            f"{path} not found: create it with `eliza-backends bundle create`"
        ) from None
    except OSError as exc:
        raise BundleError(f"cannot read {path}: {exc.strerror}", code=Status.ERR_IO) from None
    if len(raw) > 16 << 20:
        raise BundleError(f"{path} is {len(raw)} bytes; a manifest is at most 16 MiB")
    try:
        data = json.loads(raw)
    except (ValueError, UnicodeDecodeError, RecursionError) as exc:
        raise BundleError(f"{path} is not valid JSON ({exc}); regenerate it with "
                          "`eliza-backends bundle create`") from None
    try:
        return BundleManifest.model_validate(data)
    except ValidationError as exc:
        raise BundleError(describe_validation_error(exc, str(path))) from None


def _artifact_files(bundle_root: Path, artifact: Path) -> list[FileRecord]:
    paths = [artifact] if artifact.is_file() else sorted(
        p for p in artifact.rglob("*") if p.is_file() and not p.name.startswith(".")
    )
    records = []
    for p in paths:
        _ensure_inside(bundle_root, p)
        records.append(FileRecord(path=p.relative_to(bundle_root).as_posix(),
                                  size=p.stat().st_size, sha256=sha256_file(p)))
    return records


def _ensure_inside(root: Path, path: Path) -> Path:
    try:
        resolved = path.resolve()
        inside = resolved.is_relative_to(root.resolve())
    except (OSError, RuntimeError) as exc:  # a symlink loop (RuntimeError before 3.13)
        raise BundleError(f"{path} cannot be resolved ({exc}); fix or remove that link",
                          code=Status.ERR_IO) from None
    if not inside:
        raise BundleError(f"{path} resolves outside the bundle ({resolved}); "
                          "bundles may not link to files elsewhere")
    return resolved


def scan_artifacts(bundle_dir: str | os.PathLike[str]) -> list[ArtifactRecord]:
    """Describe every model artifact under ``text/``, ``text/draft/`` and ``text/mmproj/``
    (hashes every file).

    A LiteRT artifact's own sidecar tokenizer (``<stem>.tokenizer.json``) is listed among its
    files; any other tokenizer sidecar gets a record of format ``"tokenizer"`` (no backend)."""
    root = Path(bundle_dir)
    if not (root / TEXT_DIR).is_dir():
        raise BundleError(f"{root} has no {TEXT_DIR}/ directory; put the model artifacts there")
    records = []
    draft = root / TEXT_DIR / DRAFT_DIR
    places: tuple[tuple[ArtifactRole, DraftKind | None, Path], ...] = (
        ("model", None, root / TEXT_DIR), ("draft", None, draft),
        ("draft", "mtp", draft / MTP_DIR), ("mmproj", None, root / TEXT_DIR / MMPROJ_DIR))
    for role, kind, base in places:
        if not base.is_dir():
            continue
        entries = sorted(base.iterdir())
        claimed = {side for entry in entries if artifact_format(entry)
                   for side in sidecars_of(entry)}
        for entry in entries:
            fmt = artifact_format(entry)
            if fmt is None:
                if is_sidecar(entry) and entry not in claimed:
                    records.append(ArtifactRecord(
                        path=entry.relative_to(root).as_posix(), format=SIDECAR_FORMAT,
                        backend=None, role=role, kind=kind,
                        files=tuple(_artifact_files(root, entry))))
                continue
            files = _artifact_files(root, entry)
            for side in sidecars_of(entry):
                files += _artifact_files(root, side)
            records.append(ArtifactRecord(
                path=entry.relative_to(root).as_posix(), format=fmt,
                backend=FORMATS[fmt].backend, role=role, kind=kind, files=tuple(files),
            ))
    if not any(r.role == "model" and r.format != SIDECAR_FORMAT for r in records):
        known = ", ".join(f.description for f in FORMATS.values())
        raise BundleError(f"{root / TEXT_DIR} holds no model artifact; expected one of: {known}")
    return records


def check_bundle_name(name: str) -> None:
    """Raise :class:`InvalidArgumentError` unless ``name`` fits a manifest (1..200 chars)."""
    if not isinstance(name, str) or not 1 <= len(name) <= MAX_NAME:
        size = len(name) if isinstance(name, str) else type(name).__name__
        raise InvalidArgumentError(f"a bundle name has 1 to {MAX_NAME} characters (got "
                                   f"{size}); pass a shorter --name")


def write_manifest(bundle_dir: str | os.PathLike[str], *,
                   name: str | None = None) -> BundleManifest:
    """Scan ``text/``, hash every artifact file, and write ``manifest.json`` atomically."""
    root = Path(bundle_dir)
    manifest = BundleManifest(name=name or root.resolve().name,
                              artifacts=tuple(scan_artifacts(root)))
    tmp = root / f".{MANIFEST_NAME}.tmp"
    data = manifest.model_dump(mode="json")
    for art in data["artifacts"]:  # manifests without MTP heads keep their old shape
        if art["kind"] is None:
            del art["kind"]
    tmp.write_text(json.dumps(data, indent=2, ensure_ascii=False) + "\n", encoding="utf-8")
    os.replace(tmp, root / MANIFEST_NAME)
    return manifest


def create_bundle(
    dest: str | os.PathLike[str],
    artifacts: Sequence[str | os.PathLike[str]],
    *,
    drafts: Sequence[str | os.PathLike[str]] = (),
    name: str | None = None,
    link: bool = False,
) -> BundleManifest:
    """Lay out a bundle at ``dest``: copy artifacts into ``text/`` (drafts into ``text/draft/``)
    and write the manifest. ``dest`` may exist but must not already hold those names.

    ``link=True`` hard-links every file instead of copying it (no extra disk space; the source
    must be on the same filesystem as ``dest``). Hard links, not symbolic ones: the bundle stays
    self-contained, and :func:`verify_bundle` notices if the shared file changes later."""
    root = Path(dest)
    if name is not None:
        check_bundle_name(name)  # before anything is copied
    plan: list[tuple[Path, Path]] = []
    for sources, target_dir in ((artifacts, root / TEXT_DIR),
                                (drafts, root / TEXT_DIR / DRAFT_DIR)):
        for src in map(Path, sources):
            if not src.exists():
                raise BundleError(f"artifact {src} does not exist")
            if artifact_format(src) is None and not is_sidecar(src):
                known = ", ".join(f.description for f in FORMATS.values())
                raise BundleError(f"{src} is not a model artifact this library knows ({known}) "
                                  "nor a tokenizer sidecar (tokenizer.json, tokenizer.model, "
                                  "<stem>.tokenizer.json, <stem>.tokenizer.model)")
            target = target_dir / src.name
            if target.exists():
                raise BundleError(f"{target} already exists; remove it or choose another dest")
            plan.append((src, target))
    if not any(artifact_format(Path(a)) for a in artifacts):
        raise BundleError("a bundle needs at least one model artifact")
    for src, target in plan:
        target.parent.mkdir(parents=True, exist_ok=True)
        _place(src, target, link=link)
    return write_manifest(root, name=name)


def _place(src: Path, target: Path, *, link: bool) -> None:
    """Copy (or hard-link) one artifact, a file or a folder, to ``target``."""
    if not link:
        if src.is_dir():
            shutil.copytree(src, target)
        else:
            shutil.copy2(src, target)
        return
    try:
        if src.is_dir():
            shutil.copytree(src, target, copy_function=os.link)
        else:
            os.link(src, target)
    except OSError as exc:
        raise BundleError(f"cannot hard-link {src} into {target.parent} ({exc.strerror}): "
                          "--link needs the bundle on the same filesystem as the model; "
                          "choose a dest there, or copy (drop --link)",
                          code=Status.ERR_IO) from None


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
        shutil.rmtree(self._tmp, ignore_errors=True)

    def __enter__(self) -> ImplicitBundle:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def __repr__(self) -> str:
        return f"<ImplicitBundle {self.source} at {self.root}>"


def not_a_bundle(path: Path) -> BundleError:
    """The error for a path that is neither a bundle folder nor a model artifact."""
    if not path.exists():
        return BundleError(f"{path} does not exist; pass a model file (.gguf, .litertlm, "
                           ".tflite), an MLX folder, or a bundle folder that holds text/")
    known = ", ".join(f.description.removeprefix("text/") for f in FORMATS.values())
    return BundleError(f"{path} is neither a bundle folder (one that holds text/) nor a model "
                       f"artifact this library knows ({known}); make a bundle with "
                       "`eliza-backends bundle create`")


@dataclass(frozen=True)
class VerifyProblem:
    """One mismatch between the manifest and the files on disk."""

    path: str
    problem: str


def verify_bundle(bundle_dir: str | os.PathLike[str], *, hashes: bool = True) -> BundleManifest:
    """Check every manifest file exists inside the bundle with the right size (and sha256).

    Raises :class:`BundleError` listing every problem; returns the manifest when all is well.
    """
    root = Path(bundle_dir)
    if not root.is_dir():
        raise BundleError(f"bundle directory {root} does not exist")
    manifest = load_manifest(root)
    problems: list[VerifyProblem] = []
    for art in manifest.artifacts:
        for rec in art.files:
            path = root / rec.path
            try:
                _ensure_inside(root, path)
            except BundleError:
                problems.append(VerifyProblem(rec.path, "resolves outside the bundle"))
                continue
            if not path.is_file():
                problems.append(VerifyProblem(rec.path, "missing"))
            elif path.stat().st_size != rec.size:
                problems.append(VerifyProblem(
                    rec.path, f"size {path.stat().st_size} != manifest {rec.size}"))
            elif hashes and sha256_file(path) != rec.sha256:
                problems.append(VerifyProblem(rec.path, "sha256 differs from the manifest"))
    if problems:
        listing = "; ".join(f"{p.path}: {p.problem}" for p in problems)
        raise BundleError(f"bundle {root} does not match its manifest: {listing}. "
                          "Re-copy the bundle or rewrite the manifest with `bundle create`.")
    return manifest


__all__ = [
    "FORMATS",
    "MAX_NAME",
    "ArtifactFormat",
    "ArtifactRecord",
    "BundleManifest",
    "DraftKind",
    "FileRecord",
    "ImplicitBundle",
    "artifact_format",
    "check_bundle_name",
    "create_bundle",
    "find_artifacts",
    "is_bundle_dir",
    "is_sidecar",
    "load_manifest",
    "not_a_bundle",
    "scan_artifacts",
    "sidecars_of",
    "verify_bundle",
    "write_manifest",
]
