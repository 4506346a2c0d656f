"""llama.cpp backend for eliza-backends: the default and the fallback.

This module stays light: it never imports ``llama_cpp``. The runtime is imported by
:meth:`LlamaCppFactory.open`: :mod:`eliza_llamacpp.model` loads the weights,
:mod:`eliza_llamacpp.session` and :mod:`eliza_llamacpp.draft` translate the session and the
draft model to llama.cpp (both import ``model``, never each other).
"""

from __future__ import annotations

import importlib.util
import sys
from functools import cached_property
from pathlib import Path

from eliza_backends import (
    Availability,
    Factory,
    InferenceContext,
    ModelInfo,
    Session,
    StreamConfig,
    hookimpl,
)
from eliza_backends.backend import Drafter

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
        from .model import shared_model
        from .session import LlamaCppSession

        options: LlamaCppOptions = self.parse_options(config)
        model = shared_model(context, self.artifact(context.bundle_dir, name=options.artifact),
                             options)
        drafter = self.make_drafter(context, config, model.info)
        return LlamaCppSession(model, config, options, context, drafter)

    def make_draft_model(self, context: InferenceContext, config: StreamConfig,
                         target: ModelInfo) -> Drafter:
        """A GGUF from ``text/draft/`` (or ``draft_model``) in its own llama.cpp context."""
        from .draft import DraftModel
        from .model import shared_model

        path = self.draft_artifact(context.bundle_dir, config)
        options: LlamaCppOptions = self.parse_options(config)
        model = shared_model(context, path, options)
        return DraftModel(model, target.vocab_size, config, options)


@hookimpl
def eliza_backends_factories() -> list[Factory]:
    """The llama.cpp factory."""
    return [LlamaCppFactory()]


__all__ = ["LlamaCppFactory", "LlamaCppOptions", "eliza_backends_factories"]
