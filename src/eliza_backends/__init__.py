"""eliza-backends: one select-and-stream LLM API over in-process runtimes.

    from eliza_backends import open_stream

    with open_stream("examples/bundles/tiny", max_tokens=32) as stream:
        stream.prefill("Once upon a time")
        for step in stream:
            print(step.text, end="", flush=True)

Importing this package, listing backends and selecting one never import a heavy runtime.
"""

from __future__ import annotations

from types import ModuleType
from typing import TYPE_CHECKING, Any

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

if TYPE_CHECKING:
    from .backend import Availability, Capabilities, Decoded, Factory, Session, Step
    from .bundle import BundleManifest, create_bundle, load_manifest, verify_bundle, write_manifest
    from .chat import RenderLimits, TemplateError, TemplateLimitError, render_chat
    from .completions import chat_completion, completion
    from .config import StreamConfig, StreamOverrides
    from .context import InferenceContext
    from .hookspecs import hookimpl
    from .model_info import ModelInfo
    from .registry import BackendInfo, Registry, list_backends, plugin_problems
    from .selector import SelectionReport, explain, select
    from .stream import Stream, StreamMetrics, aopen_stream, generate, generate_chat, open_stream

# Everything but the errors is imported on first use (PEP 562), so ``import eliza_backends``
# and the command line's ``--help`` cost a few milliseconds; the module named here is imported
# the first time one of its names is looked up.
_LAZY: dict[str, str] = {
    "Availability": "backend",
    "BackendInfo": "registry",
    "BundleManifest": "bundle",
    "Capabilities": "backend",
    "Decoded": "backend",
    "Factory": "backend",
    "InferenceContext": "context",
    "ModelInfo": "model_info",
    "Registry": "registry",
    "SelectionReport": "selector",
    "Session": "backend",
    "Step": "backend",
    "Stream": "stream",
    "StreamConfig": "config",
    "StreamMetrics": "stream",
    "StreamOverrides": "config",
    "RenderLimits": "chat",
    "TemplateError": "chat",
    "TemplateLimitError": "chat",
    "aopen_stream": "stream",
    "chat_completion": "completions",
    "completion": "completions",
    "create_bundle": "bundle",
    "explain": "selector",
    "generate": "stream",
    "generate_chat": "stream",
    "hookimpl": "hookspecs",
    "list_backends": "registry",
    "load_manifest": "bundle",
    "open_stream": "stream",
    "plugin_problems": "registry",
    "render_chat": "chat",
    "select": "selector",
    "verify_bundle": "bundle",
    "write_manifest": "bundle",
}


def _submodule(name: str) -> ModuleType:
    """One of the modules named in ``_LAZY``, imported on first use (each import is static:
    no module name is computed)."""
    if name == "backend":
        from . import backend

        return backend
    if name == "bundle":
        from . import bundle

        return bundle
    if name == "chat":
        from . import chat

        return chat
    if name == "completions":  # the OpenAI-shaped API (~20 pydantic models)
        from . import completions

        return completions
    if name == "config":
        from . import config

        return config
    if name == "context":
        from . import context

        return context
    if name == "hookspecs":
        from . import hookspecs

        return hookspecs
    if name == "model_info":
        from . import model_info

        return model_info
    if name == "registry":
        from . import registry

        return registry
    if name == "selector":
        from . import selector

        return selector
    from . import stream

    return stream


def __getattr__(name: str) -> Any:
    module = _LAZY.get(name)
    if module is None:
        raise AttributeError(f"module 'eliza_backends' has no attribute {name!r}")
    value = getattr(_submodule(module), name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(_LAZY))


__version__ = "0.1.0"

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
    "RenderLimits",
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
    "StreamOverrides",
    "TemplateError",
    "TemplateLimitError",
    "UnsupportedOperationError",
    "__version__",
    "aopen_stream",
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
