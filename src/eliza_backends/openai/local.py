"""The OpenAI-shaped API, in process: :func:`chat_completion` and :func:`completion`.

    from eliza_backends import chat_completion

    reply = chat_completion("examples/bundles/tiny",
                            [{"role": "user", "content": "What is two plus two?"}],
                            max_tokens=32)
    print(reply.choices[0].message.content, reply.usage.completion_tokens)

Both take a bundle directory, an :class:`InferenceContext` (several calls share one model load)
or an open :class:`Stream` (a conversation that keeps its KV cache: each call prefills only
what differs from what the session holds). They return the OpenAI response models of
:mod:`eliza_backends.openai.types`, or an iterator of chunks with ``stream=True``, the same on
every backend. A call validates its arguments as the server validates a body
(:func:`~eliza_backends.openai.types.parse_request`), turns the request into the core's job
through the same front-end (:mod:`.chat`, :mod:`.completions`), runs the same
:class:`~.generation.Generation` and formats with the same :class:`~.formatting.Responder` as
the server (``eliza-backends serve``), so in-process and HTTP answers are identical.

The session settings (sampling) come from the request through
:func:`~eliza_backends.serving.session_config`: a bundle or context gets a stream opened per
distinct setting (:func:`~eliza_backends.serving.session_key`); a caller's own stream must
already have the request's settings.
"""

from __future__ import annotations

import os
from collections.abc import Iterator, Mapping, Sequence
from typing import Any, Literal, overload

from pydantic import BaseModel

from ..backend.context import InferenceContext
from ..config import StreamConfig
from ..errors import InvalidArgumentError
from ..serving import SESSION_FIELDS, SessionKey, model_name, serving_config, session_key
from ..stream import Stream, open_stream
from .chat import chat_job
from .completions import completion_job
from .formatting import Formatter, Responder
from .generation import Generation, GenerationJob
from .types import (
    ChatCompletion,
    ChatCompletionChunk,
    ChatCompletionRequest,
    Completion,
    CompletionRequest,
    parse_request,
)


class LocalStreams:
    """The streams one in-process call generates on: the caller's own stream (whose settings
    must match the request's), or streams opened on a bundle or context, closed afterwards."""

    def __init__(self, target: str | os.PathLike[str] | InferenceContext | Stream,
                 config: StreamConfig | Mapping[str, Any] | None, backend: str | None) -> None:
        self._own: Stream | None = target if isinstance(target, Stream) else None
        self._opened: dict[SessionKey, Stream] = {}
        self._backend = backend
        if self._own is not None:
            if config is not None or backend is not None:
                raise InvalidArgumentError("config= and backend= are for a bundle or context; "
                                           "a Stream already has its own")
            self.base = self._own.config
            self.bundle_dir = self._own.context.bundle_dir
            self._context: InferenceContext | None = None
            self._owns_context = False
        else:
            self.base = serving_config(config)
            self._owns_context = not isinstance(target, InferenceContext)
            self._context = target if isinstance(target, InferenceContext) else \
                InferenceContext(target)  # type: ignore[arg-type]
            self.bundle_dir = self._context.bundle_dir

    def fit(self, config: StreamConfig) -> Stream:
        """A stream whose session has ``config``'s settings."""
        key = session_key(config)
        if self._own is not None:
            if key != session_key(self._own.config):
                mine = {k: getattr(self._own.config, k) for k in SESSION_FIELDS}
                want = {k: getattr(config, k) for k in SESSION_FIELDS}
                diff = {k: want[k] for k in SESSION_FIELDS if mine[k] != want[k]}
                raise InvalidArgumentError(
                    f"this stream was opened with other sampling settings than the request "
                    f"asks for ({diff}); open the stream with them, or pass the bundle or an "
                    "InferenceContext instead of a stream")
            return self._own
        if key not in self._opened:
            assert self._context is not None
            self._opened[key] = open_stream(self._context, config, backend=self._backend)
        return self._opened[key]

    def close(self) -> None:
        for stream in self._opened.values():
            stream.close()
        self._opened.clear()
        if self._owns_context and self._context is not None:
            self._context.close()


