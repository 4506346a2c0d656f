"""Bundle layout, manifest writing/reading/verification, and path safety."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest
from conftest import TINY_BUNDLE

from eliza_backends import BundleError, create_bundle, load_manifest, verify_bundle
from eliza_backends.bundle import find_artifacts
from eliza_backends.manifest import write_manifest


def _artifacts(tmp_path: Path) -> list[Path]:
    src = tmp_path / "src"
    src.mkdir()
    (src / "m.gguf").write_bytes(b"GGUF" + b"\0" * 60)
    mlx = src / "m-mlx"
    mlx.mkdir()
    (mlx / "config.json").write_text("{}")
    (mlx / "model.safetensors").write_bytes(b"\0" * 16)
    (src / "m.litertlm").write_bytes(b"x" * 32)
    return [src / "m.gguf", mlx, src / "m.litertlm"]


def test_create_then_verify(tmp_path: Path) -> None:
    arts = _artifacts(tmp_path)
    draft = tmp_path / "d.gguf"
    draft.write_bytes(b"GGUF")
    manifest = create_bundle(tmp_path / "b", arts, drafts=[draft], name="demo")
    assert manifest.name == "demo"
    by_path = {a.path: a for a in manifest.artifacts}
    assert by_path["text/m.gguf"].backend == "llama.cpp"
    assert by_path["text/m-mlx"].format == "mlx" and len(by_path["text/m-mlx"].files) == 2
    assert by_path["text/m.litertlm"].backend == "litert-lm"
    assert by_path["text/draft/d.gguf"].role == "draft"
    assert verify_bundle(tmp_path / "b") == manifest
    assert load_manifest(tmp_path / "b") == manifest


def test_verify_reports_every_mismatch(tmp_path: Path) -> None:
    create_bundle(tmp_path / "b", _artifacts(tmp_path))
    (tmp_path / "b" / "text" / "m.gguf").write_bytes(b"GGUF" + b"\1" * 60)  # same size
    (tmp_path / "b" / "text" / "m.litertlm").write_bytes(b"short")
    (tmp_path / "b" / "text" / "m-mlx" / "config.json").unlink()
    with pytest.raises(BundleError) as info:
        verify_bundle(tmp_path / "b")
    msg = info.value.message
    assert "m.gguf: sha256 differs" in msg and "m.litertlm: size 5" in msg
    assert "config.json: missing" in msg
    verify_bundle_sizes_only = pytest.raises(BundleError)
    with verify_bundle_sizes_only:
        verify_bundle(tmp_path / "b", hashes=False)


def test_create_refuses_unknown_and_existing(tmp_path: Path) -> None:
    bogus = tmp_path / "notes.txt"
    bogus.write_text("hi")
    with pytest.raises(BundleError, match="not a model artifact"):
        create_bundle(tmp_path / "b", [bogus])
    arts = _artifacts(tmp_path)
    create_bundle(tmp_path / "b2", arts[:1])
    with pytest.raises(BundleError, match="already exists"):
        create_bundle(tmp_path / "b2", arts[:1])
    with pytest.raises(BundleError, match="does not exist"):
        create_bundle(tmp_path / "b3", [tmp_path / "missing.gguf"])


@pytest.mark.parametrize("manifest, needle", [
    ("not json", "not valid JSON"),
    ("[]", "invalid"),
    ('{"schema_version": 1, "name": "x", "artifacts": "no"}', "artifacts"),
    ('{"schema_version": 2, "name": "x", "artifacts": []}', "schema_version"),
    ('{"schema_version": 1, "name": "x", "artifacts": [], "extra": 1}', "unknown field"),
])
def test_bad_manifests(tmp_path: Path, manifest: str, needle: str) -> None:
    (tmp_path / "manifest.json").write_text(manifest)
    with pytest.raises(BundleError, match=needle):
        load_manifest(tmp_path)


@pytest.mark.parametrize("path", ["../escape.gguf", "/etc/passwd", "text/../../x.gguf",
                                  "other/x.gguf", "", "~/x.gguf", "text\\..\\x.gguf"])
def test_manifest_paths_must_stay_inside(tmp_path: Path, path: str) -> None:
    record = {"path": path, "size": 1, "sha256": "0" * 64}
    data = {"schema_version": 1, "name": "x", "artifacts": [
        {"path": "text/x.gguf", "format": "gguf", "backend": "llama.cpp", "files": [record]}]}
    (tmp_path / "manifest.json").write_text(json.dumps(data))
    with pytest.raises(BundleError):
        load_manifest(tmp_path)


def test_symlink_escaping_the_bundle_is_refused(tmp_path: Path) -> None:
    outside = tmp_path / "outside.gguf"
    outside.write_bytes(b"GGUF")
    bundle = tmp_path / "b"
    (bundle / "text").mkdir(parents=True)
    os.symlink(outside, bundle / "text" / "m.gguf")
    with pytest.raises(BundleError, match="outside the bundle"):
        write_manifest(bundle)
    data = {"schema_version": 1, "name": "x", "artifacts": [
        {"path": "text/m.gguf", "format": "gguf", "backend": "llama.cpp",
         "files": [{"path": "text/m.gguf", "size": 4, "sha256": "0" * 64}]}]}
    (bundle / "manifest.json").write_text(json.dumps(data))
    with pytest.raises(BundleError, match="resolves outside the bundle"):
        verify_bundle(bundle)


def test_missing_or_empty_bundles(tmp_path: Path) -> None:
    with pytest.raises(BundleError, match="does not exist"):
        verify_bundle(tmp_path / "nope")
    with pytest.raises(BundleError, match=r"manifest\.json not found"):
        load_manifest(tmp_path)
    with pytest.raises(BundleError, match=r"no text/ directory"):
        write_manifest(tmp_path)
    (tmp_path / "text").mkdir()
    with pytest.raises(BundleError, match="no model artifact"):
        write_manifest(tmp_path)
    assert find_artifacts(tmp_path / "nope", ["gguf"]) == []


def test_the_tiny_bundle_matches_its_manifest() -> None:
    manifest = verify_bundle(TINY_BUNDLE)
    formats = {a.format for a in manifest.artifacts if a.role == "model"}
    assert {"gguf", "mlx", "litertlm", "tflite"} <= formats
    assert any(a.role == "draft" for a in manifest.artifacts)
