"""MLX / Core ML backend for eliza-backends (factory ``mlx-coreml``, aliases ``mlx``, ``coreml``).

Serves an MLX weights folder under ``<bundle>/text/`` through mlx-lm (Apple silicon with Metal,
and the Linux CPU/CUDA builds of mlx), and ``text/*.mlpackage`` / ``text/*.mlmodelc`` through
coremltools on macOS 15+.

This module stays light: it never imports mlx, mlx-lm or coremltools. :meth:`MLXFactory.open`
imports them: :mod:`eliza_mlx.model` loads MLX weights, :mod:`eliza_mlx.session` and
:mod:`eliza_mlx.draft` translate the session and the draft model to mlx-lm (both import
``model``, never each other), :mod:`eliza_mlx.mtp` drafts with Gemma 4's MTP assistant through
mlx-vlm (imported only for ``drafter="mtp"``), :mod:`eliza_mlx.coreml_session` serves Core ML.
On an ``InferenceContext(parallel > 1)``, :mod:`eliza_mlx.batched_session` sessions share one
batched forward per step through :mod:`eliza_mlx.batch_engine` (``capabilities.batched``).
"""

from __future__ import annotations

import importlib.util
import json
import logging
import os
import sys
from functools import cached_property
from pathlib import Path
from typing import TYPE_CHECKING

from eliza_backends import (
    Availability,
    BackendSelectionError,
    BundleError,
    Factory,
    InferenceContext,
    InvalidArgumentError,
    ModelInfo,
    Session,
    Status,
    StreamConfig,
    hookimpl,
)
from eliza_backends.backend import Drafter, find_artifacts

from .options import MLXOptions
from .probe import MTP_ASSISTANTS, check_mlx_folder, check_mtp_assistant, coreml_status, mlx_status

if TYPE_CHECKING:
    from .model import LoadedMLX

_log = logging.getLogger(__name__)

__version__ = "0.1.0"

MLX_FORMATS = ("mlx",)
COREML_FORMATS = ("mlpackage", "mlmodelc")

#: Auto-selection rank where mlx runs on a Metal GPU: above llama.cpp's 0.
RANK_METAL = 10
#: Rank where mlx only has its CPU (or CUDA) backend: below llama.cpp. Measured on a 2-core
#: x86_64 Linux host (benchmarks/bench_mlx.py --llama): llama.cpp (1 thread) decodes 11x faster
#: than mlx-lm CPU on the tiny bundle and 14x faster on a 0.85 B-shape fp16/F16 llama (7.0 vs
#: 0.5 tok/s), with 6-16x shorter time to first token.
RANK_CPU = -10