def run_local(job: GenerationJob, responder: Formatter, streams: LocalStreams, *,
              stream: bool, include_usage: bool) -> Any:
    """Drive ``job``'s choices on ``streams`` (closed when the call or its iterator ends),
    formatted by ``responder``: the final object, or an iterator of chunks."""
    current: list[Generation] = []  # the completion running (ended if the call is left)

    def started(index: int) -> Generation:
        gen = Generation.of_job(streams.fit(job.session_config(streams.base, index)), job)
        gen.start()
        current[:] = [gen]
        return gen

    def close() -> None:
        for gen in current:  # an iterator closed early leaves its completion unfinished
            gen.stream.end_generation(gen)
        streams.close()

    if not stream:
        try:
            finished = []
            for index in range(job.n):
                gen = started(index)
                while not gen.done:
                    gen.step()
                finished.append(gen)
            return responder.final(finished)
        finally:
            close()

    def chunks() -> Iterator[BaseModel]:
        finished = []
        try:
            for index in range(job.n):
                gen = started(index)
                yield from responder.opening(index, gen)
                while not gen.done:
                    yield from responder.step(index, gen.step(), gen)
                finished.append(gen)
            yield from responder.closing(finished, include_usage)
        finally:
            close()

    return chunks()


def _serve_locally(request: ChatCompletionRequest | CompletionRequest,
                   target: str | os.PathLike[str] | InferenceContext | Stream,
                   config: StreamConfig | Mapping[str, Any] | None, backend: str | None,
                   model: str | None) -> Any:
    """``request`` answered on ``target`` (see :func:`chat_completion`)."""
    chat = isinstance(request, ChatCompletionRequest)
    job = chat_job(request) if chat else completion_job(request)  # type: ignore[arg-type]
    streams = LocalStreams(target, config, backend)
    responder = Responder("chat" if chat else "text",
                          model or request.model or model_name(streams.bundle_dir))
    return run_local(job, responder, streams, stream=request.stream,
                     include_usage=request.include_usage)


def _request(kind: type[ChatCompletionRequest] | type[CompletionRequest],
             fields: dict[str, Any], extra: Mapping[str, Any]) -> Any:
    """The request of a Python call, through the one validation layer (:func:`parse_request`)
    of its :func:`request_data`."""
    return parse_request(kind, request_data(fields, extra))


def request_data(fields: Mapping[str, Any], extra: Mapping[str, Any]) -> dict[str, Any]:
    """The request body of a Python call's arguments: ``fields`` that are not None, and
    ``extra``; tuples become lists and mappings dicts (the JSON shapes); anything else is left
    for the validation to refuse with an :class:`InvalidArgumentError` naming the field."""
    data = {k: _as_json(v) for k, v in fields.items() if v is not None}
    data.update({k: _as_json(v) for k, v in extra.items()})
    return data


def _as_json(value: Any) -> Any:
    """``value`` with Python's sequence and mapping types as JSON's (one level: a message
    that is a ``MappingProxyType`` is a dict, a list of them a list)."""
    if isinstance(value, Mapping):
        return dict(value)
    if isinstance(value, Sequence) and not isinstance(value, str | bytes | bytearray):
        return [dict(v) if isinstance(v, Mapping) else v for v in value]
    return value


@overload
def chat_completion(target: str | os.PathLike[str] | InferenceContext | Stream,
                    messages: Sequence[Mapping[str, Any]], *, stream: Literal[False] = False,
                    max_tokens: int | None = None, temperature: float | None = None,
                    top_p: float | None = None, seed: int | None = None,
                    stop: str | Sequence[str] | None = None, n: int = 1,
                    model: str | None = None, backend: str | None = None,
                    config: StreamConfig | Mapping[str, Any] | None = None,
                    **extra: Any) -> ChatCompletion: ...
@overload
def chat_completion(target: str | os.PathLike[str] | InferenceContext | Stream,
                    messages: Sequence[Mapping[str, Any]], *, stream: Literal[True],
                    max_tokens: int | None = None, temperature: float | None = None,
                    top_p: float | None = None, seed: int | None = None,
                    stop: str | Sequence[str] | None = None, n: int = 1,
                    model: str | None = None, backend: str | None = None,
                    config: StreamConfig | Mapping[str, Any] | None = None,
                    **extra: Any) -> Iterator[ChatCompletionChunk]: ...
