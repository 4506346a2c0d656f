"""The ``/v1/chat/completions`` front-end: a :class:`ChatCompletionRequest` in the core's terms.

:func:`chat_job` makes the request's :class:`~.generation.GenerationJob` (its messages as
template dicts, its sampling, budget, stop strings, ``response_format`` / ``logprobs`` output
spec and tools); :func:`prompt_text` renders the messages as the text a pooled server routes
by. The responses are formatted by :class:`~.formatting.Responder` ``("chat", ...)``.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from ..errors import RequestError, UnsupportedOperationError
from ..media import MediaLimits
from ..prompt.chat import render_chat
from .generation import GenerationJob
from .types import ChatCompletionRequest, parse_request, request_output

#: The request field a prompt error names.
PROMPT_PARAM = "messages"


def chat_job(request: ChatCompletionRequest,
             media: MediaLimits | None = None) -> GenerationJob:
    """The core's job of ``request``; a malformed ``response_format``, ``tools`` or
    ``tool_choice`` is a :class:`~eliza_backends.errors.RequestError` naming the field.
    ``media``: the limits on its images and audio (None: the defaults, no local files)."""
    output, tools = request_output(request)
    return GenerationJob(prompt=[m.for_template() for m in request.messages], sampling=request,
                         max_tokens=request.token_budget, stop=request.stop_strings,
                         output=output, tools=tools, tool_choice=request.tool_choice,
                         parallel_tool_calls=request.parallel_tool_calls is not False,
                         n=request.n, media=media)


def chat_request_of(fields: Mapping[str, Any], names: Mapping[str, str]
                    ) -> ChatCompletionRequest:
    """The chat request of another front-end's request translated into chat ``fields``
    (``/v1/responses``, ``/v1/messages`` run as the equivalent chat request); an error names
    the other API's field: ``names`` maps a chat field to it (``response_format`` ->
    ``text.format``), and a nested chat path (``messages.3``, whose index the translation
    shifts) is named by its top field."""
    try:
        return parse_request(ChatCompletionRequest, dict(fields))  # type: ignore[no-any-return]
    except RequestError as exc:
        head = (exc.param or "").partition(".")[0]
        theirs = names.get(head, head)
        message = exc.message.replace(f"{head}:", f"{theirs}:") if head else exc.message
        raise RequestError(message.replace("response_format", names.get(
            "response_format", "response_format")), param=theirs or None,
            error_code=exc.error_code) from None


def prompt_text(request: ChatCompletionRequest, template: str | None,
                template_tokens: Mapping[str, str], model: str) -> str:
    """``request``'s messages rendered with the model's chat ``template`` (and its special
    tokens), as a routing hint; :class:`UnsupportedOperationError` when the model ``model``
    has no template."""
    if not template:
        raise UnsupportedOperationError(
            f"the model {model!r} ships no chat template; use /v1/completions")
    return render_chat(template, [m.for_template(text_only=True) for m in request.messages],
                       add_generation_prompt=True, **template_tokens)


__all__ = ["PROMPT_PARAM", "chat_job", "chat_request_of", "prompt_text"]
