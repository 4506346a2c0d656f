"""What every server of one model agrees on: which sessions fit a request, and the model's id.

The session settings a runtime bakes in when a session opens (sampling: temperature, top-p/k,
min-p, repeat penalty, seed, ``ignore_eos``) come from a request through :func:`session_config`;
:func:`session_key` says which open session can serve a config (the pooled server's slots, Ray's
batch lanes and the in-process API all reuse a session by this key); :func:`serving_config` is
the base config of the sessions that serve requests; :func:`model_name` is the id a bundle's
model is served under. The per-request budget (``max_tokens``) and stop strings are not session
settings: they are set on the session per turn (``Session.set_turn``), so one session serves
requests with any budget and stop strings without reopening.

Every API front-end (the OpenAI request models, a Ray Data row) speaks these keys; none of them
owns them.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Protocol

from .config import StreamConfig
from .errors import BundleError

#: StreamConfig fields a request may set; they are baked into a session when it opens.
SESSION_FIELDS = ("temperature", "top_p", "top_k", "min_p", "repeat_penalty", "seed",
                  "ignore_eos")
#: Sampling fields that do not matter when decoding is greedy.
_GREEDY_IRRELEVANT = frozenset({"temperature", "top_p", "top_k", "min_p", "seed"})

#: What makes two configs servable by one open session (see :func:`session_key`).
SessionKey = tuple[tuple[str, Any], ...]


class SamplingSettings(Protocol):
    """A request's session settings (:data:`SESSION_FIELDS`); None: the base config's. An
    OpenAI request model has them; another front-end's request (or a small dataclass) can."""

    @property
    def temperature(self) -> float | None: ...
    @property
    def top_p(self) -> float | None: ...
    @property
    def top_k(self) -> int | None: ...
    @property
    def min_p(self) -> float | None: ...
    @property
    def repeat_penalty(self) -> float | None: ...
    @property
    def seed(self) -> int | None: ...
    @property
    def ignore_eos(self) -> bool | None: ...


@dataclass(frozen=True)
class Sampling:
    """:class:`SamplingSettings` as plain data, for a front-end whose request model names its
    fields otherwise or lacks some (None: the base config's)."""

    temperature: float | None = None
    top_p: float | None = None
    top_k: int | None = None
    min_p: float | None = None
    repeat_penalty: float | None = None
    seed: int | None = None
    ignore_eos: bool | None = None


def session_config(base: StreamConfig, request: SamplingSettings, choice: int = 0
                   ) -> StreamConfig:
    """The :class:`StreamConfig` a session needs to serve choice ``choice`` of ``request``:
    ``base`` with the request's sampling fields (and ``ignore_eos``). With sampling, choice
    ``i`` uses seed ``seed + i``, so the ``n`` choices differ (and each is reproducible)."""
    changes = {f: getattr(request, f) for f in SESSION_FIELDS if getattr(request, f) is not None}
    config = StreamConfig.build(base, **changes)
    if choice and not config.greedy:
        config = StreamConfig.build(config, seed=(config.seed + choice) % (1 << 32))
    return config


def session_key(config: StreamConfig) -> SessionKey:
    """What must be equal for two configs to be served by the same open session: every field
    except the per-turn budget and stop strings, and except the sampling fields that greedy
    decoding ignores."""
    skip = {"max_tokens", "stop"} | (_GREEDY_IRRELEVANT if config.greedy else set())
    return tuple((k, repr(v)) for k, v in config.model_dump().items() if k not in skip)


def serving_config(config: StreamConfig | Mapping[str, Any] | None = None, **overrides: Any
                   ) -> StreamConfig:
    """The config of sessions that serve requests: ``config`` with ``overrides``. Its budget
    and stop strings do not matter: a generation sets each request's own on the session, per
    turn (``Session.set_turn``)."""
    return StreamConfig.build(config, **overrides)


def model_name(bundle_dir: str | os.PathLike[str]) -> str:
    """The id a bundle's model is served under: the manifest's ``name``, else the folder's."""
    from .manifest import load_manifest  # (pydantic models: only a server reads it)

    try:
        name = load_manifest(bundle_dir).name
    except (BundleError, OSError):
        name = None
    return name or os.path.basename(os.path.abspath(bundle_dir))


__all__ = ["SESSION_FIELDS", "Sampling", "SamplingSettings", "SessionKey", "model_name",
           "serving_config", "session_config", "session_key"]
