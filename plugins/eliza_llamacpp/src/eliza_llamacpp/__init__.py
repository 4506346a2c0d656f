"""llama.cpp backend for eliza-backends: the default and the fallback.

This module stays light: it never imports ``llama_cpp``. The runtime is imported by
:meth:`LlamaCppFactory.open`: :mod:`eliza_llamacpp.model` loads the weights,
:mod:`eliza_llamacpp.session` translates the session to llama.cpp through a lane
(:mod:`eliza_llamacpp.lane`: its own context, :mod:`eliza_llamacpp.solo`, or a shared one,
:mod:`eliza_llamacpp.batch_engine`), and :mod:`eliza_llamacpp.draft` /
:mod:`eliza_llamacpp.mtp` are the drafters; they import ``model``, ``llama_context`` and
``lane``, never each other.
"""

from __future__ import annotations

import importlib.util
import os
import sys
from functools import cached_property
from pathlib import Path
from typing import Any

from eliza_backends import (
    Availability,
    BundleError,
    EmbeddingSpec,
    Factory,
    InferenceContext,
    ModelInfo,
    Session,
    Status,
    StreamConfig,
    UnsupportedOperationError,
    hookimpl,
)
from eliza_backends.backend import Drafter, MediaReference, find_artifacts

from .options import LlamaCppOptions

__version__ = "0.1.0"

_LIB_NAMES = {"linux": "libllama.so", "darwin": "libllama.dylib", "win32": "llama.dll"}


