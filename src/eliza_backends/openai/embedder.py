"""The embedding core every embedding front-end drives (as :mod:`.generation` is the
generation core): :func:`open_embedder` opens an embedding model's session (the counterpart of
``open_stream`` for a bundle whose backend reports an :class:`EmbeddingSpec`), and
:class:`Embedder` turns texts or token ids into vectors, many inputs per call, with the
Matryoshka truncation the model allows.

A bundle is either a generation model or an embedding model, decided before any load by
:meth:`Factory.embedding` (a header probe): :func:`open_embedder` refuses a generation model and
``open_stream`` refuses an embedding model, both with :class:`UnsupportedOperationError` (HTTP
400 in the server).
"""

from __future__ import annotations

import math
import os
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from ..backend.context import InferenceContext
from ..backend.session import Session
from ..backend.types import EmbeddingSpec
from ..config import StreamConfig, StreamOverrides
from ..errors import InvalidArgumentError, PluginError, UnsupportedOperationError
from ..registry import Registry
from ..selector import select

if TYPE_CHECKING:
    from typing_extensions import Unpack  # typing.Unpack from Python 3.11

#: One input: a text, or the token ids of one (in the model's vocabulary).
EmbeddingInput = str | Sequence[int]


@dataclass(frozen=True)
class Embeddings:
    """The vectors of one :meth:`Embedder.embed` call, in input order (``dimensions`` floats
    each, L2-normalised), and each input's length in tokens (for usage counts)."""

    vectors: list[list[float]]
    token_counts: list[int]
    dimensions: int

    @property
    def prompt_tokens(self) -> int:
        """The tokens of every input together."""
        return sum(self.token_counts)


def bundle_embedding(bundle: str | os.PathLike[str] | InferenceContext, *,
                     backend: str | None = None) -> EmbeddingSpec | None:
    """The :class:`EmbeddingSpec` of ``bundle`` when the backend the selector picks (``backend``:
    a hard request) reports it as an embedding model, else None (a generation model); a
    header probe, no load. What a server checks to serve one kind or the other."""
    root = bundle.bundle_dir if isinstance(bundle, InferenceContext) else bundle
    return select(root, backend=backend).embedding(root)


def truncate(vector: list[float], dimensions: int) -> list[float]:
    """The first ``dimensions`` values of an L2-normalised ``vector``, normalised again
    (Matryoshka truncation)."""
    head = vector[:dimensions]
    norm = math.sqrt(math.fsum(x * x for x in head))
    return [x / norm for x in head] if norm > 0 else head


