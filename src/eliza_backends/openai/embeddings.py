"""The ``/v1/embeddings`` front-end and its in-process twin :func:`embed`.

    from eliza_backends import embed

    reply = embed("examples/bundles/embedding-tiny", ["a cat", "a dog"])
    vectors = [d.embedding for d in reply.data]

OpenAI's request (``input``: a string, a list of strings, token ids or a list of token-id
lists; ``dimensions``; ``encoding_format`` float or base64; ``model``, ``user``) is validated
by :class:`EmbeddingRequest` (every problem a :class:`RequestError`, HTTP 400, naming the
field), run on an :class:`~eliza_backends.openai.embedder.Embedder` (all inputs in one batched
call) and answered as OpenAI's ``list`` of ``embedding`` objects with ``usage``
(:func:`embedding_reply`). The server and :func:`embed` share all three steps.
"""

from __future__ import annotations

import base64
import os
import struct
from collections.abc import Mapping, Sequence
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field

from ..backend.context import InferenceContext
from ..config import StreamConfig
from ..errors import InvalidArgumentError, RequestError
from ..serving import model_name
from .embedder import Embedder, EmbeddingInput, Embeddings, open_embedder
from .local import request_data
from .types import validate_body

_STRICT = ConfigDict(extra="forbid", strict=True)
#: The most inputs one request may carry (OpenAI's own limit).
MAX_INPUTS = 2048


class EmbeddingRequest(BaseModel):
    """``POST /v1/embeddings``. ``input``: one text, a list of texts, one input's token ids, or
    a list of token-id lists (at most :data:`MAX_INPUTS`, none empty). ``dimensions``: a
    shorter vector where the model allows it (Matryoshka). ``user`` is accepted and unused."""

    model_config = _STRICT

    model: str | None = None
    input: str | list[str] | list[int] | list[list[int]]
    dimensions: int | None = Field(None, ge=1)
    encoding_format: Literal["float", "base64"] = "float"
    user: str | None = None

    def inputs(self) -> list[EmbeddingInput]:
        """``input`` as a list of inputs; :class:`RequestError` for an empty one."""
        raw = self.input
        items: list[EmbeddingInput] = (
            [raw] if isinstance(raw, str) or (raw and isinstance(raw[0], int))
            else list(raw))  # type: ignore[arg-type]
        if not items:
            raise RequestError("input: an empty list; send at least one text or token-id list",
                               param="input")
        if len(items) > MAX_INPUTS:
            raise RequestError(f"input: {len(items)} inputs; at most {MAX_INPUTS} per request",
                               param="input")
        for i, item in enumerate(items):
            if not item:
                raise RequestError(f"input[{i}] is empty; every input needs text or tokens",
                                   param="input")
        return items


class EmbeddingObject(BaseModel):
    """One input's vector: floats, or with ``encoding_format="base64"`` their little-endian
    float32 bytes in base64 (as OpenAI sends them)."""

    object: Literal["embedding"] = "embedding"
    index: int
    embedding: list[float] | str


class EmbeddingUsage(BaseModel):
    """The tokens of every input (embeddings have no completion tokens)."""

    prompt_tokens: int
    total_tokens: int


class EmbeddingList(BaseModel):
    """The ``/v1/embeddings`` answer."""

    object: Literal["list"] = "list"
    data: list[EmbeddingObject]
    model: str
    usage: EmbeddingUsage


def embedding_reply(result: Embeddings, model: str,
                    encoding_format: Literal["float", "base64"] = "float") -> EmbeddingList:
    """OpenAI's answer for ``result``, the vectors in input order."""
    def encoded(vector: list[float]) -> list[float] | str:
        if encoding_format == "float":
            return vector
        return base64.b64encode(struct.pack(f"<{len(vector)}f", *vector)).decode("ascii")

    return EmbeddingList(
        data=[EmbeddingObject(index=i, embedding=encoded(v)) for i, v in enumerate(result.vectors)],
        model=model,
        usage=EmbeddingUsage(prompt_tokens=result.prompt_tokens,
                             total_tokens=result.prompt_tokens))


def run_embedding(embedder: Embedder, request: EmbeddingRequest, model: str) -> EmbeddingList:
    """``request`` on ``embedder`` (``dimensions`` checked before any work), answered."""
    inputs = request.inputs()
    try:
        size = embedder.check_dimensions(request.dimensions)
    except InvalidArgumentError as exc:  # the model's refusal, as the request's fault
        raise RequestError(exc.message, param="dimensions") from None
    result = embedder.embed(inputs, dimensions=size)
    return embedding_reply(result, model, request.encoding_format)


def embed(target: str | os.PathLike[str] | InferenceContext | Embedder,
          input: EmbeddingInput | Sequence[EmbeddingInput], *, dimensions: int | None = None,
          encoding_format: Literal["float", "base64"] = "float", model: str | None = None,
          backend: str | None = None,
          config: StreamConfig | Mapping[str, Any] | None = None) -> EmbeddingList:
    """OpenAI's embeddings answer for ``input`` (a text, token ids, or a list of either) on
    ``target``: an embedding model's bundle directory or :class:`InferenceContext` (opened
    for this call and closed after it), or an open :class:`Embedder`
    (:func:`~eliza_backends.openai.embedder.open_embedder`, to embed many times on one load).
    Validated as the server validates a body: :class:`RequestError` naming the field;
    :class:`~eliza_backends.errors.UnsupportedOperationError` for a generation model's
    bundle, before any load."""
    raw = input if isinstance(input, str) or not isinstance(input, Sequence) else [
        list(x) if isinstance(x, tuple) else x for x in input]
    data = request_data({"input": raw, "dimensions": dimensions,
                         "encoding_format": encoding_format}, {})
    request = validate_body(EmbeddingRequest, data)
    if isinstance(target, Embedder):
        return run_embedding(target, request, model or model_name(target.context.bundle_dir))
    with open_embedder(target, config, backend=backend) as embedder:
        return run_embedding(embedder, request, model or model_name(embedder.context.bundle_dir))


__all__ = ["MAX_INPUTS", "EmbeddingList", "EmbeddingObject", "EmbeddingRequest",
           "EmbeddingUsage", "embed", "embedding_reply", "run_embedding"]
