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
every backend. The server (``eliza-backends serve``) runs the same :class:`Generation` and
:class:`Responder` on its pooled sessions, so in-process and HTTP answers are identical.

Structured output rides on the same path: ``response_format`` and ``tools`` become a
:class:`~eliza_backends.structured.constraint.Constraint` and ``logprobs`` / ``top_logprobs`` an
:class:`~eliza_backends.structured.logits.OutputSpec`, set on the session per request
(``Session.set_output``) before its prefill, so one pooled session serves any of them;
tool-call replies are parsed back by :func:`eliza_backends.openai.tools.parse_reply`.

Who does what: the session settings that a runtime bakes in when a session opens (sampling:
temperature, top-p/k, min-p, repeat penalty, seed) come from :func:`session_config`; the
per-request budget (``max_tokens``) and ``stop`` strings are set on the session per turn
(``Session.set_turn``), so one session serves requests with any budget and stop strings
without reopening.
"""

from __future__ import annotations

import os
import time
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import replace
from typing import Any, Literal, overload

from ..backend.context import InferenceContext
from ..backend.types import FinishReason
from ..config import StreamConfig
from ..errors import ContextFullError, InvalidArgumentError
from ..stream import Stream, open_stream
from ..structured.logits import OutputSpec
from ..structured.logprobs import TokenLogprob
from .tools import Tool, native_calls, parse_reply, prepare_messages
from .types import (
    AssistantMessage,
    ChatChoice,
    ChatCompletion,
    ChatCompletionChunk,
    ChatCompletionRequest,
    ChoiceDelta,
    ChoiceLogprobs,
    ChunkChoice,
    Completion,
    CompletionChoice,
    CompletionLogprobs,
    CompletionRequest,
    FunctionCall,
    GenerationRequest,
    LogprobItem,
    OpenAIFinishReason,
    PromptTokensDetails,
    ToolCall,
    ToolCallDelta,
    TopLogprobItem,
    Usage,
    completion_id,
    now,
    parse_request,
    request_output,
)

#: Our finish reasons in OpenAI's terms: an end-of-generation token or a stop string is
#: "stop"; the token budget or a full context window is "length".
FINISH_REASONS: dict[FinishReason, OpenAIFinishReason] = {
    "eos": "stop", "stop": "stop", "length": "length", "context": "length"}

#: StreamConfig fields a request may set; they are baked into a session when it opens.
SESSION_FIELDS = ("temperature", "top_p", "top_k", "min_p", "repeat_penalty", "seed",
                  "ignore_eos")
#: Sampling fields that do not matter when decoding is greedy.
_GREEDY_IRRELEVANT = frozenset({"temperature", "top_p", "top_k", "min_p", "seed"})

Prompt = Sequence[Mapping[str, Any]] | str | Sequence[int]


def finish_reason(ours: FinishReason) -> OpenAIFinishReason:
    """OpenAI's ``finish_reason`` for one of ours (see :data:`FINISH_REASONS`)."""
    return FINISH_REASONS[ours]


def session_config(base: StreamConfig, request: GenerationRequest, choice: int = 0
                   ) -> StreamConfig:
    """The :class:`StreamConfig` a session needs to serve choice ``choice`` of ``request``:
    ``base`` with the request's sampling fields (and ``ignore_eos``). With sampling, choice
    ``i`` uses seed ``seed + i``, so the ``n`` choices differ (and each is reproducible)."""
    changes = {f: getattr(request, f) for f in SESSION_FIELDS if getattr(request, f) is not None}
    config = StreamConfig.build(base, **changes)
    if choice and not config.greedy:
        config = StreamConfig.build(config, seed=(config.seed + choice) % (1 << 32))
    return config


def session_key(config: StreamConfig) -> tuple[tuple[str, Any], ...]:
    """What must be equal for two configs to be served by the same open session: every field
    except the per-turn budget and stop strings, and except the sampling fields that greedy
    decoding ignores."""
    skip = {"max_tokens", "stop"} | (_GREEDY_IRRELEVANT if config.greedy else set())
    return tuple((k, repr(v)) for k, v in config.model_dump().items() if k not in skip)


