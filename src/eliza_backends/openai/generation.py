"""The generation core: one completion on a stream, driven by every API front-end.

A front-end (``/v1/chat/completions``: :mod:`.chat`; ``/v1/completions``: :mod:`.completions`;
the next ones, ``/v1/responses`` and Anthropic's ``/v1/messages``, the same way) turns its
request into a :class:`GenerationJob`: the prompt (chat messages, text or token ids), the
session settings (:class:`~eliza_backends.serving.SamplingSettings`: a session is picked or
opened with :meth:`GenerationJob.session_config`), the budget and stop strings, the output spec
(constraint, logprobs) and the tools. The core runs it: :meth:`Generation.start` prefills (with
prefix reuse) and :meth:`Generation.step` returns each step's text delta, with that step's
logprob entries in :attr:`Generation.step_logprobs`; when it ends, :attr:`Generation.ended`
says why (:data:`EndReason`), a tool-call reply is parsed into :attr:`Generation.tool_calls` /
:attr:`Generation.content`, and the usage counts are ``prompt_tokens``, ``cached_tokens`` and
``completion_tokens`` (and, on a session with a drafter, ``drafted_tokens`` /
``accepted_tokens``). The front-end formats all of that in its own API's shapes (the OpenAI
ones: :mod:`.formatting`); the core knows no response shape.

Structured output rides on the same path: ``output`` (a
:class:`~eliza_backends.structured.logits.OutputSpec`: the constraint of ``response_format`` or
``tools``, and the logprobs asked for) is set on the session per request (``Session.set_output``)
before its prefill, so one pooled session serves any of them; tool-call replies are parsed back
by :func:`eliza_backends.openai.tools.parse_reply`. The budget (``max_tokens``) and ``stop``
strings are set per turn (``Session.set_turn``).

Who drives it: the in-process API (:mod:`.local`) on its own streams, the HTTP server
(:mod:`eliza_backends.server.app`) on pooled sessions' threads, so in-process and HTTP answers
are identical.
"""

from __future__ import annotations

import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, replace
from typing import Any, Literal

from ..backend.media_seq import PrefillPlan
from ..backend.types import FinishReason
from ..config import StreamConfig
from ..errors import ContextFullError, InvalidArgumentError
from ..media import MediaItem, MediaLimits
from ..serving import SamplingSettings, session_config
from ..stream import Stream
from ..structured.logits import OutputSpec
from ..structured.logprobs import TokenLogprob
from .gemma4_reader import Gemma4Reader
from .tools import (
    Tool,
    native_calls,
    native_constraint,
    native_tools,
    parse_reply,
    prepare_messages,
)
from .types import OpenAIFinishReason

#: Why a generation ended: the stream's reason (an end token, a stop string, the budget, the
#: context window), or ``"tool_calls"`` when a tool-call reply ended in calls.
EndReason = FinishReason | Literal["tool_calls"]

#: Our finish reasons in OpenAI's terms: an end-of-generation token or a stop string is
#: "stop"; the token budget or a full context window is "length".
FINISH_REASONS: dict[FinishReason, OpenAIFinishReason] = {
    "eos": "stop", "stop": "stop", "length": "length", "context": "length"}

#: What a generation prefills: chat messages (template dicts), text, or token ids.
Prompt = Sequence[Mapping[str, Any]] | str | Sequence[int]


def finish_reason(ours: FinishReason) -> OpenAIFinishReason:
    """OpenAI's ``finish_reason`` for one of ours (see :data:`FINISH_REASONS`)."""
    return FINISH_REASONS[ours]


