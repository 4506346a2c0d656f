"""eliza-backends: one select-and-stream LLM API over in-process runtimes.

    from eliza_backends import open_stream

    with open_stream("examples/bundles/tiny", max_tokens=32) as stream:
        stream.prefill("Once upon a time")
        for step in stream:
            print(step.text, end="", flush=True)

Importing this package, listing backends and selecting one never import a heavy runtime.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from .backend import Availability, Capabilities, Decoded, Factory, Session, Step
from .bundle import BundleManifest, create_bundle, load_manifest, verify_bundle, write_manifest
from .chat import TemplateError, render_chat
from .config import StreamConfig
from .context import InferenceContext
from .errors import (
    BackendRuntimeError,
    BackendSelectionError,
    BundleError,
    CancelledError,
    ContextFullError,
    ElizaError,
    InvalidArgumentError,
    PluginError,
    SessionBusyError,
    SessionClosedError,
    SlotError,
    Status,
    UnsupportedOperationError,
)
from .hookspecs import hookimpl
from .model_info import ModelInfo
from .registry import BackendInfo, Registry, list_backends, plugin_problems
from .selector import SelectionReport, explain, select
from .stream import Stream, StreamMetrics, generate, generate_chat, open_stream

__version__ = "0.1.0"

# The OpenAI-shaped API defines ~20 pydantic models: imported on first use, so that
# ``import eliza_backends`` does not pay for them.
_LAZY = frozenset({"chat_completion", "completion"})
if TYPE_CHECKING:
    from .completions import chat_completion, completion


def __getattr__(name: str) -> Any:
    if name in _LAZY:
        from . import completions

        value = getattr(completions, name)
        globals()[name] = value
        return value
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


__all__ = [
    "Availability",
    "BackendInfo",
    "BackendRuntimeError",
    "BackendSelectionError",
    "BundleError",
    "BundleManifest",
    "CancelledError",
    "Capabilities",
    "ContextFullError",
    "Decoded",
    "ElizaError",
    "Factory",
    "InferenceContext",
    "InvalidArgumentError",
    "ModelInfo",
    "PluginError",
    "Registry",
    "SelectionReport",
    "Session",
    "SessionBusyError",
    "SessionClosedError",
    "SlotError",
    "Status",
    "Step",
    "Stream",
    "StreamConfig",
    "StreamMetrics",
    "TemplateError",
    "UnsupportedOperationError",
    "__version__",
    "chat_completion",
    "completion",
    "create_bundle",
    "explain",
    "generate",
    "generate_chat",
    "hookimpl",
    "list_backends",
    "load_manifest",
    "open_stream",
    "plugin_problems",
    "render_chat",
    "select",
    "verify_bundle",
    "write_manifest",
]