class LlamaCppFactory(Factory):
    """Serves ``text/*.gguf`` through llama-cpp-python's low-level API."""

    name = "llama.cpp"
    aliases = ("llamacpp",)
    formats = ("gguf",)
    pip_extra = "llamacpp"
    options_model = LlamaCppOptions
    native_loggers = ("eliza_llamacpp.native",)

    @cached_property
    def _availability(self) -> Availability:
        spec = importlib.util.find_spec("llama_cpp")
        if spec is None or not spec.submodule_search_locations:
            return Availability.missing(
                "llama-cpp-python is not installed: pip install 'eliza-backends[llamacpp]'")
        pkg = Path(next(iter(spec.submodule_search_locations)))
        lib = _LIB_NAMES.get(sys.platform, "libllama.so")
        if not any(pkg.glob(f"lib/{lib}*")) and not any(pkg.glob(f"{lib}*")):
            return Availability.no(
                f"llama-cpp-python at {pkg} has no {lib}: the install is broken, reinstall it "
                "(pip install --force-reinstall --no-cache-dir llama-cpp-python)")
        return Availability.yes(package=str(pkg))

    def available(self) -> Availability:
        """llama_cpp is importable and its shared library is present (found, not imported)."""
        return self._availability

    def preference_rank(self) -> int:
        return 0

    def rank_reason(self) -> str:
        return "the default and fallback (rank 0)"

    def open(self, context: InferenceContext, config: StreamConfig) -> Session:
        """A session on its own ``llama_context``, or, when ``context.parallel > 1``, on one
        sequence of a context shared by ``parallel`` sessions and decoded in batched steps
        (:mod:`eliza_llamacpp.batch_engine`; :class:`SessionBusyError` when all are in use)."""
        from .model import pools, shared_model

        options: LlamaCppOptions = self.parse_options(config)
        path = self.artifact(context.bundle_dir, name=options.artifact)
        model = shared_model(context, path, options)
        if pools(model):  # an embedding model: its spec from the header (only then read)
            spec = self._embedding_spec(path, context.bundle_dir)
            if spec is not None:
                return self._open_embedding(context, config, options, path, spec)
        if context.parallel > 1:
            return self._open_batched(context, config, options, model)
        from .session import LlamaCppSession
        from .solo import SoloLane

        if config.drafter == "mtp":
            from .mtp import MtpDrafter

            assistant = shared_model(context, self.mtp_artifact(context.bundle_dir, config),
                                     options)
            return LlamaCppSession(model, config, SoloLane(model, config, options), context,
                                   linked=lambda ctx: MtpDrafter(assistant, model, ctx, config,
                                                                 options))
        drafter = self.make_drafter(context, config, model.info)
        lane = SoloLane(model, config, options)
        try:
            media = self._media_feeder(context, config, model, lane)
        except BaseException:
            lane.close()
            raise
        return LlamaCppSession(model, config, lane, context, drafter, media=media)

    def embedding(self, bundle_dir: str | os.PathLike[str]) -> EmbeddingSpec | None:
        """The first GGUF's pooling and vector length when it is an embedding model (its
        ``<arch>.pooling_type`` is mean, CLS or last: EmbeddingGemma, BERT-likes ...), with
        the bundle's Matryoshka lengths; None for a generation model (a header probe)."""
        try:
            path = self.artifact(bundle_dir)
        except BundleError:
            return None
        return self._embedding_spec(path, bundle_dir)

    @staticmethod
    def _embedding_spec(path: Path, bundle_dir: str | os.PathLike[str]) -> EmbeddingSpec | None:
        from .gguf_header import embedding_spec

        return embedding_spec(path, bundle_dir)

    def _open_embedding(self, context: InferenceContext, config: StreamConfig,
                        options: LlamaCppOptions, path: Path, spec: EmbeddingSpec) -> Session:
        """An embedding model's session (:mod:`eliza_llamacpp.embedding`): no drafter, no
        media, no shared batched context."""
        from .embedding import LlamaCppEmbeddingSession
        from .model import shared_model

        if config.drafter != "none" or config.media:
            raise UnsupportedOperationError(
                f"{path.name} is an embedding model: it takes no drafter and no media")
        return LlamaCppEmbeddingSession(shared_model(context, path, options), config, options,
                                        spec, context)

    def _media_feeder(self, context: InferenceContext, config: StreamConfig, model: Any,
                      lane: Any) -> Any:
        """Images / audio through the bundle's projector (loaded on the first media item), or
        None when the bundle has none."""
        from .bindings import lc
        from .gguf_header import find_projector, projector_kinds
        from .mtmd import MediaFeeder, processor_image_tokens, shared_projector

        path = find_projector(context.bundle_dir)
        kinds = frozenset(projector_kinds(context.bundle_dir))
        if path is None or not kinds:
            return None
        placeholders = {}
        for kind, text in (("image", b"<|image|>"), ("audio", b"<|audio|>")):
            buf = (lc.llama_token * 4)()
            if lc.llama_tokenize(model.vocab, text, len(text), buf, 4, False, True) == 1:
                placeholders[kind] = int(buf[0])
        options: LlamaCppOptions = self.parse_options(config)
        budget = options.image_max_tokens or processor_image_tokens(context.bundle_dir)
        return MediaFeeder(lambda: shared_projector(context, path, model, config.threads,
                                                    budget),
                           kinds, placeholders, lc.llama_n_ubatch(lane.ctx))

    def media(self, bundle_dir: str | os.PathLike[str]) -> dict[str, str]:
        """The kinds the bundle's projector (``text/mmproj/*.gguf``) encodes (a metadata
        probe); sessions with ``drafter="mtp"`` take none."""
        from .gguf_header import projector_kinds

        return projector_kinds(bundle_dir)

    def media_reference(self, session: Session) -> MediaReference | None:
        """llama-cpp-python's own libmtmd path over the session's projector and weights
        (:mod:`eliza_llamacpp.mtmd_reference`), for ``bench``."""
        from .mtmd_reference import MtmdReference
        from .session import LlamaCppSession

        if not isinstance(session, LlamaCppSession) or session._media is None:
            return None
        return MtmdReference(session._model, session.config,
                             self.parse_options(session.config), session._media.projector)

    def _open_batched(self, context: InferenceContext, config: StreamConfig,
                      options: LlamaCppOptions, model: Any) -> Session:
        from .batch_engine import shared_engine
        from .session import LlamaCppSession

        if config.drafter == "mtp":
            raise UnsupportedOperationError(
                "drafter='mtp' reads the session's own llama.cpp context and cannot run on a "
                f"batched one (this InferenceContext has parallel={context.parallel}): use "
                "drafter='ngram' or 'model', or an InferenceContext with parallel=1")
        lane = shared_engine(context, model, config, options).open_lane()
        try:
            drafter = self.make_drafter(context, config, model.info)
            media = self._media_feeder(context, config, model, lane)
            return LlamaCppSession(model, config, lane, context, drafter, media=media)
        except BaseException:
            lane.close()
            raise

    def make_draft_model(self, context: InferenceContext, config: StreamConfig,
                         target: ModelInfo) -> Drafter:
        """A GGUF from ``text/draft/`` (or ``draft_model``) in its own llama.cpp context (the
        first that is not an MTP assistant, which needs ``drafter="mtp"``)."""
        from .draft import DraftModel
        from .model import shared_model

        if config.draft_model is not None:
            path = self.draft_artifact(context.bundle_dir, config)
        else:
            path = self._drafts(context.bundle_dir, mtp=False)[0]
        options: LlamaCppOptions = self.parse_options(config)
        model = shared_model(context, path, options)
        return DraftModel(model, target.vocab_size, config, options)

    def mtp_artifact(self, bundle_dir: str | os.PathLike[str], config: StreamConfig) -> Path:
        """The MTP assistant for ``drafter="mtp"``: ``config.draft_model``, else the first GGUF
        under ``text/draft/mtp/`` (then ``text/draft/``) whose architecture is an assistant's
        (``gemma4-assistant``).
        :class:`BundleError` (``ERR_CANNOT_SERVE``) when there is none."""
        if config.draft_model is not None:
            return self.draft_artifact(bundle_dir, config)
        return self._drafts(bundle_dir, mtp=True)[0]

    def describe(self, bundle_dir: str | os.PathLike[str]) -> str:
        """The GGUF a stream would load and its ``general.architecture`` (a header probe)."""
        from .gguf_header import gguf_architecture

        where = super().describe(bundle_dir)
        if not where:
            return where
        arch = gguf_architecture(Path(bundle_dir) / where)
        return f"{where} (GGUF architecture {arch})" if arch else where

    def drafters(self, bundle_dir: str | os.PathLike[str]) -> dict[str, str]:
        """What each drafter would use on ``bundle_dir`` (for explain / ``select --explain``);
        none for an embedding model (it does not generate)."""
        if self.embedding(bundle_dir) is not None:
            return {}
        root = Path(bundle_dir)
        out = {"ngram": "prompt lookup over the sequence itself (no model)"}
        for kind, mtp in (("model", False), ("mtp", True)):
            try:
                path = self._drafts(bundle_dir, mtp=mtp)[0]
            except BundleError as exc:
                out[kind] = f"cannot: {exc.message}"
                continue
            what = ("the target's multi-token-prediction assistant, drafting from its hidden "
                    "state" if mtp else "a draft model in its own context")
            out[kind] = f"{path.relative_to(root).as_posix()} ({what})"
        return out

    def _drafts(self, bundle_dir: str | os.PathLike[str], *, mtp: bool) -> list[Path]:
        """The GGUFs that are MTP assistants (``mtp``: under ``text/draft/mtp/``, where bundles
        keep them, then ``text/draft/``) or draft models (``text/draft/``), told apart by a
        header probe each; :class:`BundleError` when there are none."""
        from .gguf_header import MTP_ARCHITECTURES, gguf_architecture

        found = find_artifacts(bundle_dir, self.formats, role="draft")
        if mtp:
            heads = Path(bundle_dir) / "text" / "draft" / "mtp"
            found = sorted(p for p in heads.glob("*.gguf") if not p.name.startswith(".")) + found
        found = [p for p in found if (gguf_architecture(p) in MTP_ARCHITECTURES) == mtp]
        if not found:
            what = ("MTP assistant under text/draft/mtp/ (a gemma4-assistant GGUF, as `bundle "
                    "convert` writes for a Gemma 4 model with its assistant); use "
                    "drafter='ngram' for this bundle" if mtp else "draft model under "
                    "text/draft/ (a smaller GGUF with the same vocabulary; an MTP assistant "
                    "there needs drafter='mtp'); ship one, or set draft_model")
            raise BundleError(f"{bundle_dir} has no {what}", code=Status.ERR_CANNOT_SERVE)
        return found


@hookimpl
def eliza_backends_factories() -> list[Factory]:
    """The llama.cpp factory."""
    return [LlamaCppFactory()]


__all__ = ["LlamaCppFactory", "LlamaCppOptions", "eliza_backends_factories"]
