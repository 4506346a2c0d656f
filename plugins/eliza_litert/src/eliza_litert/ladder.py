"""The accelerator ladder, as data: Google Tensor NPU -> Qualcomm QNN -> MediaTek NeuroPilot ->
GPU -> CPU.

Each :class:`Rung` names the files that must be present for it to work (the LiteRT dispatch
library and the vendor SDK library for an NPU, the GPU accelerator library and a GPU device node
for the GPU) and is probed by looking for files only: nothing is imported or loaded, so a probe
is cheap and safe in ``available()``. The first rung whose probe passes is used; the rungs
above it are reported with the reason they were skipped.

``ELIZA_LITERT_ACCELERATOR`` (or the ``accelerator`` option) forces one rung by name; a forced
rung that is absent is a loud error, never a silent fall-through.

Probes take a :class:`Host` (environment, library search directories, file existence), so the
ladder's logic is tested with honest fakes of the host and the CPU rung for real.
"""

from __future__ import annotations

import glob
import os
import sys
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path

ACCELERATOR_ENV = "ELIZA_LITERT_ACCELERATOR"
DISPATCH_DIR_ENV = "LITERT_DISPATCH_LIB_DIR"


@dataclass(frozen=True)
class Host:
    """What a probe may look at: environment, library directories, and file existence."""

    environ: Mapping[str, str]
    lib_dirs: tuple[str, ...]
    exists: Callable[[str], bool] = os.path.exists
    glob: Callable[[str], list[str]] = glob.glob

    def find_lib(self, name: str) -> str | None:
        """The first ``name`` under the library directories, or None."""
        for d in self.lib_dirs:
            candidate = os.path.join(d, name)
            if self.exists(candidate):
                return candidate
        return None


def _package_dirs(*names: str) -> list[str]:
    """Directories of installed packages, found without importing them."""
    import importlib.util

    dirs: list[str] = []
    for name in names:
        try:
            spec = importlib.util.find_spec(name)
        except (ImportError, ValueError):
            continue
        if spec is not None and spec.submodule_search_locations:
            dirs.extend(str(p) for p in spec.submodule_search_locations)
    return dirs


def real_host(environ: Mapping[str, str] | None = None) -> Host:
    """This machine: the dispatch-library dir env, LD_LIBRARY_PATH, the vendor SDK roots, the
    Android vendor/system library dirs, and the ai-edge-litert / litert-lm packages."""
    env = os.environ if environ is None else environ
    dirs: list[str] = []
    if env.get(DISPATCH_DIR_ENV):
        dirs.append(env[DISPATCH_DIR_ENV])
    for var in ("LD_LIBRARY_PATH", "DYLD_LIBRARY_PATH"):
        dirs.extend(d for d in env.get(var, "").split(os.pathsep) if d)
    for root_var in ("QNN_SDK_ROOT", "QAIRT_SDK_ROOT"):
        if env.get(root_var):
            dirs.append(str(Path(env[root_var]) / "lib" / "aarch64-android"))
            dirs.append(str(Path(env[root_var]) / "lib" / "x86_64-linux-clang"))
    if env.get("NEUROPILOT_SDK_ROOT"):
        dirs.append(str(Path(env["NEUROPILOT_SDK_ROOT"]) / "lib"))
    dirs += ["/vendor/lib64", "/system/lib64", "/odm/lib64"]
    for pkg in _package_dirs("ai_edge_litert", "litert_lm"):
        dirs += [pkg, os.path.join(pkg, "vendors")]
    return Host(environ=env, lib_dirs=tuple(dict.fromkeys(dirs)))


@dataclass(frozen=True)
class Probe:
    """Outcome of probing one rung: ``ok``, and the evidence or the reason it was skipped."""

    ok: bool
    reason: str
    found: tuple[str, ...] = ()


@dataclass(frozen=True)
class Rung:
    """One step of the ladder: name, what LiteRT-LM calls the backend, the rank it earns, and
    the files it needs (every group of ``libraries`` needs one hit; ``devices`` globs need one
    match)."""

    name: str
    label: str
    engine_backend: str  # "npu" | "gpu" | "cpu" (litert_lm.Backend)
    rank: int
    libraries: tuple[tuple[str, ...], ...] = ()
    devices: tuple[str, ...] = ()
    platforms: tuple[str, ...] = ()  # sys.platform prefixes; empty = any

    def probe(self, host: Host, platform: str = sys.platform) -> Probe:
        """Look for the rung's files (never imports or loads anything)."""
        if self.platforms and not platform.startswith(self.platforms):
            return Probe(False, f"not on {'/'.join(self.platforms)} (this is {platform})")
        found: list[str] = []
        for group in self.libraries:
            hit = next((p for p in map(host.find_lib, group) if p), None)
            if hit is None:
                return Probe(False, f"no {' or '.join(group)} found")
            found.append(hit)
        if self.devices:
            dev = next((m for pattern in self.devices for m in host.glob(pattern)), None)
            if dev is None:
                return Probe(False, f"no GPU device node ({', '.join(self.devices)})")
            found.append(dev)
        why = "found " + ", ".join(found) if found else "always available"
        return Probe(True, why, tuple(found))