@dataclass(frozen=True)
class GenerationJob:
    """A request in the core's terms, made by a front-end from its own request model.

    ``sampling``: the session settings (None fields: the base config's); ``n``: how many
    choices (each one :class:`Generation`, choice ``i`` on :meth:`session_config` ``(base, i)``);
    ``max_tokens`` None: until an end token or the end of the context window; ``output``: the
    constraint and logprobs (None: neither); ``tools`` / ``tool_choice``: a tool-call request
    (``parallel_tool_calls``: whether a reply may call more than one tool);
    ``media``: what images and audio the messages may carry (None: the defaults, no local
    files; see :class:`~eliza_backends.media.MediaLimits`).
    """

    prompt: Prompt
    sampling: SamplingSettings
    max_tokens: int | None = None
    stop: tuple[str, ...] = ()
    output: OutputSpec | None = None
    tools: Sequence[Tool] | None = None
    tool_choice: str | Mapping[str, Any] | None = None
    parallel_tool_calls: bool = True
    n: int = 1
    media: MediaLimits | None = None

    def session_config(self, base: StreamConfig, choice: int = 0) -> StreamConfig:
        """The config of a session that serves choice ``choice`` (see
        :func:`~eliza_backends.serving.session_config`)."""
        return session_config(base, self.sampling, choice)


