"""eliza-backends: one select-and-stream LLM API over in-process runtimes.

    from eliza_backends import open_stream

    with open_stream("examples/bundles/tiny", max_tokens=32) as stream:
        stream.prefill("Once upon a time")
        for step in stream:
            print(step.text, end="", flush=True)

Importing this package, listing backends and selecting one never import a heavy runtime.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:  # what the names in _LAZY are, for type checkers (tests/test_public_api.py)
    from .backend.context import (
        InferenceContext as InferenceContext,
    )
    from .backend.hookspecs import (
        hookimpl as hookimpl,
    )
    from .backend.model_info import (
        ModelInfo as ModelInfo,
    )
    from .backend.session import (
        Availability as Availability,
    )
    from .backend.session import (
        Capabilities as Capabilities,
    )
    from .backend.session import (
        Decoded as Decoded,
    )
    from .backend.session import (
        Factory as Factory,
    )
    from .backend.session import (
        Session as Session,
    )
    from .backend.session import (
        Step as Step,
    )
    from .bundle import (
        BundleManifest as BundleManifest,
    )
    from .bundle import (
        create_bundle as create_bundle,
    )
    from .bundle import (
        load_manifest as load_manifest,
    )
    from .bundle import (
        verify_bundle as verify_bundle,
    )
    from .bundle import (
        write_manifest as write_manifest,
    )
    from .config import (
        StreamConfig as StreamConfig,
    )
    from .config import (
        StreamOverrides as StreamOverrides,
    )
    from .errors import (
        BackendRuntimeError as BackendRuntimeError,
    )
    from .errors import (
        BackendSelectionError as BackendSelectionError,
    )
    from .errors import (
        BundleError as BundleError,
    )
    from .errors import (
        CancelledError as CancelledError,
    )
    from .errors import (
        ContextFullError as ContextFullError,
    )
    from .errors import (
        ElizaError as ElizaError,
    )
    from .errors import (
        InvalidArgumentError as InvalidArgumentError,
    )
    from .errors import (
        PluginError as PluginError,
    )
    from .errors import (
        SessionBusyError as SessionBusyError,
    )
    from .errors import (
        SessionClosedError as SessionClosedError,
    )
    from .errors import (
        SlotError as SlotError,
    )
    from .errors import (
        Status as Status,
    )
    from .errors import (
        UnsupportedOperationError as UnsupportedOperationError,
    )
    from .openai.completions import (
        chat_completion as chat_completion,
    )
    from .openai.completions import (
        completion as completion,
    )
    from .prompt.chat import (
        RenderLimits as RenderLimits,
    )
    from .prompt.chat import (
        TemplateError as TemplateError,
    )
    from .prompt.chat import (
        TemplateLimitError as TemplateLimitError,
    )
    from .prompt.chat import (
        render_chat as render_chat,
    )
    from .registry import (
        BackendInfo as BackendInfo,
    )
    from .registry import (
        Registry as Registry,
    )
    from .registry import (
        list_backends as list_backends,
    )
    from .registry import (
        plugin_problems as plugin_problems,
    )
    from .selector import (
        SelectionReport as SelectionReport,
    )
    from .selector import (
        explain as explain,
    )
    from .selector import (
        select as select,
    )
    from .stream import (
        Stream as Stream,
    )
    from .stream import (
        StreamMetrics as StreamMetrics,
    )
    from .stream import (
        aopen_stream as aopen_stream,
    )
    from .stream import (
        generate as generate,
    )
    from .stream import (
        generate_chat as generate_chat,
    )
    from .stream import (
        open_stream as open_stream,
    )

#: The public names, each with the module (relative to this package)
#: that defines it: the one table. A name is imported on first use (PEP 562), so
#: ``import eliza_backends`` and the command line's ``--help`` cost a few milliseconds.
_LAZY: dict[str, str] = {
    "BackendRuntimeError": "errors",
    "BackendSelectionError": "errors",
    "BundleError": "errors",
    "CancelledError": "errors",
    "ContextFullError": "errors",
    "ElizaError": "errors",
    "InvalidArgumentError": "errors",
    "PluginError": "errors",
    "SessionBusyError": "errors",
    "SessionClosedError": "errors",
    "SlotError": "errors",
    "Status": "errors",
    "UnsupportedOperationError": "errors",
    "Availability": "backend.session",
    "Capabilities": "backend.session",
    "Decoded": "backend.session",
    "Factory": "backend.session",
    "Session": "backend.session",
    "Step": "backend.session",
    "BundleManifest": "bundle",
    "create_bundle": "bundle",
    "load_manifest": "bundle",
    "verify_bundle": "bundle",
    "write_manifest": "bundle",
    "RenderLimits": "prompt.chat",
    "TemplateError": "prompt.chat",
    "TemplateLimitError": "prompt.chat",
    "render_chat": "prompt.chat",
    "chat_completion": "openai.completions",
    "completion": "openai.completions",
    "StreamConfig": "config",
    "StreamOverrides": "config",
    "InferenceContext": "backend.context",
    "hookimpl": "backend.hookspecs",
    "ModelInfo": "backend.model_info",
    "BackendInfo": "registry",
    "Registry": "registry",
    "list_backends": "registry",
    "plugin_problems": "registry",
    "SelectionReport": "selector",
    "explain": "selector",
    "select": "selector",
    "Stream": "stream",
    "StreamMetrics": "stream",
    "aopen_stream": "stream",
    "generate": "stream",
    "generate_chat": "stream",
    "open_stream": "stream",
}


def __getattr__(name: str) -> Any:
    module = _LAZY.get(name)
    if module is None:
        raise AttributeError(f"module 'eliza_backends' has no attribute {name!r}")
    value = getattr(importlib.import_module(f".{module}", __name__), name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(_LAZY))


__version__ = "0.1.0"

__all__ = sorted(["__version__", *_LAZY])