def serving_config(config: StreamConfig | Mapping[str, Any] | None = None, **overrides: Any
                   ) -> StreamConfig:
    """The config of sessions that serve requests: ``config`` with ``overrides``. Its budget
    and stop strings do not matter: :class:`Generation` sets each request's own on the
    session, per turn (``Session.set_turn``)."""
    return StreamConfig.build(config, **overrides)


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
                 tool_choice: str | Mapping[str, Any] | None = None) -> None:
        """``output``: the constraint and logprobs of this completion (None: the stream's
        config's). ``tools`` / ``tool_choice``: a tool-call request; the reply (constrained by
        ``output``) is parsed into :attr:`tool_calls` or :attr:`content` when it ends."""
        self.stream = stream
        self.prompt = prompt
        self.max_tokens = max_tokens
        self.output = output
        self.tools = list(tools) if tools else None
        self.tool_choice = tool_choice
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
        #: a tool-call reply, parsed when it ends: the calls (OpenAI shape) or the content
        self.tool_calls: list[dict[str, Any]] = []
        self.content: str | None = None
        #: the reply is read in the model's own call syntax (Gemma 4, ``tool_choice`` auto)
        self.native_calls = False
        self.prompt_tokens = 0
        self.cached_tokens = 0
        self.completion_tokens = 0
        self.finish_reason: OpenAIFinishReason | None = None
        self.parts: list[str] = []
        self.started_at: float | None = None  # time.perf_counter() at start()
        self.first_token_at: float | None = None
        self.stop = tuple(stop)

    def _prompt_ids(self) -> list[int]:
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
                return self.stream.chat_tokens(msgs, tools=extra.get("tools"))
            return self.stream.chat_tokens(items)  # type: ignore[arg-type]
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
        ids = self._prompt_ids()
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
        if self.native_calls and output is not None:  # the model's own syntax, parsed after
            output = OutputSpec(None, output.logprobs, output.top_logprobs)
        self.stream.session.set_output(output if output is None or output.active else None)
        self.stream.set_turn(max_tokens=self.max_tokens or window - len(ids), stop=self.stop)
        prefilled = self.stream.prefill_reusing(ids)
        self.prompt_tokens = len(ids)
        self.cached_tokens = len(ids) - prefilled

    @property
    def done(self) -> bool:
        """True once the generation ended (``finish_reason`` is set)."""
        return self.finish_reason is not None

    def step(self) -> str:
        """One step of the stream; returns the text it adds (may be empty: a held-back
        partial character or stop-string prefix, or an end token). Sets ``finish_reason``
        on the last one."""
        if self.finish_reason is not None:
            return ""
        self.stream.check_generation(self)
        try:  # (the turn's budget caps the step)
            step = self.stream.next(self.stream.config.tokens_per_step)
        except BaseException:
            self.stream.end_generation(self)  # a failed step ends the completion
            raise
        if step.tokens and self.first_token_at is None:
            self.first_token_at = time.perf_counter()
        self.completion_tokens += len(step.tokens)
        text = step.text  # (the session's turn ends at the request's stop strings and budget)
        if step.final:
            self.finish_reason = finish_reason(step.finish_reason or "eos")
        if self.finish_reason is not None:
            self.stream.end_generation(self)
        self.parts.append(text)
        self._follow_text(step.logprobs, len(text.encode("utf-8")))
        if not self.holds_reply:
            return text
        if self.finish_reason is None:  # a tool-call reply is parsed whole at its end
            return ""
        self.content, self.tool_calls = parse_reply(
            self.text, native=self.tools if self.native_calls else None)
        if self.tool_calls and self.finish_reason == "stop":
            self.finish_reason = "tool_calls"
        return self.content or ""

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