def chat_completion(target: str | os.PathLike[str] | InferenceContext | Stream,
                    messages: Sequence[Mapping[str, Any]], *, stream: bool = False,
                    max_tokens: int | None = None, temperature: float | None = None,
                    top_p: float | None = None, seed: int | None = None,
                    stop: str | Sequence[str] | None = None, n: int = 1,
                    model: str | None = None, backend: str | None = None,
                    config: StreamConfig | Mapping[str, Any] | None = None,
                    **extra: Any) -> ChatCompletion | Iterator[ChatCompletionChunk]:
    """An OpenAI chat completion of ``messages`` on ``target``.

    ``target``: a bundle directory (loaded for this call and freed after), an
    :class:`InferenceContext` (its load is reused), or an open :class:`Stream` (its session's
    KV cache is reused: a growing conversation prefills only its new tokens; its sampling
    settings must be the request's, and its own ``max_tokens``/``stop`` apply too).
    ``max_tokens`` None generates until an end token or the end of the context window;
    ``temperature`` None or 0 is greedy; ``seed`` None is the config's seed. ``extra``: any
    other request field (``top_k``, ``min_p``, ``repeat_penalty``, ``stream_options``, ...).
    ``config`` (context size, threads, backend options) and ``backend`` are for a bundle or
    context. ``model`` names the model in the response (default: the bundle's name).

    Returns a :class:`ChatCompletion`, or with ``stream=True`` an iterator of
    :class:`ChatCompletionChunk` (the first of each choice carries the role, the last its
    ``finish_reason``); close it to stop early. Raises :class:`InvalidArgumentError` for a bad
    request (:class:`ContextFullError` when it cannot fit), other :class:`ElizaError` s from
    the backend.
    """
    request = _request(ChatCompletionRequest, {
        "messages": messages, "stream": stream, "max_tokens": max_tokens,
        "temperature": temperature, "top_p": top_p, "seed": seed, "stop": stop, "n": n}, extra)
    result: ChatCompletion | Iterator[ChatCompletionChunk] = _serve_locally(
        request, target, config, backend, model)
    return result


@overload
def completion(target: str | os.PathLike[str] | InferenceContext | Stream,
               prompt: str | Sequence[int], *, stream: Literal[False] = False,
               max_tokens: int | None = None, temperature: float | None = None,
               top_p: float | None = None, seed: int | None = None,
               stop: str | Sequence[str] | None = None, n: int = 1,
               model: str | None = None, backend: str | None = None,
               config: StreamConfig | Mapping[str, Any] | None = None,
               **extra: Any) -> Completion: ...
@overload
def completion(target: str | os.PathLike[str] | InferenceContext | Stream,
               prompt: str | Sequence[int], *, stream: Literal[True],
               max_tokens: int | None = None, temperature: float | None = None,
               top_p: float | None = None, seed: int | None = None,
               stop: str | Sequence[str] | None = None, n: int = 1,
               model: str | None = None, backend: str | None = None,
               config: StreamConfig | Mapping[str, Any] | None = None,
               **extra: Any) -> Iterator[Completion]: ...
def completion(target: str | os.PathLike[str] | InferenceContext | Stream,
               prompt: str | Sequence[int], *, stream: bool = False,
               max_tokens: int | None = None, temperature: float | None = None,
               top_p: float | None = None, seed: int | None = None,
               stop: str | Sequence[str] | None = None, n: int = 1,
               model: str | None = None, backend: str | None = None,
               config: StreamConfig | Mapping[str, Any] | None = None,
               **extra: Any) -> Completion | Iterator[Completion]:
    """An OpenAI text completion of ``prompt`` (text, or token ids) on ``target``; the
    arguments are :func:`chat_completion`'s. The prompt is the whole sequence (BOS added
    where the model uses one); on a :class:`Stream` the prefix it shares with the session's
    history is reused."""
    request = _request(CompletionRequest, {
        "prompt": prompt, "stream": stream, "max_tokens": max_tokens,
        "temperature": temperature, "top_p": top_p, "seed": seed, "stop": stop, "n": n}, extra)
    result: Completion | Iterator[Completion] = _serve_locally(request, target, config,
                                                               backend, model)
    return result


__all__ = ["LocalStreams", "chat_completion", "completion", "request_data", "run_local"]
