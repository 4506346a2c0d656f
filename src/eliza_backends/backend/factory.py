"""A backend (the seed's ``LlmBackendFactory``): :class:`Factory`, one instance per installed
runtime, registered through the ``eliza_backends`` entry-point group. It says whether it runs
here (``available``), whether it serves a bundle (``can_serve``, ``rank``), and opens
:class:`~eliza_backends.backend.session.Session` objects on an inference context; the drafter
of a speculative session is made here too (:meth:`Factory.make_drafter`).
"""

from __future__ import annotations

import os
from abc import ABC, abstractmethod
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any, ClassVar, Literal

from ..bundle import artifact_format, find_artifacts
from ..config import StreamConfig
from ..errors import (
    BundleError,
    InvalidArgumentError,
    Status,
    UnsupportedOperationError,
    describe_validation_error,
)
from ..frozen_model import FrozenModel
from ..runtime.speculative import Drafter, NgramDrafter
from .model_info import ModelInfo
from .types import Availability, EmbeddingSpec, MediaReference

if TYPE_CHECKING:
    from pydantic import BaseModel

    from .context import InferenceContext
    from .session import Session


class Factory(ABC):
    """A backend (the seed's ``LlmBackendFactory``): one instance per installed runtime.

    ``available()`` and ``can_serve()`` must be cheap: no model load, no heavy import.
    """

    #: Canonical backend name, e.g. ``"llama.cpp"``.
    name: ClassVar[str]
    #: Other names ``ELIZA_LLM_BACKEND`` / ``backend=`` accept (case-insensitive).
    aliases: ClassVar[tuple[str, ...]] = ()
    #: Artifact formats (see :data:`eliza_backends.bundle.FORMATS`) this backend serves.
    formats: ClassVar[tuple[str, ...]] = ()
    #: The ``pip install eliza-backends[<extra>]`` extra that installs this backend.
    pip_extra: ClassVar[str | None] = None
    #: The model of this backend's ``StreamConfig.options[name]``; None = takes none. A
    #: :class:`~eliza_backends.frozen_model.FrozenModel` (declared as a pydantic model is;
    #: validates well-typed options without importing pydantic: the in-tree plugins') or a
    #: pydantic ``BaseModel``.
    options_model: ClassVar[type[FrozenModel] | type[BaseModel] | None] = None
    #: Names of the :mod:`logging` loggers the runtime's native output goes to (e.g.
    #: ``("eliza_llamacpp.native",)``). The ``eliza-backends`` command line sets them to ERROR,
    #: or to its own level with ``-v`` / ``-vv``; declaring them costs nothing (a class
    #: attribute, read from the factory the registry builds, no runtime imported).
    native_loggers: ClassVar[tuple[str, ...]] = ()

    @abstractmethod
    def available(self) -> Availability:
        """Whether the runtime is installed and usable on this host (cheap, cacheable)."""

    def can_serve(self, bundle_dir: str | os.PathLike[str]) -> bool:
        """Whether the bundle ships an artifact this backend serves (a directory probe)."""
        return bool(find_artifacts(bundle_dir, self.formats))

    def cannot_serve_reason(self, bundle_dir: str | os.PathLike[str]) -> str:
        """One line for ``explain()`` and errors: why :meth:`can_serve` is False for
        ``bundle_dir``. A backend whose artifacts may be present yet unrunnable on this host
        (a Core ML model off macOS) overrides it to say so."""
        return f"no {'/'.join(self.formats) or 'matching'} artifact under text/"

    def drafters(self, bundle_dir: str | os.PathLike[str]) -> Mapping[str, str]:
        """For :func:`~eliza_backends.explain`: each speculative drafter kind this backend runs
        (``StreamConfig.drafter``), with one line saying what a stream with it would use on
        ``bundle_dir`` or why it cannot. Cheap (directory and header probes, no model load).
        The default says nothing."""
        return {}

    def media(self, bundle_dir: str | os.PathLike[str]) -> Mapping[str, str]:
        """The media kinds (``"image"``, ``"audio"``) a stream of this backend on
        ``bundle_dir`` takes, each with one line saying what encodes it (the projector file,
        the encoder). Cheap (directory and header probes, no load); what ``explain()`` reports
        and ``StreamConfig.media`` is checked against before a load. The default: none. It
        must agree with the opened session's ``capabilities.media``."""
        return {}

    def media_reference(self, session: Session) -> MediaReference | None:
        """For ``eliza-backends bench``: the runtime's own media path over the files
        ``session`` loaded (same projector / encoder file, same threads), run directly, to
        time beside the seam's; None (the default) when the backend has none to offer. Called
        only for a session whose ``capabilities.media`` is not empty; the caller closes it."""
        return None

    def embedding(self, bundle_dir: str | os.PathLike[str]) -> EmbeddingSpec | None:
        """What a session of this backend on ``bundle_dir`` embeds, when the bundle is an
        embedding model (its pooling and dimensions, read from the artifact's header, and the
        Matryoshka lengths of the bundle's ``embedding.json``,
        :func:`~eliza_backends.bundle.matryoshka_dimensions`); None when it is a generation
        model or this backend cannot embed (the default). Cheap (header probes, no load). The
        core asks it before any load: a bundle with a spec is opened only for embeddings
        (:func:`eliza_backends.embed`), one without is refused there; :meth:`open` on an
        embedding bundle returns a session whose ``capabilities.embedding`` is this spec."""
        return None

    def describe(self, bundle_dir: str | os.PathLike[str]) -> str:
        """For :func:`~eliza_backends.explain`: the artifact a stream would load from
        ``bundle_dir`` (relative to it), with what a cheap probe says of the model (a plugin
        names its architecture: GGUF header, config.json); "" when there is none. The default
        names the artifact."""
        try:
            path = self.artifact(bundle_dir)
        except BundleError:
            return ""
        return path.relative_to(bundle_dir).as_posix()

    def pinned(self, name: str) -> Factory:
        """The factory a hard request by ``name`` (one of :meth:`names`) gets: this one, or,
        for an alias that names one engine of a multi-engine backend (``coreml``), a factory
        whose ``available()`` / ``can_serve()`` / ``open()`` answer for that engine alone, so
        the request fails loudly where that engine cannot run."""
        return self

    def preference_rank(self) -> int:
        """Higher wins auto-selection. llama.cpp is 0; a rank <= 0 is chosen only when
        llama.cpp cannot serve the bundle (it may depend on the host)."""
        return 0

    def rank_reason(self) -> str:
        """One line for ``explain()``: why the rank is what it is on this host."""
        return ""

    @abstractmethod
    def open(self, context: InferenceContext, config: StreamConfig) -> Session:
        """Open a session on ``context.bundle_dir`` (re-resolve the artifact there)."""

    def names(self) -> tuple[str, ...]:
        """The canonical name and the aliases."""
        return (self.name, *self.aliases)

    def parse_options(self, config: StreamConfig) -> Any:
        """This backend's validated options from ``config.options`` (by name or alias).

        Returns an ``options_model`` instance (defaults when none were given), or None when
        the backend takes no options. Unknown fields raise :class:`InvalidArgumentError`.
        """
        given: dict[str, Any] = {}
        for key, value in config.options.items():
            if key.lower() in (n.lower() for n in self.names()):
                given.update(value)
        if self.options_model is None:
            if given:
                raise InvalidArgumentError(f"backend {self.name} takes no options, got "
                                           f"{sorted(given)}")
            return None
        what = f"options for {self.name}"
        if issubclass(self.options_model, FrozenModel):
            return self.options_model.model_validate(given, what=what)
        from pydantic import ValidationError  # a plugin's pydantic model

        try:
            return self.options_model.model_validate(given)
        except ValidationError as exc:
            raise InvalidArgumentError(
                describe_validation_error(exc, what)) from None

    def artifact(self, bundle_dir: str | os.PathLike[str], *, role: Literal["model", "draft"]
                 = "model", name: str | None = None,
                 formats: Sequence[str] | None = None) -> Path:
        """The artifact to open: the one called ``name`` if given, else the first by name, of
        ``formats`` (default :attr:`formats`) under ``text/`` (``role="draft"``:
        ``text/draft/``). :class:`BundleError` (``ERR_CANNOT_SERVE``) when there is none."""
        kinds = tuple(self.formats if formats is None else formats)
        found = find_artifacts(bundle_dir, kinds, role=role)
        if name is not None:
            found = [p for p in found if p.name == name]
        if not found:
            where = "text/draft/" if role == "draft" else "text/"
            want = f"{name!r}" if name else f"{'/'.join(kinds)} artifact"
            hint = (" (ship a smaller model with the same vocabulary there, or set draft_model)"
                    if role == "draft" else "")
            raise BundleError(f"{bundle_dir} has no {want} under {where} for {self.name}{hint}",
                              code=Status.ERR_CANNOT_SERVE)
        return found[0]

    def draft_artifact(self, bundle_dir: str | os.PathLike[str], config: StreamConfig, *,
                       formats: Sequence[str] | None = None) -> Path:
        """The draft model for ``drafter="model"``: ``config.draft_model`` (a path relative to
        the bundle, which must stay inside it and be one of ``formats``), else the first
        artifact under ``text/draft/``. :class:`BundleError` otherwise."""
        kinds = tuple(self.formats if formats is None else formats)
        if config.draft_model is None:
            return self.artifact(bundle_dir, role="draft", formats=kinds)
        root = Path(bundle_dir).resolve()
        path = (root / config.draft_model).resolve()
        if not path.is_relative_to(root) or artifact_format(path) not in kinds:
            raise BundleError(f"draft_model {config.draft_model!r} is not a {'/'.join(kinds)} "
                              f"artifact inside the bundle {bundle_dir}")
        return path

    def make_drafter(self, context: InferenceContext, config: StreamConfig, target: ModelInfo,
                     *, greedy_only: bool = False) -> Drafter | None:
        """The drafter ``config.drafter`` names, for a session on ``target``: None for
        ``"none"``, the core's :class:`~eliza_backends.runtime.speculative.NgramDrafter` for
        ``"ngram"``, :meth:`make_draft_model` for ``"model"``, :meth:`make_mtp_drafter` for
        ``"mtp"`` (a backend whose MTP drafter needs the session's runtime state before it
        exists builds it in :meth:`open` instead). ``greedy_only``: the backend verifies
        greedily only (its verify step applies the repeat penalty as its plain path does), so
        sampling with a drafter is refused here. The session the drafter is handed to owns it
        (rewinds and closes it)."""
        if config.drafter == "none":
            return None
        if greedy_only and not config.greedy:
            raise UnsupportedOperationError(
                f"{self.name} speculative decoding is greedy-only here: use temperature=0 "
                "with a drafter (a repeat penalty is fine), or drafter='none' to sample")
        if config.drafter == "ngram":
            return NgramDrafter(max_n=config.ngram_size)
        if config.drafter == "mtp":
            return self.make_mtp_drafter(context, config, target)
        return self.make_draft_model(context, config, target)

    def make_draft_model(self, context: InferenceContext, config: StreamConfig,
                         target: ModelInfo) -> Drafter:
        """The ``drafter="model"`` drafter. A backend with draft models overrides this: load
        :meth:`draft_artifact` through ``context.shared`` and wrap it in a
        :class:`~eliza_backends.runtime.speculative.ModelDrafter` (vocabulary checked against
        ``target``). The default refuses."""
        raise UnsupportedOperationError(
            f"{self.name} has no draft-model drafter: use drafter='ngram', or a backend with "
            "draft models (llama.cpp, mlx)")

    def make_mtp_drafter(self, context: InferenceContext, config: StreamConfig,
                         target: ModelInfo) -> Drafter:
        """The ``drafter="mtp"`` drafter: the target's multi-token-prediction assistant (Gemma
        4's), from ``text/draft/mtp/`` (or ``draft_model``). A backend with one overrides this
        (:class:`BundleError` when the bundle ships no assistant it runs). The default
        refuses."""
        raise UnsupportedOperationError(
            f"{self.name} has no MTP drafter (a target's multi-token-prediction assistant, "
            "Gemma 4's): use backend='llama.cpp' or 'mlx' for it, or drafter='ngram'")

    def __repr__(self) -> str:
        return f"<{type(self).__name__} {self.name!r}>"


__all__ = ["Factory"]
