"""eliza-echo: a complete eliza-backends plugin over a trivial, deterministic "model".

The model file is ``<bundle>/text/<name>.echo``: JSON such as ``{"period": 12}``. The model
repeats its input: the next token is the token ``period`` positions back, so the output cycles
through the last ``period`` tokens of the sequence. It ends generation (EOS) when that position
is before the start of the sequence or holds a special token.

This module is what the entry point names, so it stays light: no runtime import, no file read.
The "runtime" lives in :mod:`eliza_echo.session`, imported by :meth:`EchoFactory.open`.
"""

from __future__ import annotations

import os
from pathlib import Path

from pydantic import BaseModel, ConfigDict, Field

from eliza_backends import (
    Availability,
    BundleError,
    Factory,
    InferenceContext,
    Session,
    Status,
    StreamConfig,
    hookimpl,
)

__version__ = "0.1.0"

SUFFIX = ".echo"


class EchoOptions(BaseModel):
    """``StreamConfig.options["echo"]``: validated by :meth:`Factory.parse_options`.

    A pydantic model, as any plugin may write one; the in-tree plugins declare theirs on
    ``eliza_backends.backend.FrozenModel`` the same way, which opens a stream without
    importing pydantic."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    artifact: str | None = Field(None, description="File name under text/ (default: first).")
    delay: float = Field(0.0, ge=0.0, le=1.0,
                         description="Seconds each token and prefill chunk pretends to take.")


def echo_artifacts(bundle_dir: str | os.PathLike[str]) -> list[Path]:
    """The ``text/*.echo`` files of a bundle, sorted; [] when there are none (never raises)."""
    try:
        return sorted(p for p in (Path(bundle_dir) / "text").iterdir()
                      if p.suffix == SUFFIX and p.is_file())
    except OSError:
        return []


class EchoFactory(Factory):
    """Serves ``text/*.echo`` with :class:`eliza_echo.session.EchoSession`."""

    name = "echo"
    aliases = ("eliza-echo",)
    formats = ()  # not a format the core knows: can_serve() is overridden below
    pip_extra = None  # not an extra of eliza-backends: pip install eliza-echo
    options_model = EchoOptions

    def available(self) -> Availability:
        """Pure Python: available everywhere. A real backend checks (cheaply, without importing
        it) that its runtime is installed and usable, and says why not."""
        return Availability.yes(runtime="pure python")

    def can_serve(self, bundle_dir: str | os.PathLike[str]) -> bool:
        """A directory probe: does ``text/`` hold a ``*.echo`` file? Opens nothing."""
        return bool(echo_artifacts(bundle_dir))

    def preference_rank(self) -> int:
        """0: never chosen over llama.cpp; chosen when a bundle has nothing else to run."""
        return 0

    def rank_reason(self) -> str:
        return "example backend; serves only text/*.echo"

    def open(self, context: InferenceContext, config: StreamConfig) -> Session:
        from .session import EchoSession, load_model

        options: EchoOptions = self.parse_options(config)
        found = echo_artifacts(context.bundle_dir)
        if options.artifact is not None:
            found = [p for p in found if p.name == options.artifact]
        if not found:
            want = repr(options.artifact) if options.artifact else "a *.echo file"
            raise BundleError(f"{context.bundle_dir} has no {want} under text/ for echo",
                              code=Status.ERR_CANNOT_SERVE)
        # load once per context: every session on this bundle shares the "weights"
        model = context.shared(("echo", str(found[0])), lambda: load_model(found[0]))
        return EchoSession(config, context, model, delay=options.delay)


@hookimpl
def eliza_backends_factories() -> list[Factory]:
    """The hook eliza-backends calls once per process: this plugin's factories."""
    return [EchoFactory()]


__all__ = ["EchoFactory", "EchoOptions", "eliza_backends_factories"]
