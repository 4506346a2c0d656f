"""The plugin kit: everything a backend plugin imports from the core, in one place.

A plugin imports the core only through ``eliza_backends`` (the user-facing names and the
errors) and this package::

    from eliza_backends import BundleError, InferenceContext, ModelInfo, StreamConfig
    from eliza_backends.backend import Factory, Session, Step, Decoded, KVCursor, Sampler

What lives here:

* the contract: :class:`Factory`, :class:`Session` (public methods, the ``_hooks`` a backend
  implements, the ``@final`` helpers it may call), :class:`Step`, :class:`Decoded`,
  :class:`Capabilities`, :class:`Availability`, the :data:`hookimpl` marker, the
  :class:`InferenceContext` and the :class:`ModelInfo` a session is opened with;
* the building blocks a session is made of, re-exported from the core's other parts:
  the speculative loop and its acceptance rules (:func:`accept_greedy`, :func:`accept_sampled`,
  :class:`ModelDrafter`), the KV cursor, the continuous-batching step scheduler
  (:class:`StepScheduler`), the sampler, the bundle tokenizers, the capture of
  a native runtime's stderr and the default thread count (:func:`cpu_count`).

Importing it imports pydantic and pluggy, never a runtime (numpy and ``tokenizers`` load on
first use).
"""

from __future__ import annotations

from ..bundle import find_artifacts
from ..media import MediaItem
from ..prompt.hf_tokenizer import HFTokenizer
from ..prompt.sp_tokenizer import SPTokenizer
from ..prompt.tokenizer import Tokenizer, TokenizerFacts, tokenizer_facts
from ..prompt.tokenizers import find_tokenizer, load_tokenizer
from ..runtime.batching import GATHER_WINDOW_S, BatchStats, Piece, StepRecord, StepScheduler
from ..runtime.cpus import cpu_count
from ..runtime.kv_cursor import KVCursor
from ..runtime.sampling import Sampler
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
from .native_output import native_exit_to_logging, native_stderr_to_logging, quiet_by_default
from .session import Session
from .types import Availability, Capabilities, Decoded, FinishReason, MediaSpan, MediaTokens, Step

__all__ = [
    "GATHER_WINDOW_S",
    "Availability",
    "BatchStats",
    "Capabilities",
    "Decoded",
    "Drafter",
    "Factory",
    "FinishReason",
    "HFTokenizer",
    "InferenceContext",
    "KVCursor",
    "MediaItem",
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
    "find_artifacts",
    "find_tokenizer",
    "hookimpl",
    "load_tokenizer",
    "native_exit_to_logging",
    "native_stderr_to_logging",
    "quiet_by_default",
    "tokenizer_facts",
]