class MLXFactory(Factory):
    """MLX weights folders through mlx-lm; Core ML models through coremltools on macOS 15+."""

    name = "mlx-coreml"
    aliases = ("mlx", "coreml")
    formats = (*MLX_FORMATS, *COREML_FORMATS)
    pip_extra = "mlx"
    options_model = MLXOptions

    @cached_property
    def _availability(self) -> Availability:
        mlx, coreml = mlx_status(), coreml_status()
        detail = dict(mlx.detail)
        detail["mlx"] = f"yes ({mlx.device})" if mlx.ok else f"no: {mlx.reason}"
        detail["coreml"] = f"yes ({coreml.device})" if coreml.ok else f"no: {coreml.reason}"
        detail.update(coreml.detail)
        if mlx.ok or coreml.ok:
            return Availability(True, "", detail)
        return Availability(False, f"{mlx.reason}; {coreml.reason}", detail,
                            installed=mlx.installed)

    def available(self) -> Availability:
        """mlx-lm can run (mlx with a backend library) or Core ML can predict (macOS 15+).

        ``detail`` says which engines work and why the others do not; nothing is imported."""
        return self._availability

    def can_serve(self, bundle_dir: str | os.PathLike[str]) -> bool:
        """An MLX folder where mlx-lm runs, or a ``.mlpackage`` / ``.mlmodelc`` where Core ML
        runs: what :meth:`open` would open (``explain()`` predicts it). Where neither engine
        runs (an unavailable backend), an artifact of either kind counts, so the selector
        says the backend is unavailable rather than that the bundle lacks an artifact."""
        mlx, coreml = mlx_status(), coreml_status()
        if find_artifacts(bundle_dir, MLX_FORMATS) and (mlx.ok or not coreml.ok):
            return True
        return bool(find_artifacts(bundle_dir, COREML_FORMATS)) and (coreml.ok or not mlx.ok)

    def describe(self, bundle_dir: str | os.PathLike[str]) -> str:
        """The MLX folder (else the Core ML package) a stream would load; for an MLX folder
        its ``config.json`` ``model_type`` (the architecture mlx-lm builds)."""
        folders = find_artifacts(bundle_dir, MLX_FORMATS)
        if not folders:
            found = find_artifacts(bundle_dir, COREML_FORMATS)
            return found[0].relative_to(bundle_dir).as_posix() if found else ""
        where = folders[0].relative_to(bundle_dir).as_posix()
        try:
            kind = json.loads((folders[0] / "config.json").read_text(encoding="utf-8")) \
                .get("model_type")
        except (OSError, ValueError, AttributeError):
            kind = None
        return f"{where} (model_type {kind})" if isinstance(kind, str) else where

    def media(self, bundle_dir: str | os.PathLike[str]) -> dict[str, str]:
        """The kinds a multimodal Gemma 4 (or Gemma 4 Unified) MLX folder takes (its
        config.json), through mlx-vlm when it is installed; none otherwise (no load, nothing
        imported)."""
        from .probe import multimodal_kinds

        folders = find_artifacts(bundle_dir, MLX_FORMATS)
        if not folders or importlib.util.find_spec("mlx_vlm") is None:
            return {}
        where = folders[0].relative_to(bundle_dir).as_posix()
        # Gemma 4's towers, or Gemma 4 Unified's raw-patch / raw-frame projections
        part = {"image": "vision input", "audio": "audio input"}
        return {kind: f"{where} {part[kind]} (mlx-vlm)"
                for kind in sorted(multimodal_kinds(folders[0]))}

    def cannot_serve_reason(self, bundle_dir: str | os.PathLike[str]) -> str:
        coreml = coreml_status()
        if find_artifacts(bundle_dir, COREML_FORMATS) and not coreml.ok:
            return (f"the Core ML model under text/ cannot run here: {coreml.reason} (ship an "
                    "MLX folder or a GGUF for this host)")
        if find_artifacts(bundle_dir, MLX_FORMATS):
            return f"the MLX folder under text/ cannot run here: {mlx_status().reason}"
        return super().cannot_serve_reason(bundle_dir)

    def pinned(self, name: str) -> Factory:
        """``coreml`` asks for the Core ML engine alone (it fails loudly where Core ML cannot
        run, never opening MLX instead); the other names get the whole backend."""
        return CoreMLOnlyFactory() if name.lower() == "coreml" else self

    def preference_rank(self) -> int:
        mlx, coreml = mlx_status(), coreml_status()
        if (mlx.ok and mlx.device == "metal") or coreml.ok:
            return RANK_METAL
        return RANK_CPU

    def rank_reason(self) -> str:
        mlx, coreml = mlx_status(), coreml_status()
        if mlx.ok and mlx.device == "metal":
            return "mlx runs on the Metal GPU, ahead of llama.cpp"
        if coreml.ok:
            return "Core ML runs on this Mac, ahead of llama.cpp"
        if mlx.ok:
            return (f"no Metal here (mlx {mlx.device} backend), where mlx-lm "
                    "is measured far slower than llama.cpp; auto-selection prefers llama.cpp "
                    "when it can serve, a hard select (mlx / coreml) still reaches this backend; "
                    f"Core ML: {coreml.reason}")
        return mlx.reason

    def open(self, context: InferenceContext, config: StreamConfig) -> Session:
        return self._open(context, config, self.parse_options(config).engine)

    def _open(self, context: InferenceContext, config: StreamConfig,
              engine: str) -> Session:
        options: MLXOptions = self.parse_options(config)
        mlx, coreml = mlx_status(), coreml_status()
        bundle = context.bundle_dir
        if engine in ("auto", "mlx"):
            if mlx.ok and find_artifacts(bundle, MLX_FORMATS):
                _import_mlx_modules()
                from .model import shared_weights
                from .session import MLXSession

                path = self.artifact(bundle, name=options.artifact, formats=MLX_FORMATS)
                loaded = shared_weights(context, path)
                batched = _open_batched(context, config, loaded, path)
                if batched is not None:
                    return batched
                drafter = self.make_drafter(context, config, loaded.info, greedy_only=True)
                return MLXSession(loaded, config, context, drafter)
            if engine == "mlx" or not find_artifacts(bundle, COREML_FORMATS):
                why = mlx.reason if not mlx.ok else "no MLX weights folder under text/"
                raise BackendSelectionError(
                    f"{self.name} cannot serve {bundle} with MLX: {why}",
                    code=Status.ERR_CANNOT_SERVE if mlx.ok else Status.ERR_BACKEND_UNAVAILABLE)
        if not find_artifacts(bundle, COREML_FORMATS):
            raise BackendSelectionError(
                f"{self.name}: {bundle} ships no .mlpackage / .mlmodelc under text/ for Core ML",
                code=Status.ERR_CANNOT_SERVE)
        if not coreml.ok:
            hint = ("ship an MLX folder or a GGUF for this host" if engine == "auto"
                    else "use engine='mlx' or another backend on this host")
            raise BackendSelectionError(
                f"{self.name}: the Core ML model in {bundle} cannot run here: {coreml.reason}. "
                f"Core ML prediction needs macOS; {hint}",
                code=Status.ERR_BACKEND_UNAVAILABLE)
        from .coreml_session import open_session as open_coreml  # pragma: no cover - macOS

        path = self.artifact(bundle, name=options.artifact,  # pragma: no cover
                             formats=COREML_FORMATS)
        return open_coreml(context, config, options, path)  # pragma: no cover

    def make_draft_model(self, context: InferenceContext, config: StreamConfig,
                         target: ModelInfo) -> Drafter:
        """An MLX folder from ``text/draft/`` (or ``draft_model``) with its own prompt cache."""
        _import_mlx_modules(draft=True)
        from .draft import MLXDraftModel
        from .model import shared_weights

        path = self.draft_artifact(context.bundle_dir, config, formats=MLX_FORMATS)
        return MLXDraftModel(shared_weights(context, path), target.vocab_size,
                             config.batch_size)

    def make_mtp_drafter(self, context: InferenceContext, config: StreamConfig,
                         target: ModelInfo) -> Drafter:
        """Gemma 4's MTP assistant (:meth:`mtp_artifact`) through mlx-vlm, over the session's
        target model (:mod:`eliza_mlx.mtp`); :class:`BundleError` when it is not the target's."""
        _import_mlx_modules()
        from .model import shared_weights
        from .mtp import MLXMtpDrafter, shared_assistant

        path = self.mtp_artifact(context.bundle_dir, config)
        assert target.artifact is not None  # the MLX folder the session loaded
        loaded = shared_weights(context, Path(target.artifact))
        return MLXMtpDrafter(shared_assistant(context, path, loaded), loaded)

    def mtp_artifact(self, bundle_dir: str | os.PathLike[str], config: StreamConfig) -> Path:
        """The MTP assistant for ``drafter="mtp"``: ``config.draft_model``, else the first MLX
        folder under ``text/draft/mtp/``. :class:`BundleError` (``ERR_CANNOT_SERVE``) when
        there is none."""
        if config.draft_model is not None:
            return self.draft_artifact(bundle_dir, config, formats=MLX_FORMATS)
        found = find_artifacts(bundle_dir, MLX_FORMATS, role="draft", kind="mtp")
        if not found:
            raise BundleError(
                f"{bundle_dir} has no MTP assistant MLX folder under text/draft/mtp/ (a "
                f"{' or '.join(sorted(MTP_ASSISTANTS))} folder, as `bundle convert --draft` "
                "writes for a Gemma 4 model with MLX in the plan); use drafter='ngram' for this "
                "bundle", code=Status.ERR_CANNOT_SERVE)
        return found[0]

    def drafters(self, bundle_dir: str | os.PathLike[str]) -> dict[str, str]:
        """What each drafter would use on ``bundle_dir`` with MLX (for explain / ``select
        --explain``): folder probes, nothing loaded."""
        out = {"ngram": "prompt lookup over the sequence itself (no model)"}
        root = Path(bundle_dir)
        drafts = find_artifacts(bundle_dir, MLX_FORMATS, role="draft")
        out["model"] = (f"{drafts[0].relative_to(root).as_posix()} (a draft model with its own "
                        "prompt cache)" if drafts else "cannot: no MLX draft model folder under "
                        "text/draft/ (a smaller model with the same vocabulary)")
        try:
            path = self.mtp_artifact(bundle_dir, StreamConfig())
            targets = find_artifacts(bundle_dir, MLX_FORMATS)
            if targets:
                check_mtp_assistant(check_mlx_folder(path), check_mlx_folder(targets[0]))
        except BundleError as exc:
            out["mtp"] = f"cannot: {exc.message}"
        else:
            out["mtp"] = (f"{path.relative_to(root).as_posix()} (the target's multi-token-"
                          "prediction assistant through mlx-vlm, drafting from its hidden "
                          "state and KV cache)")
        return out