class Generation:
    """One completion on a stream: prefill with prefix reuse, then steps, with the request's
    ``max_tokens`` budget and ``stop`` strings.

    Not thread-safe: :meth:`start` and :meth:`step` run on the stream's consumer thread.
    ``prompt`` is chat messages (rendered with the model's template), text (tokenized with
    BOS where the model uses one) or token ids. After :meth:`start`, ``prompt_tokens`` is the
    prompt's length and ``cached_tokens`` how many of them the session already held.
    """

    def __init__(self, stream: Stream, prompt: Prompt, *, max_tokens: int | None = None,
                 stop: Sequence[str] = (), output: OutputSpec | None = None,
                 tools: Sequence[Tool] | None = None,
                 tool_choice: str | Mapping[str, Any] | None = None,
                 parallel_tool_calls: bool = True,
                 media: MediaLimits | None = None) -> None:
        """``output``: the constraint and logprobs of this completion (None: the stream's
        config's). ``tools`` / ``tool_choice``: a tool-call request; the reply (constrained by
        ``output``) is parsed into :attr:`tool_calls` or :attr:`content` when it ends.
        ``media``: the limits on the messages' images and audio (None: the defaults)."""
        self.stream = stream
        self.media = media
        self.prompt = prompt
        self.max_tokens = max_tokens
        self.output = output
        self.tools = list(tools) if tools else None
        self.tool_choice = tool_choice
        self.parallel_tool_calls = parallel_tool_calls
        #: every generated token's logprob (when asked for); ``step_logprobs``: the last step's.
        #: They follow the text: a token's entry is released once all of its text is (the
        #: entries of held-back text wait), and a stop string drops the entries of the tokens
        #: past the cut; the token the cut falls inside keeps its entry (its logprob, its
        #: ``piece`` cut to the bytes in the text), so the entries' tokens always spell the
        #: text exactly (what OpenAI clients rebuild it from).
        self.logprobs: list[TokenLogprob] | None = None
        self.step_logprobs: list[TokenLogprob] = []
        self._lp_held: list[TokenLogprob] = []
        self._lp_start = 0  # byte offset in the text where the first held entry's token starts
        self._emitted = 0  # bytes of text released so far
        #: a tool-call reply's calls (OpenAI shape) and content, whole once it ends; a reply in
        #: the model's own syntax is read as it streams: ``step_tool_calls`` are the calls
        #: the last step finished (a JSON reply's all come with its last step)
        self.tool_calls: list[dict[str, Any]] = []
        self.step_tool_calls: list[dict[str, Any]] = []
        self.content: str | None = None
        #: the reply is read in the model's own call syntax (Gemma 4's template)
        self.native_calls = False
        self._reader: Gemma4Reader | None = None
        self.prompt_tokens = 0
        self.cached_tokens = 0
        self.completion_tokens = 0
        #: tokens a speculative drafter proposed, and how many of them the target kept
        self.drafted_tokens = 0
        self.accepted_tokens = 0
        self.ended: EndReason | None = None  # why it ended (None: running)
        self.parts: list[str] = []
        self.started_at: float | None = None  # time.perf_counter() at start()
        self.first_token_at: float | None = None
        self.stop = tuple(stop)

    def __copy__(self) -> Generation:
        """A shallow copy (a step's snapshot for another thread), made without the reduce
        protocol ``copy.copy`` otherwise goes through: it runs once per token in the server."""
        clone = object.__new__(type(self))
        clone.__dict__.update(self.__dict__)
        return clone

    def prompt_length(self) -> int:
        """How many tokens :meth:`start` would prefill for the prompt (messages rendered with
        the template and the tools, media expanded); on the stream's consumer thread."""
        prompt = self._prompt_ids()
        return len(prompt.ids if isinstance(prompt, PrefillPlan) else prompt)

    def _prompt_ids(self) -> list[int] | PrefillPlan:
        """The prompt's ids; a plan when its messages hold images or audio (decoded and
        expanded by the session's backend before anything is prefilled)."""
        prompt = self.prompt
        if isinstance(prompt, str):
            return self.stream.session.tokenize(prompt, add_special=True)
        items = list(prompt)
        if items and all(isinstance(m, Mapping) for m in items):
            if self.tools:
                template = self.stream.config.chat_template or \
                    self.stream.session.chat_template or ""
                msgs, extra = prepare_messages(items, self.tools,  # type: ignore[arg-type]
                                               self.tool_choice, template)
                self.native_calls = native_calls(template, self.tool_choice)
                elements = self.stream.chat_elements(msgs, tools=extra.get("tools"),
                                                     media_limits=self.media)
            else:
                elements = self.stream.chat_elements(items,  # type: ignore[arg-type]
                                                     media_limits=self.media)
            if any(isinstance(e, MediaItem) for e in elements):
                return self.stream.session.plan_prefill(elements)
            return elements  # type: ignore[return-value]
        return items  # type: ignore[return-value]  # token ids: checked by prefill

    def start(self) -> None:
        """Tokenize, check the prompt and budget fit the context window
        (:class:`ContextFullError` otherwise, before anything is prefilled), prefill."""
        self.started_at = time.perf_counter()
        self.stream.begin_generation(self)
        try:
            self._start()
        except BaseException:
            self.stream.end_generation(self)
            raise

    def _start(self) -> None:
        prompt = self._prompt_ids()
        ids = prompt.ids if isinstance(prompt, PrefillPlan) else prompt
        window = self.stream.session.context_size
        if not ids:
            raise InvalidArgumentError("the prompt is empty: send at least one token of text")
        if len(ids) >= window:
            raise ContextFullError(
                f"the prompt is {len(ids)} tokens but the context window is {window} (and "
                "at least one token must be generated): shorten the prompt or messages, or "
                "use a larger context size")
        if self.max_tokens is not None and len(ids) + self.max_tokens > window:
            raise ContextFullError(
                f"this model's context window is {window} tokens, but {len(ids) + self.max_tokens}"
                f" were requested ({len(ids)} in the prompt, {self.max_tokens} in max_tokens): "
                "lower max_tokens, shorten the prompt, or use a larger context size")
        output = self.output
        if self.native_calls and self.tools:  # the model's own syntax, read as it streams
            self._reader = Gemma4Reader(native_tools(self.tools, self.tool_choice))
            output = OutputSpec(native_constraint(self.tools, self.tool_choice,
                                                  self.parallel_tool_calls),
                                output.logprobs if output is not None else False,
                                output.top_logprobs if output is not None else 0)
        self.stream.session.set_output(output if output is None or output.active else None)
        self.stream.set_turn(max_tokens=self.max_tokens or window - len(ids), stop=self.stop)
        prefilled = self.stream.prefill_reusing(prompt)
        self.prompt_tokens = len(ids)
        self.cached_tokens = len(ids) - prefilled

    @classmethod
    def of_job(cls, stream: Stream, job: GenerationJob) -> Generation:
        """The generation of ``job`` (its prompt, budget, stop strings, output and tools) on
        ``stream``, not started."""
        return cls(stream, job.prompt, max_tokens=job.max_tokens, stop=job.stop,
                   output=job.output, tools=job.tools, tool_choice=job.tool_choice,
                   parallel_tool_calls=job.parallel_tool_calls, media=job.media)

    @property
    def finish_reason(self) -> OpenAIFinishReason | None:
        """Why it ended, in OpenAI's terms (None while it runs): ``"tool_calls"``, or
        :data:`FINISH_REASONS` of :attr:`ended`."""
        ended = self.ended
        if ended is None:
            return None
        return "tool_calls" if ended == "tool_calls" else FINISH_REASONS[ended]

    @property
    def speculates(self) -> bool:
        """True when the stream's session drafts (its config names a drafter)."""
        return self.stream.config.drafter != "none"

    @property
    def done(self) -> bool:
        """True once the generation ended (:attr:`ended` is set)."""
        return self.ended is not None

    def step(self) -> str:
        """One step of the stream; returns the text it adds (may be empty: a held-back
        partial character or stop-string prefix, or an end token). Sets :attr:`ended`
        on the last one."""
        if self.ended is not None:
            return ""
        self.stream.check_generation(self)
        try:  # the session's step: tokens_per_step, or a speculative round with a drafter
            step = self.stream.next()  # (the turn's budget caps it)
        except BaseException:
            self.stream.end_generation(self)  # a failed step ends the completion
            raise
        if step.tokens and self.first_token_at is None:
            self.first_token_at = time.perf_counter()
        self.completion_tokens += len(step.tokens)
        self.drafted_tokens += step.drafted
        self.accepted_tokens += step.accepted
        text = step.text  # (the session's turn ends at the request's stop strings and budget)
        if step.final:
            self.ended = step.finish_reason or "eos"
        if self.ended is not None:
            self.stream.end_generation(self)
        self.parts.append(text)
        self._follow_text(step.logprobs, len(text.encode("utf-8")))
        self.step_tool_calls = []
        if self._reader is not None:
            return self._read_native(text)
        if not self.holds_reply:
            return text
        if self.ended is None:  # a JSON tool-call reply is parsed whole at its end
            return ""
        self.content, self.tool_calls = parse_reply(self.text)
        self.step_tool_calls = self.tool_calls
        if self.tool_calls and self.finish_reason == "stop":
            self.ended = "tool_calls"
        return self.content or ""

    def _read_native(self, text: str) -> str:
        """A step of a reply in Gemma 4's own call syntax: the content it decided (returned)
        and the calls it finished (:attr:`step_tool_calls`); the rest at the end."""
        assert self._reader is not None
        reading = self._reader.feed(text)
        if self.ended is not None:
            reading.extend(self._reader.finish())
        self.step_tool_calls = reading.calls
        self.tool_calls += reading.calls
        if self.ended is not None:
            content = "".join(self._reader.content)
            self.content = (content or None) if self.tool_calls else content
            if self.tool_calls and self.finish_reason == "stop":
                self.ended = "tool_calls"
        return "".join(reading.content)

    def _follow_text(self, entries: Sequence[TokenLogprob] | None, n_bytes: int) -> None:
        """Release the logprob entries whose tokens' text has been released (``n_bytes`` more
        bytes of it this step): :attr:`step_logprobs`, appended to :attr:`logprobs`."""
        held = self._lp_held
        if entries is not None:
            held.extend(entries)
            if self.logprobs is None:
                self.logprobs = []
        self._emitted += n_bytes
        out: list[TokenLogprob] = []
        if self.finish_reason is not None and self.finish_reason != "stop":
            out, held[:] = list(held), []  # the whole text is out (end token entries too)
        else:
            while held and self._lp_start + len(held[0].piece) <= self._emitted:
                entry = held.pop(0)
                self._lp_start += len(entry.piece)
                out.append(entry)
            if self.finish_reason == "stop":
                cut = self._emitted - self._lp_start  # the text ends inside held[0]'s token
                if held and cut > 0:
                    out.append(replace(held[0], piece=held[0].piece[:cut]))
                held.clear()  # tokens at or past the stop string: cut with their text
        self.step_logprobs = out
        if self.logprobs is not None:
            self.logprobs.extend(out)

    @property
    def holds_reply(self) -> bool:
        """True for a tool-call request: its text is JSON (or Gemma 4 call syntax), returned
        parsed when it ends."""
        constrained = self.output is not None and self.output.constraint is not None
        return bool(self.tools) and (self.native_calls or constrained)

    @property
    def text(self) -> str:
        """All text generated so far."""
        return "".join(self.parts)


__all__ = ["FINISH_REASONS", "EndReason", "Generation", "GenerationJob", "Prompt",
           "finish_reason"]
