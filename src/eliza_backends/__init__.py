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
from typing import TYPE_CHECKING

from .lazy import lazy_names

# One import per module, each name re-exported with ``as`` (mypy --strict's explicit re-export).
# isort: off
if TYPE_CHECKING:  # what the names in _LAZY are, for type checkers (tests/test_layout.py)
    from .errors import (
        BackendRuntimeError as BackendRuntimeError,
        BackendSelectionError as BackendSelectionError,
        BundleError as BundleError,
        CancelledError as CancelledError,
        ContextFullError as ContextFullError,
        ElizaError as ElizaError,
        InvalidArgumentError as InvalidArgumentError,
        MediaError as MediaError,
        PluginError as PluginError,
        SessionBusyError as SessionBusyError,
        SessionClosedError as SessionClosedError,
        SlotError as SlotError,
        Status as Status,
        UnsupportedOperationError as UnsupportedOperationError,
        TemplateError as TemplateError,
        TemplateLimitError as TemplateLimitError,
    )
    from .backend.types import (
        Availability as Availability,
        Capabilities as Capabilities,
        Decoded as Decoded,
        EmbeddingSpec as EmbeddingSpec,
        Step as Step,
    )
    from .backend.factory import (
        Factory as Factory,
    )
    from .backend.session import (
        Session as Session,
    )
    from .manifest import (
        BundleManifest as BundleManifest,
        create_bundle as create_bundle,
        load_manifest as load_manifest,
        verify_bundle as verify_bundle,
        write_manifest as write_manifest,
    )
    from .prompt.chat import (
        RenderLimits as RenderLimits,
        render_chat as render_chat,
    )
    from .openai.local import (
        chat_completion as chat_completion,
        completion as completion,
    )
    from .openai.embeddings import (
        embed as embed,
    )
    from .openai.local_fronts import (
        messages as messages,
        responses as responses,
    )
    from .config import (
        StreamConfig as StreamConfig,
        StreamOverrides as StreamOverrides,
    )
    from .backend.context import (
        InferenceContext as InferenceContext,
    )
    from .backend.hookspecs import (
        hookimpl as hookimpl,
    )
    from .backend.model_info import (
        ModelInfo as ModelInfo,
    )
    from .registry import (
        BackendInfo as BackendInfo,
        Registry as Registry,
        list_backends as list_backends,
        plugin_problems as plugin_problems,
    )
    from .selector import (
        SelectionReport as SelectionReport,
        explain as explain,
        select as select,
    )
    from .batch import (
        BatchResponse as BatchResponse,
        BatchResult as BatchResult,
        generate_batch as generate_batch,
    )
    from .stream import (
        Stream as Stream,
        StreamMetrics as StreamMetrics,
        aopen_stream as aopen_stream,
        generate as generate,
        generate_chat as generate_chat,
        open_stream as open_stream,
    )
# isort: on

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
    "MediaError": "errors",
    "PluginError": "errors",
    "SessionBusyError": "errors",
    "SessionClosedError": "errors",
    "SlotError": "errors",
    "Status": "errors",
    "UnsupportedOperationError": "errors",
    "TemplateError": "errors",
    "TemplateLimitError": "errors",
    "Availability": "backend.types",
    "Capabilities": "backend.types",
    "Decoded": "backend.types",
    "EmbeddingSpec": "backend.types",
    "Factory": "backend.factory",
    "Session": "backend.session",
    "Step": "backend.types",
    "BundleManifest": "manifest",
    "create_bundle": "manifest",
    "load_manifest": "manifest",
    "verify_bundle": "manifest",
    "write_manifest": "manifest",
    "RenderLimits": "prompt.chat",
    "render_chat": "prompt.chat",
    "chat_completion": "openai.local",
    "completion": "openai.local",
    "embed": "openai.embeddings",
    "messages": "openai.local_fronts",
    "responses": "openai.local_fronts",
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
    "BatchResponse": "batch",
    "BatchResult": "batch",
    "generate_batch": "batch",
    "Stream": "stream",
    "StreamMetrics": "stream",
    "aopen_stream": "stream",
    "generate": "stream",
    "generate_chat": "stream",
    "open_stream": "stream",
}


def _submodule(name: str) -> ModuleType:
    """The module ``name`` of ``_LAZY``, imported on first use. Each import is static: no
    module name is computed (tests/test_reliability.py bans ``import_module`` in src/)."""
    if name == "errors":
        from . import errors
        return errors
    if name == "backend.types":
        from .backend import types
        return types
    if name == "backend.factory":
        from .backend import factory
        return factory
    if name == "backend.session":
        from .backend import session
        return session
    if name == "backend.context":
        from .backend import context
        return context
    if name == "backend.hookspecs":
        from .backend import hookspecs
        return hookspecs
    if name == "backend.model_info":
        from .backend import model_info
        return model_info
    if name == "manifest":
        from . import manifest
        return manifest
    if name == "config":
        from . import config
        return config
    if name == "prompt.chat":
        from .prompt import chat
        return chat
    if name == "openai.local":
        from .openai import local
        return local
    if name == "openai.embeddings":
        from .openai import embeddings
        return embeddings
    if name == "openai.local_fronts":
        from .openai import local_fronts
        return local_fronts
    if name == "registry":
        from . import registry
        return registry
    if name == "selector":
        from . import selector
        return selector
    if name == "batch":
        from . import batch
        return batch
    if name != "stream":
        raise AssertionError(f"_LAZY names an unknown module: {name}")
    from . import stream
    return stream


__getattr__, __dir__ = lazy_names("eliza_backends", _LAZY, _submodule, globals())


__version__ = "0.1.0"

__all__ = sorted(["__version__", *_LAZY])
