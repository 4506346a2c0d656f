"""The plugin kit: everything a backend plugin imports from the core, in one place.

A plugin imports the core only through ``eliza_backends`` (the user-facing names and the
errors) and this package::

    from eliza_backends import BundleError, InferenceContext, ModelInfo, StreamConfig
    from eliza_backends.backend import Factory, Session, Step, Decoded, KVCursor, Sampler

What lives here:

* the contract: :class:`Factory`, :class:`Session` (public methods, the ``_hooks`` a backend
  implements, the ``@final`` helpers it may call), :class:`Step`, :class:`Decoded`,
  :class:`Capabilities`, :class:`EmbeddingSpec`, :class:`Availability`, the :data:`hookimpl`
  marker, the :class:`InferenceContext` and the :class:`ModelInfo` a session is opened with,
  the :class:`FrozenModel` base and ``Field`` an options model is declared with (``Factory.
  options_model``: validated without importing pydantic);
* the building blocks a session is made of, re-exported from the core's other parts:
  the speculative loop and its acceptance rules (:func:`accept_greedy`, :func:`accept_sampled`,
  :class:`ModelDrafter`), the KV cursor, the continuous-batching step scheduler
  (:class:`StepScheduler`), the sampler, the bundle tokenizers, the capture of
  a native runtime's stderr, the default thread count (:func:`cpu_count`) and installed
  distributions' versions (:func:`distribution_version`).

Importing it imports pluggy (and what a session is made of), never a runtime; the tokenizers,
the step scheduler, the sampler and the stderr capture are imported on first use (PEP 562), so
opening a llama.cpp stream does not pay for them.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from ..bundle import find_artifacts, matryoshka_dimensions
from ..entry_points import distribution_version
from ..frozen_model import Field, FrozenModel
from ..lazy import lazy_names
from ..media import MediaItem
from ..runtime.cpus import cpu_count
from ..runtime.kv_cursor import KVCursor
from ..runtime.speculative import (
    Drafter,
    ModelDrafter,
    NgramDrafter,
    Verify,
    accept_greedy,
    accept_sampled,
)
from .context import InferenceContext
from .factory import Factory
from .hookspecs import hookimpl
from .model_info import ModelInfo
from .session import Session
from .types import (
    Availability,
    Capabilities,
    Decoded,
    EmbeddingSpec,
    FinishReason,
    MediaReference,
    MediaSpan,
    MediaTokens,
    Step,
)

if TYPE_CHECKING:  # the names of _LAZY, for type checkers
    from ..prompt.hf_tokenizer import HFTokenizer
    from ..prompt.sp_tokenizer import SPTokenizer
    from ..prompt.tokenizer import Tokenizer, TokenizerFacts, tokenizer_facts
    from ..prompt.tokenizers import find_tokenizer, load_tokenizer
    from ..runtime.batching import (
        GATHER_WINDOW_S,
        BatchStats,
        Piece,
        StepRecord,
        StepScheduler,
    )
    from ..runtime.sampling import Sampler
    from .native_output import (
        native_exit_to_logging,
        native_stderr_to_logging,
        quiet_by_default,
    )

#: Names imported on first use, with the module (relative to ``eliza_backends``) defining them.
_LAZY: dict[str, str] = {
    "HFTokenizer": "prompt.hf_tokenizer",
    "SPTokenizer": "prompt.sp_tokenizer",
    "Tokenizer": "prompt.tokenizer",
    "TokenizerFacts": "prompt.tokenizer",
    "tokenizer_facts": "prompt.tokenizer",
    "find_tokenizer": "prompt.tokenizers",
    "load_tokenizer": "prompt.tokenizers",
    "GATHER_WINDOW_S": "runtime.batching",
    "BatchStats": "runtime.batching",
    "Piece": "runtime.batching",
    "StepRecord": "runtime.batching",
    "StepScheduler": "runtime.batching",
    "Sampler": "runtime.sampling",
    "native_exit_to_logging": "backend.native_output",
    "native_stderr_to_logging": "backend.native_output",
    "quiet_by_default": "backend.native_output",
}


def _module(name: str) -> Any:
    """The module ``name`` of ``_LAZY`` (each import static: no module name is computed)."""
    if name == "prompt.hf_tokenizer":
        from ..prompt import hf_tokenizer
        return hf_tokenizer
    if name == "prompt.sp_tokenizer":
        from ..prompt import sp_tokenizer
        return sp_tokenizer
    if name == "prompt.tokenizer":
        from ..prompt import tokenizer
        return tokenizer
    if name == "prompt.tokenizers":
        from ..prompt import tokenizers
        return tokenizers
    if name == "runtime.batching":
        from ..runtime import batching
        return batching
    if name == "runtime.sampling":
        from ..runtime import sampling
        return sampling
    if name != "backend.native_output":
        raise AssertionError(f"_LAZY names an unknown module: {name}")
    from . import native_output
    return native_output


__getattr__, __dir__ = lazy_names("eliza_backends.backend", _LAZY, _module, globals())


__all__ = [
    "GATHER_WINDOW_S",
    "Availability",
    "BatchStats",
    "Capabilities",
    "Decoded",
    "Drafter",
    "EmbeddingSpec",
    "Factory",
    "Field",
    "FinishReason",
    "FrozenModel",
    "HFTokenizer",
    "InferenceContext",
    "KVCursor",
    "MediaItem",
    "MediaReference",
    "MediaSpan",
    "MediaTokens",
    "ModelDrafter",
    "ModelInfo",
    "NgramDrafter",
    "Piece",
    "SPTokenizer",
    "Sampler",
    "Session",
    "Step",
    "StepRecord",
    "StepScheduler",
    "Tokenizer",
    "TokenizerFacts",
    "Verify",
    "accept_greedy",
    "accept_sampled",
    "cpu_count",
    "distribution_version",
    "find_artifacts",
    "find_tokenizer",
    "hookimpl",
    "load_tokenizer",
    "matryoshka_dimensions",
    "native_exit_to_logging",
    "native_stderr_to_logging",
    "quiet_by_default",
    "tokenizer_facts",
]