#: The ladder, top to bottom. The CPU rung always works.
LADDER: tuple[Rung, ...] = (
    Rung("google-tensor", "Google Tensor NPU", "npu", 40,
         libraries=(("libLiteRtDispatch_GoogleTensor.so",), ("libedgetpu_litert.so",
                                                             "libedgetpu_util.so")),
         platforms=("linux",)),
    Rung("qualcomm", "Qualcomm QNN NPU", "npu", 40,
         libraries=(("libLiteRtDispatch_Qualcomm.so",), ("libQnnHtp.so",)),
         platforms=("linux",)),
    Rung("mediatek", "MediaTek NeuroPilot NPU", "npu", 40,
         libraries=(("libLiteRtDispatch_MediaTek.so",),
                    ("libneuronusdk_adapter.mtk.so", "libneuron_adapter.so")),
         platforms=("linux",)),
    Rung("gpu", "GPU", "gpu", 20,
         libraries=(("libLiteRtGpuAccelerator.so", "libLiteRtOpenClAccelerator.so",
                     "libLiteRtWebGpuAccelerator.so", "libLiteRtMetalAccelerator.dylib"),),
         devices=("/dev/dri/renderD*", "/dev/nvidia[0-9]*", "/dev/kgsl-3d0", "/dev/mali*")),
    Rung("cpu", "CPU (XNNPACK)", "cpu", 0),
)

RUNG_NAMES = tuple(r.name for r in LADDER)


@dataclass(frozen=True)
class LadderResult:
    """The rung that would run, the ones skipped above it (with reasons), or the error."""

    chosen: Rung | None
    probe: Probe | None
    skipped: tuple[tuple[Rung, Probe], ...] = ()
    forced_by: str | None = None
    error: str | None = None
    probes: dict[str, Probe] = field(default_factory=dict)

    def detail(self) -> dict[str, str]:
        """Facts for ``Availability.detail`` / ``explain()``."""
        out: dict[str, str] = {}
        if self.chosen is not None:
            out["accelerator"] = self.chosen.name
            out["accelerator_why"] = (f"forced by {self.forced_by}" if self.forced_by else
                                      "first working rung") + (
                f": {self.probe.reason}" if self.probe else "")
        for rung, probe in self.skipped:
            out[f"skipped.{rung.name}"] = probe.reason
        return out

    def summary(self) -> str:
        """One line: chosen rung and why the rungs above were skipped."""
        if self.chosen is None:
            return self.error or "no rung"
        head = f"{self.chosen.label} ({self.chosen.name})"
        if self.forced_by:
            return f"{head} forced by {self.forced_by}"
        skipped = "; ".join(f"{r.name}: {p.reason}" for r, p in self.skipped)
        return head + (f"; skipped {skipped}" if skipped else "")


def resolve(host: Host, *, force: str | None = None, forced_by: str | None = None,
            ladder: Sequence[Rung] = LADDER, platform: str = sys.platform) -> LadderResult:
    """Walk the ladder: the first rung whose probe passes, or the forced rung (an error if its
    probe fails or the name is unknown)."""
    if force is not None and force.strip():
        key = force.strip().lower()
        rung = next((r for r in ladder if r.name == key), None)
        if rung is None:
            return LadderResult(None, None, forced_by=forced_by, error=(
                f"{forced_by} asks for accelerator {force!r}, which is not a rung of the "
                f"ladder ({', '.join(r.name for r in ladder)})"))
        probe = rung.probe(host, platform)
        if not probe.ok:
            return LadderResult(None, probe, forced_by=forced_by, error=(
                f"{forced_by} forces the {rung.label} rung ({rung.name}), which is not usable "
                f"on this host: {probe.reason}"), probes={rung.name: probe})
        return LadderResult(rung, probe, forced_by=forced_by, probes={rung.name: probe})
    skipped: list[tuple[Rung, Probe]] = []
    probes: dict[str, Probe] = {}
    for rung in ladder:
        probe = rung.probe(host, platform)
        probes[rung.name] = probe
        if probe.ok:
            return LadderResult(rung, probe, tuple(skipped), probes=probes)
        skipped.append((rung, probe))
    return LadderResult(None, None, tuple(skipped), error="no rung of the ladder is usable",
                        probes=probes)


__all__ = ["ACCELERATOR_ENV", "DISPATCH_DIR_ENV", "LADDER", "RUNG_NAMES", "Host",
           "LadderResult", "Probe", "Rung", "real_host", "resolve"]