class Responder:
    """Builds one response's OpenAI objects: the chunks of a streamed response and the final
    object of a non-streamed one. ``kind`` is ``"chat"`` or ``"text"``; ``model`` is the id
    the response names."""

    def __init__(self, kind: Literal["chat", "text"], model: str) -> None:
        self.kind = kind
        self.model = model
        self.id = completion_id("chatcmpl" if kind == "chat" else "cmpl")
        self.created = now()

    def first_chunk(self, index: int) -> ChatCompletionChunk | None:
        """The chunk that opens choice ``index`` (chat: the assistant role; text: none)."""
        if self.kind != "chat":
            return None
        return ChatCompletionChunk(id=self.id, created=self.created, model=self.model,
                                   choices=[ChunkChoice(index=index, delta=ChoiceDelta(
                                       role="assistant", content=""))])

    def chunk(self, index: int, text: str, finish: OpenAIFinishReason | None,
              generation: Generation | None = None) -> ChatCompletionChunk | Completion:
        """A chunk adding ``text`` to choice ``index`` (``finish``: it is the choice's last),
        with ``generation``'s last step's logprobs and, in the last chunk, its tool calls."""
        gen = generation
        step_lp = gen.step_logprobs if gen is not None and gen.logprobs is not None else None
        if self.kind == "chat":
            calls = [ToolCallDelta(index=i, **c) for i, c in enumerate(gen.tool_calls)] \
                if gen is not None and gen.tool_calls and finish else None
            delta = ChoiceDelta(content=text or None, tool_calls=calls)
            return ChatCompletionChunk(id=self.id, created=self.created, model=self.model,
                                       choices=[ChunkChoice(
                                           index=index, delta=delta, finish_reason=finish,
                                           logprobs=chat_logprobs(step_lp))])
        return Completion(id=self.id, created=self.created, model=self.model,
                          choices=[CompletionChoice(index=index, text=text,
                                                    finish_reason=finish,
                                                    logprobs=text_logprobs(step_lp))])

    def usage_chunk(self, usage: Usage) -> ChatCompletionChunk | Completion:
        """The last chunk of a stream with ``include_usage``: no choices, the usage."""
        if self.kind == "chat":
            return ChatCompletionChunk(id=self.id, created=self.created, model=self.model,
                                       choices=[], usage=usage)
        return Completion(id=self.id, created=self.created, model=self.model, choices=[],
                          usage=usage)

    def final(self, generations: Sequence[Generation]) -> ChatCompletion | Completion:
        """The non-streamed response of finished ``generations`` (one per choice)."""
        usage = usage_of(generations)
        if self.kind == "chat":
            return ChatCompletion(
                id=self.id, created=self.created, model=self.model, usage=usage,
                choices=[ChatChoice(index=i, message=assistant_message(g),
                                    finish_reason=g.finish_reason or "stop",
                                    logprobs=chat_logprobs(g.logprobs))
                         for i, g in enumerate(generations)])
        return Completion(
            id=self.id, created=self.created, model=self.model, usage=usage,
            choices=[CompletionChoice(index=i, text=g.text, finish_reason=g.finish_reason
                                      or "stop", logprobs=text_logprobs(g.logprobs))
                     for i, g in enumerate(generations)])


def assistant_message(gen: Generation) -> AssistantMessage:
    """The message of a finished chat generation: its tool calls, or its text."""
    if gen.tool_calls:
        return AssistantMessage(content=None, tool_calls=[
            ToolCall(id=c["id"], function=FunctionCall(**c["function"]))
            for c in gen.tool_calls])
    return AssistantMessage(content=gen.content if gen.holds_reply else gen.text)


def chat_logprobs(entries: Sequence[TokenLogprob] | None) -> ChoiceLogprobs | None:
    """OpenAI's chat ``logprobs`` of ``entries`` (None when none were asked for)."""
    if entries is None:
        return None
    return ChoiceLogprobs(content=[LogprobItem(
        token=e.text, logprob=e.logprob, bytes=list(e.piece),
        top_logprobs=[TopLogprobItem(token=t.text, logprob=t.logprob, bytes=list(t.piece))
                      for t in e.top]) for e in entries])


def text_logprobs(entries: Sequence[TokenLogprob] | None) -> CompletionLogprobs | None:
    """The legacy completions ``logprobs`` of ``entries`` (None when none were asked for)."""
    if entries is None:
        return None
    offsets, at = [], 0
    for e in entries:
        offsets.append(at)
        at += len(e.text)
    return CompletionLogprobs(
        tokens=[e.text for e in entries], token_logprobs=[e.logprob for e in entries],
        top_logprobs=[{t.text: t.logprob for t in e.top} for e in entries],
        text_offset=offsets)


def generation_for(stream: Stream, request: ChatCompletionRequest | CompletionRequest,
                   prompt: Prompt) -> Generation:
    """The :class:`Generation` of ``request`` (its budget, stop strings, constraint,
    logprobs and tools) on ``stream``, not started."""
    output, tools = request_output(request)
    return Generation(stream, prompt, max_tokens=request.token_budget,
                      stop=request.stop_strings, output=output, tools=tools,
                      tool_choice=getattr(request, "tool_choice", None))


def usage_of(generations: Sequence[Generation]) -> Usage:
    """Usage of a response: the prompt once, the completions of every choice."""
    first = generations[0] if generations else None
    prompt = first.prompt_tokens if first else 0
    completion_total = sum(g.completion_tokens for g in generations)
    return Usage(prompt_tokens=prompt, completion_tokens=completion_total,
                 total_tokens=prompt + completion_total,
                 prompt_tokens_details=PromptTokensDetails(
                     cached_tokens=first.cached_tokens if first else 0))