class Embedder:
    """An embedding model's session, with the bundle's :class:`EmbeddingSpec`.

    Threads: one consumer at a time, as a :class:`Session` (the server serialises requests on
    it); :meth:`close` from any thread. Closing it closes the inference context it opened."""

    def __init__(self, session: Session, spec: EmbeddingSpec, backend: str,
                 context: InferenceContext, *, owns_context: bool) -> None:
        self.session = session
        self.spec = spec
        self.backend = backend
        self.context = context
        self._owns_context = owns_context

    def tokenize(self, text: str) -> list[int]:
        """The ids ``text`` embeds as: the model's own tokenizer with its special tokens (BOS,
        and EOS where the model adds one), control-token texts parsed (as llama-server)."""
        return self.session.tokenize(text, add_special=True, parse_special=True)

    def check_dimensions(self, dimensions: int | None) -> int:
        """The vector length a request for ``dimensions`` gets: the full length (None or the
        full), or one of the model's Matryoshka lengths; :class:`InvalidArgumentError`
        otherwise (a model not trained for truncation has none)."""
        full = self.spec.dimensions
        if dimensions is None or dimensions == full:
            return full
        if dimensions in self.spec.matryoshka:
            return dimensions
        allowed = ", ".join(map(str, (full, *self.spec.matryoshka)))
        why = ("" if self.spec.matryoshka else
               " (this model was not trained for truncation: its bundle lists no "
               "matryoshka_dimensions in embedding.json)")
        raise InvalidArgumentError(f"dimensions={dimensions} is not offered by this model; "
                                   f"use one of {allowed}{why}")

    def embed(self, inputs: EmbeddingInput | Sequence[EmbeddingInput], *,
              dimensions: int | None = None) -> Embeddings:
        """Vectors for ``inputs``: a text, token ids, or a list of texts / token-id lists (one
        vector each, all computed in one batched call), truncated to ``dimensions`` (see
        :meth:`check_dimensions`, checked before any work)."""
        size = self.check_dimensions(dimensions)
        batch = [self.tokenize(item) if isinstance(item, str) else item
                 for item in as_input_list(inputs)]
        vectors = self.session.embed(batch)
        if size != self.spec.dimensions:
            vectors = [truncate(v, size) for v in vectors]
        return Embeddings(vectors, [len(ids) for ids in batch], size)

    def close(self) -> None:
        """Close the session (and the inference context, when this embedder opened it)."""
        try:
            self.session.close()
        finally:
            if self._owns_context:
                self.context.close()

    def __enter__(self) -> Embedder:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def as_input_list(inputs: EmbeddingInput | Sequence[EmbeddingInput]) -> list[EmbeddingInput]:
    """``inputs`` as a list of inputs: a text or one token-id list becomes a list of one;
    :class:`InvalidArgumentError` for an empty list or an item that is neither."""
    if isinstance(inputs, str):
        return [inputs]
    if not isinstance(inputs, Sequence) or isinstance(inputs, bytes) or not inputs:
        raise InvalidArgumentError("embed() needs a text, token ids, or a non-empty list of "
                                   f"texts / token-id lists, got {inputs!r:.80}")
    if all(isinstance(x, int) and not isinstance(x, bool) for x in inputs):
        return [inputs]  # type: ignore[list-item]
    out: list[EmbeddingInput] = []
    for i, item in enumerate(inputs):
        if not isinstance(item, (str, Sequence)) or isinstance(item, bytes):
            raise InvalidArgumentError(
                f"embed() input {i} is {type(item).__name__}: each input is a text or a list "
                "of token ids")
        if isinstance(item, str) and not item:
            raise InvalidArgumentError(f"embed() input {i} is an empty text")
        out.append(item)
    return out


def open_embedder(bundle: str | os.PathLike[str] | InferenceContext,
                  config: StreamConfig | Mapping[str, Any] | None = None, *,
                  backend: str | None = None, environ: Mapping[str, str] | None = None,
                  registry: Registry | None = None,
                  **overrides: Unpack[StreamOverrides]) -> Embedder:
    """Select a backend for ``bundle`` (as ``open_stream`` does) and open its embedding
    session. :class:`UnsupportedOperationError`, before any load, when the bundle is a
    generation model or the chosen backend cannot embed it. ``config`` / ``overrides``: the
    :class:`StreamConfig` (``context_size`` bounds the longest input, ``threads``, backend
    options); sampling fields do not apply."""
    cfg = StreamConfig.build(config, **overrides)
    owns = not isinstance(bundle, InferenceContext)
    context = InferenceContext(bundle) if not isinstance(bundle, InferenceContext) else bundle
    try:
        with context.opening():
            factory = select(context.bundle_dir, backend=backend, environ=environ,
                             registry=registry)
            factory.parse_options(cfg)  # unknown options fail before any load
            spec = factory.embedding(context.bundle_dir)
            if spec is None:
                raise UnsupportedOperationError(
                    f"{context.bundle_dir} is not an embedding model for {factory.name} (a "
                    "generation model, or a backend that cannot embed it): serve it with "
                    "open_stream / /v1/chat/completions, or embed with an embedding model's "
                    "bundle (a GGUF with a pooling type, such as EmbeddingGemma)")
            session = factory.open(context, cfg)
            if session.capabilities.embedding != spec:
                session.close()
                raise PluginError(
                    f"backend {factory.name} reported {spec} for {context.bundle_dir} but "
                    f"opened a session that embeds {session.capabilities.embedding}: a bug in "
                    "its plugin")
    except BaseException:
        if owns:
            context.close()
        raise
    return Embedder(session, spec, factory.name, context, owns_context=owns)


__all__ = [
    "Embedder",
    "EmbeddingInput",
    "Embeddings",
    "as_input_list",
    "bundle_embedding",
    "open_embedder",
    "truncate",
]
