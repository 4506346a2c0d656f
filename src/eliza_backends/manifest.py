"""The bundle manifest: ``<bundle>/manifest.json``, what a bundle ships, with sizes and sha256.

Pydantic models (:class:`BundleManifest`, :class:`ArtifactRecord`, :class:`FileRecord`), and
the operations that read, write and check them: :func:`load_manifest`, :func:`scan_artifacts`
(hashes every file), :func:`write_manifest`, :func:`create_bundle`, :func:`verify_bundle`.
Opening a bundle needs none of this (:mod:`eliza_backends.bundle` probes the layout), so this
module, and pydantic with it, is imported only when a manifest is read or written. Import the
names from :mod:`eliza_backends.bundle` (they are re-exported there).
"""

from __future__ import annotations

import json
import os
import shutil
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path, PurePosixPath
from typing import Annotated, Literal

from pydantic import AfterValidator, BaseModel, ConfigDict, Field, ValidationError

from .bundle import (
    DRAFT_DIR,
    FORMATS,
    MANIFEST_NAME,
    MMPROJ_DIR,
    MTP_DIR,
    SCHEMA_VERSION,
    SIDECAR_FORMAT,
    TEXT_DIR,
    ArtifactRole,
    DraftKind,
    artifact_format,
    is_sidecar,
    sidecars_of,
)
from .errors import BundleError, InvalidArgumentError, Status, describe_validation_error
from .hashing import sha256_file


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
    "MAX_NAME",
    "ArtifactRecord",
    "BundleManifest",
    "FileRecord",
    "VerifyProblem",
    "check_bundle_name",
    "create_bundle",
    "load_manifest",
    "scan_artifacts",
    "verify_bundle",
    "write_manifest",
]
