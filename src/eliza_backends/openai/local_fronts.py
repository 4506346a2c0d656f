"""The Responses and Anthropic Messages APIs in process: :func:`responses` and :func:`messages`.

    from eliza_backends import messages, responses

    reply = responses("examples/bundles/tiny", "What is two plus two?", max_output_tokens=16)
    print(reply.output_text)
    again = responses("examples/bundles/tiny", "And three?", previous_response_id=reply.id)
    answer = messages("examples/bundles/tiny", [{"role": "user", "content": "Hi"}],
                      max_tokens=16)
    print(answer.content[0].text)

They take what :func:`~.local.chat_completion` takes (a bundle directory, an
:class:`InferenceContext` or an open :class:`Stream`; ``config``, ``backend``, ``model``) and
validate their arguments as the server validates a body, build the job through the same
front-end (:mod:`.responses`, :mod:`.anthropic_messages`) and format with the same formatter
(:class:`~.responses_events.ResponsesFormatter`, :class:`~.anthropic_events.MessagesFormatter`),
so in-process and HTTP answers are identical. With ``stream=True`` they return an iterator of
the API's events (the server's server-sent events, as objects).

Stored responses (``store``, ``previous_response_id``) live in ``response_store``, by default
the process's one (:func:`~.response_store.process_store`): a response made in process can be
continued in process, not by a server (which has its own store).
"""

from __future__ import annotations

import os
from collections.abc import Iterator, Mapping, Sequence
from typing import Any

from pydantic import BaseModel

from ..backend.context import InferenceContext
from ..config import StreamConfig
from ..serving import model_name
from ..stream import Stream
from .anthropic_events import MessagesFormatter
from .anthropic_messages import chat_request
from .anthropic_types import Message, MessagesRequest
from .chat import chat_job
from .local import LocalStreams, request_data, run_local
from .response_store import ResponseStore, process_store
from .responses import responses_plan
from .responses_events import ResponsesFormatter
from .responses_types import Response, ResponsesRequest
from .types import validate_body

#: Where a call runs: a bundle directory, a loaded context, or an open stream.
Target = str | os.PathLike[str] | InferenceContext | Stream


def responses(target: Target, input: str | Sequence[Mapping[str, Any]], *,
              stream: bool = False, instructions: str | None = None,
              max_output_tokens: int | None = None, temperature: float | None = None,
              top_p: float | None = None, previous_response_id: str | None = None,
              store: bool = True, model: str | None = None, backend: str | None = None,
              config: StreamConfig | Mapping[str, Any] | None = None,
              response_store: ResponseStore | None = None,
              **extra: Any) -> Response | Iterator[BaseModel]:
    """An OpenAI Responses API response to ``input`` (a string, or items: messages,
    ``function_call`` and ``function_call_output`` items) on ``target``.

    ``extra``: any other request field (``tools``, ``tool_choice``, ``text``, ``seed``, ...).
    ``store``: keep the response in ``response_store`` (default: the process's) so that a
    later call can continue it with ``previous_response_id``. ``target``, ``model``,
    ``backend`` and ``config`` are :func:`~.local.chat_completion`'s.

    Returns the :class:`~.responses_types.Response`, or with ``stream=True`` an iterator of
    its events (``response.created`` ... ``response.completed``). Raises
    :class:`~eliza_backends.errors.RequestError` (an ``InvalidArgumentError``) naming the
    field for a bad or unsupported request, other ``ElizaError`` s from the backend.
    """
    request = validate_body(ResponsesRequest, request_data({
        "input": input, "stream": stream, "instructions": instructions,
        "max_output_tokens": max_output_tokens, "temperature": temperature, "top_p": top_p,
        "previous_response_id": previous_response_id, "store": store}, extra))
    kept = response_store if response_store is not None else process_store()
    plan = responses_plan(request, kept)
    streams = LocalStreams(target, config, backend)
    name = model or request.model or model_name(streams.bundle_dir)
    formatter = ResponsesFormatter(request, name, plan.conversation, kept)
    result: Response | Iterator[BaseModel] = run_local(plan.job, formatter, streams,
                                                       stream=stream, include_usage=False)
    return result


def messages(target: Target, messages: Sequence[Mapping[str, Any]], *, max_tokens: int,
             stream: bool = False, system: str | Sequence[Mapping[str, Any]] | None = None,
             stop_sequences: Sequence[str] | None = None, temperature: float | None = None,
             model: str | None = None, backend: str | None = None,
             config: StreamConfig | Mapping[str, Any] | None = None,
             **extra: Any) -> Message | Iterator[BaseModel]:
    """An Anthropic Messages API answer to ``messages`` (text, ``tool_use`` and
    ``tool_result`` blocks) on ``target``, at most ``max_tokens`` long.

    ``extra``: any other request field (``tools``, ``tool_choice``, ``top_p``, ``top_k``,
    ``seed``, ...). ``target``, ``model``, ``backend`` and ``config`` are
    :func:`~.local.chat_completion`'s.

    Returns the :class:`~.anthropic_types.Message`, or with ``stream=True`` an iterator of its
    events (``message_start`` ... ``message_stop``). Raises
    :class:`~eliza_backends.errors.RequestError` naming the field for a bad or unsupported
    request, other ``ElizaError`` s from the backend.
    """
    request = validate_body(MessagesRequest, request_data({
        "messages": messages, "max_tokens": max_tokens, "stream": stream, "system": system,
        "stop_sequences": stop_sequences, "temperature": temperature}, extra))
    job = chat_job(chat_request(request))
    streams = LocalStreams(target, config, backend)
    formatter = MessagesFormatter(request, model or request.model or
                                  model_name(streams.bundle_dir))
    result: Message | Iterator[BaseModel] = run_local(job, formatter, streams, stream=stream,
                                                      include_usage=False)
    return result


__all__ = ["Target", "messages", "responses"]
