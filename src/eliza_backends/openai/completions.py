"""The ``/v1/completions`` front-end: a (legacy) :class:`CompletionRequest` in the core's terms.

:func:`completion_job` makes the request's :class:`~.generation.GenerationJob` (its prompt:
text, tokenized with BOS where the model uses one, or token ids; its sampling, budget, stop
strings and ``logprobs``); :func:`prompt_text` is the prompt's text a pooled server routes by.
The responses are formatted by :class:`~.formatting.Responder` ``("text", ...)``.
"""

from __future__ import annotations

from .generation import GenerationJob, Prompt
from .types import CompletionRequest, request_output

#: The request field a prompt error names.
PROMPT_PARAM = "prompt"


def completion_job(request: CompletionRequest) -> GenerationJob:
    """The core's job of ``request``."""
    output, _ = request_output(request)
    return GenerationJob(prompt=_prompt(request), sampling=request,
                         max_tokens=request.token_budget, stop=request.stop_strings,
                         output=output, n=request.n)


def _prompt(request: CompletionRequest) -> Prompt:
    """What the core prefills: the prompt's text (the first of a one-string list) or ids."""
    prompt = request.prompt
    if isinstance(prompt, list) and prompt and isinstance(prompt[0], str):
        return str(prompt[0])
    return prompt  # type: ignore[return-value]


def prompt_text(request: CompletionRequest) -> str:
    """The prompt's text, as a routing hint (token ids: none)."""
    prompt = request.prompt
    return prompt if isinstance(prompt, str) else \
        str(prompt[0]) if isinstance(prompt[0], str) else ""


__all__ = ["PROMPT_PARAM", "completion_job", "prompt_text"]