def request_prompt(request: ChatCompletionRequest | CompletionRequest) -> Prompt:
    """What :class:`Generation` prefills for ``request``: template dicts of its messages, or
    its prompt text / token ids."""
    if isinstance(request, ChatCompletionRequest):
        return [m.for_template() for m in request.messages]
    prompt = request.prompt
    if isinstance(prompt, list) and prompt and isinstance(prompt[0], str):
        return str(prompt[0])
    return prompt  # type: ignore[return-value]


def model_name(bundle_dir: str | os.PathLike[str]) -> str:
    """The id a bundle's model is served under: the manifest's ``name``, else the folder's."""
    from ..bundle import load_manifest
    from ..errors import BundleError

    try:
        name = load_manifest(bundle_dir).name
    except (BundleError, OSError):
        name = None
    return name or os.path.basename(os.path.abspath(bundle_dir))


# --------------------------------------------------------------------------- in process


class _LocalStreams:
    """The streams one in-process call generates on: the caller's own stream (whose settings
    must match the request's), or streams opened on a bundle or context, closed afterwards."""

    def __init__(self, target: str | os.PathLike[str] | InferenceContext | Stream,
                 config: StreamConfig | Mapping[str, Any] | None, backend: str | None) -> None:
        self._own: Stream | None = target if isinstance(target, Stream) else None
        self._opened: dict[tuple[tuple[str, Any], ...], Stream] = {}
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


def _run_local(request: ChatCompletionRequest | CompletionRequest,
               target: str | os.PathLike[str] | InferenceContext | Stream,
               config: StreamConfig | Mapping[str, Any] | None, backend: str | None,
               model: str | None) -> Any:
    streams = _LocalStreams(target, config, backend)
    responder = Responder("chat" if isinstance(request, ChatCompletionRequest) else "text",
                          model or request.model or model_name(streams.bundle_dir))
    prompt = request_prompt(request)

    current: list[Generation] = []  # the completion running (ended if the call is left)

    def started(index: int) -> Generation:
        stream = streams.fit(session_config(streams.base, request, index))
        gen = generation_for(stream, request, prompt)
        gen.start()
        current[:] = [gen]
        return gen

    def close() -> None:
        for gen in current:  # an iterator closed early leaves its completion unfinished
            gen.stream.end_generation(gen)
        streams.close()

    if not request.stream:
        try:
            finished = []
            for index in range(request.n):
                gen = started(index)
                while not gen.done:
                    gen.step()
                finished.append(gen)
            return responder.final(finished)
        finally:
            close()

    def chunks() -> Iterator[ChatCompletionChunk | Completion]:
        finished = []
        try:
            for index in range(request.n):
                gen = started(index)
                first = responder.first_chunk(index)
                if first is not None:
                    yield first
                while not gen.done:
                    text = gen.step()
                    if text or gen.done or gen.step_logprobs:
                        yield responder.chunk(index, text, gen.finish_reason, gen)
                finished.append(gen)
            if request.include_usage:
                yield responder.usage_chunk(usage_of(finished))
        finally:
            close()

    return chunks()


def _request(kind: type[ChatCompletionRequest] | type[CompletionRequest],
             fields: dict[str, Any], extra: Mapping[str, Any]) -> Any:
    """The request of a Python call, through the one validation layer (:func:`parse_request`):
    tuples become lists and mappings dicts (the JSON shapes); anything else is left for the
    validation to refuse with an :class:`InvalidArgumentError` naming the field."""
    data = {k: _as_json(v) for k, v in fields.items() if v is not None}
    data.update({k: _as_json(v) for k, v in extra.items()})
    return parse_request(kind, data)


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
    result: ChatCompletion | Iterator[ChatCompletionChunk] = _run_local(
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
    result: Completion | Iterator[Completion] = _run_local(request, target, config, backend,
                                                           model)
    return result


__all__ = [
    "FINISH_REASONS",
    "SESSION_FIELDS",
    "Generation",
    "Responder",
    "assistant_message",
    "chat_completion",
    "chat_logprobs",
    "completion",
    "finish_reason",
    "generation_for",
    "model_name",
    "request_prompt",
    "serving_config",
    "session_config",
    "session_key",
    "text_logprobs",
    "usage_of",
]