class CoreMLOnlyFactory(MLXFactory):
    """What ``backend="coreml"`` gets: this backend restricted to its Core ML engine (so a
    hard request for Core ML fails loudly where Core ML cannot run instead of opening MLX)."""

    def available(self) -> Availability:
        coreml = coreml_status()
        if coreml.ok:
            return Availability.yes(coreml=f"yes ({coreml.device})", **coreml.detail)
        return Availability(False, coreml.reason, {"coreml": f"no: {coreml.reason}"},
                            installed=coreml.installed)

    def can_serve(self, bundle_dir: str | os.PathLike[str]) -> bool:
        return bool(find_artifacts(bundle_dir, COREML_FORMATS))

    def cannot_serve_reason(self, bundle_dir: str | os.PathLike[str]) -> str:
        return "no .mlpackage / .mlmodelc under text/ for Core ML"

    def drafters(self, bundle_dir: str | os.PathLike[str]) -> dict[str, str]:
        """None: Core ML sessions do not draft."""
        return {}

    def pinned(self, name: str) -> Factory:
        return self

    def open(self, context: InferenceContext, config: StreamConfig) -> Session:
        engine = self.parse_options(config).engine
        if engine == "mlx":
            raise InvalidArgumentError("backend='coreml' asks for the Core ML engine but the "
                                       "options ask for engine='mlx'; use backend='mlx' for it")
        return self._open(context, config, "coreml")


def _open_batched(context: InferenceContext, config: StreamConfig, loaded: LoadedMLX,
                  path: Path) -> Session | None:
    """A row of the context's batch engine when ``context.parallel > 1`` and the session can
    be batched; None for an ordinary session: ``parallel`` 1, a speculative drafter (verify
    rounds are not batched), or a model whose caches have no batched form (logged; the session's
    ``capabilities.batched`` then says False)."""
    if context.parallel < 2 or config.drafter != "none":
        return None
    _import_mlx_modules(batched=True)
    from .batch_engine import BatchEngine, unbatchable
    from .batched_session import BatchedMLXSession
    from .mlx_thread import MLX_THREAD

    why = MLX_THREAD.run(lambda: unbatchable(loaded.model))
    if why is not None:
        _log.warning("%s: sessions are not batched (parallel=%d ignored): %s",
                     path.name, context.parallel, why)
        return None
    engine = context.shared(("mlx-batch", str(path), context.parallel),
                            lambda: BatchEngine(loaded, context.parallel, config.batch_size),
                            BatchEngine.close)
    context.track_scheduler(engine.scheduler)
    return BatchedMLXSession(loaded, config, context, engine)


def _import_mlx_modules(*, batched: bool = False, draft: bool = False) -> None:
    """Import the modules that use mlx on the MLX thread (:mod:`eliza_mlx.mlx_thread`): their
    import runs mlx calls (mlx-lm's, the compute stream's), and a thread that made mlx calls
    must not end before the process does. The session's always; the batch engine's
    (``batched``) and the draft model's (``draft``) only for a stream that uses them (a
    session's first token does not wait for them: issue 42)."""
    from .mlx_thread import MLX_THREAD

    wanted = ("eliza_mlx.session", *(("eliza_mlx.batched_session",) if batched else ()),
              *(("eliza_mlx.draft",) if draft else ()))
    if any(name not in sys.modules for name in wanted):
        MLX_THREAD.run(lambda: _import_on_mlx_thread(batched, draft))


def _import_on_mlx_thread(batched: bool, draft: bool) -> None:
    from . import session  # noqa: F401  (imported for their mlx calls)

    if batched:
        from . import batch_engine, batched_session  # noqa: F401
    if draft:
        from . import draft as _draft  # noqa: F401


def host_summary() -> str:
    """One line: what this backend can run on this host (for READMEs and bug reports)."""
    mlx, coreml = mlx_status(), coreml_status()
    return (f"{sys.platform}: mlx {'ok (' + mlx.device + ')' if mlx.ok else 'no: ' + mlx.reason};"
            f" Core ML {'ok' if coreml.ok else 'no: ' + coreml.reason}")


@hookimpl
def eliza_backends_factories() -> list[Factory]:
    """The MLX / Core ML factory."""
    return [MLXFactory()]


__all__ = ["CoreMLOnlyFactory", "MLXFactory", "MLXOptions", "eliza_backends_factories",
           "host_summary"]
