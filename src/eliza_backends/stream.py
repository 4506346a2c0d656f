"""The stream API: select a backend, open a session, stream steps, measure them.

``open_stream`` -> :class:`Stream` (``prefill`` / ``next`` / iterate / ``async for``) ->
``close``. ``generate`` is the one-call form. From a coroutine, ``await aopen_stream(...)``,
``await stream.aprefill(...)`` and ``async for`` keep the event loop running while the model
loads, prefills and decodes (each runs in a worker thread). A stream owns its session, and its
:class:`InferenceContext` unless you pass one in (then several streams share one load).
"""

from __future__ import annotations

import contextlib
import os
import time
import warnings
from collections.abc import AsyncIterator, Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, TypeVar

from .backend.media_seq import PrefillPlan
from .backend.prompt_cache import PromptCache, reusable
from .backend.session import Session
from .backend.types import MediaSpan, Step, check_output_support
from .media import DEFAULT_LIMITS, MediaItem, MediaLimits

if TYPE_CHECKING:
    import asyncio

    from typing_extensions import Unpack  # typing.Unpack from Python 3.11
from .backend.context import InferenceContext
from .config import StreamConfig, StreamOverrides
from .errors import (
    InvalidArgumentError,
    PluginError,
    SessionBusyError,
    UnsupportedOperationError,
)
from .registry import Registry, default_registry
from .selector import KNOWN_BACKENDS, safe_media, select
from .structured.logits import OutputSpec

T = TypeVar("T")


@dataclass
class StreamMetrics:
    """What a stream measured. Times in seconds (``time.perf_counter``), counts in tokens.

    ``time_to_first_token`` is for the latest turn: from the start of its prefill to the
    first generated token. Decode time counts ``next()`` calls; prefill time ``prefill()``.
    """

    prefill_tokens: int = 0
    prefill_seconds: float = 0.0
    decode_tokens: int = 0
    decode_seconds: float = 0.0
    drafted: int = 0
    accepted: int = 0
    time_to_first_token: float | None = None
    turns: int = 0

    @property
    def prefill_tokens_per_second(self) -> float:
        """Prefill throughput over the stream."""
        return self.prefill_tokens / self.prefill_seconds if self.prefill_seconds else 0.0

    @property
    def decode_tokens_per_second(self) -> float:
        """Decode throughput over the stream."""
        return self.decode_tokens / self.decode_seconds if self.decode_seconds else 0.0

    @property
    def acceptance_rate(self) -> float | None:
        """accepted / drafted, or None when nothing was drafted."""
        return self.accepted / self.drafted if self.drafted else None

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready form, with the derived rates."""
        return {
            "prefill_tokens": self.prefill_tokens, "prefill_seconds": self.prefill_seconds,
            "decode_tokens": self.decode_tokens, "decode_seconds": self.decode_seconds,
            "drafted": self.drafted, "accepted": self.accepted,
            "time_to_first_token": self.time_to_first_token, "turns": self.turns,
            "prefill_tokens_per_second": self.prefill_tokens_per_second,
            "decode_tokens_per_second": self.decode_tokens_per_second,
            "acceptance_rate": self.acceptance_rate,
        }


class Stream:
    """One generation stream over a :class:`Session`, with metrics.

    Iterate it (``for step in stream``) or ``async for`` it after a prefill; each item is a
    :class:`Step`, the last one has ``final=True``. Single consumer, like the session;
    :meth:`cancel` is safe from any thread.
    """

    def __init__(self, session: Session, *, backend: str,
                 context: InferenceContext, owns_context: bool) -> None:
        self.session = session
        self.backend = backend
        self.context = context
        self._owns_context = owns_context
        self.metrics = StreamMetrics()
        self._turn_start: float | None = None
        self._closed = False
        self._generation: object | None = None  # the open completion (see begin_generation)
        #: The host-memory cache :meth:`prefill_reusing` saves the session's evicted state to
        #: and restores a longer prefix from (None: the session's own prefix only); shared by
        #: the streams of one server (see :mod:`eliza_backends.backend.prompt_cache`).
        self.prompt_cache: PromptCache | None = None
        self._prompt_end = 0  # the sequence's length after the last prefill_reusing

    @property
    def config(self) -> StreamConfig:
        """The session's configuration."""
        return self.session.config

    def prefill(self, prompt: str | Sequence[int | MediaItem] | PrefillPlan, *,
                add_special: bool | None = None) -> int:
        """Feed a prompt (text, tokenized with the model's tokenizer, or token ids, which may
        hold media items: see :meth:`Session.prefill`); returns the number of positions fed.
        Text at the start of a sequence gets BOS unless ``add_special=False``."""
        t0 = time.perf_counter()
        session = self.session
        if isinstance(prompt, str):
            special = session.n_past == 0 if add_special is None else add_special
            prompt = session.tokenize(prompt, add_special=special)
        before = session.n_past
        session.prefill(prompt)
        t1 = time.perf_counter()
        self._turn_start = t0
        fed = session.n_past - before
        self.metrics.prefill_tokens += fed
        self.metrics.prefill_seconds += t1 - t0
        self.metrics.turns += 1
        return fed

    def prefill_pieces(self, pieces: Sequence[str | Sequence[int] | MediaItem], *,
                       add_special: bool | None = None) -> int:
        """Feed an ordered list of text (tokenized as :meth:`prefill` does, BOS only before
        the first piece at the start of a sequence), token ids and
        :class:`~eliza_backends.media.MediaItem` s (see :mod:`eliza_backends.media` to make
        them); returns the number of positions fed. The last piece must be text or ids."""
        elements: list[int | MediaItem] = []
        for i, piece in enumerate(pieces):
            if isinstance(piece, str):
                special = (self.session.n_past == 0 if add_special is None else add_special) \
                    and i == 0
                elements += self.session.tokenize(piece, add_special=special)
            elif isinstance(piece, MediaItem):
                elements.append(piece)
            else:
                elements += piece
        return self.prefill(elements)

    def chat_tokens(self, messages: Sequence[Mapping[str, Any]], *,
                    add_generation_prompt: bool = True,
                    tools: Sequence[Mapping[str, Any]] | None = None) -> list[int]:
        """Render chat ``messages`` with the model's template (or ``config.chat_template``) and
        tokenize the result (no BOS added: templates write their own). Prefills nothing.
        ``tools``: OpenAI tool definitions for a template that renders them.
        Message content is never read as control tokens: ``"<|end|>"`` in a message is text
        (see :mod:`eliza_backends.prompt.chat_tokens`). Rendering is bounded
        (:class:`~eliza_backends.prompt.chat.RenderLimits`) and :meth:`cancel` stops it with
        :class:`CancelledError`.
        """
        session = self.session
        template = self._template()
        from .prompt.chat import render_bounds  # (chat streams only: templates, jinja2)
        from .prompt.chat_tokens import chat_token_ids

        with render_bounds(cancelled=lambda: session.cancelled):
            return chat_token_ids(session, template, messages,
                                  add_generation_prompt=add_generation_prompt, tools=tools)

    def _template(self) -> str:
        template = self.config.chat_template or self.session.chat_template
        if not template:
            raise UnsupportedOperationError(
                f"the model served by {self.backend} ships no chat template; pass one with "
                "StreamConfig(chat_template=...) or prefill text yourself")
        return template

    def prefill_reusing(self, token_ids: Sequence[int | MediaItem] | PrefillPlan) -> int:
        """Make the session's sequence exactly ``token_ids``, ready to generate from, prefilling
        only the tokens after the longest prefix it shares with :attr:`Session.history` (the
        rest is kept with ``reset_keep``; at least the last token is prefilled, for its
        logits). Returns the number of tokens prefilled.

        Media items are part of the sequence: the shared prefix ends before the first item
        whose content (digest) differs from the one the session holds there, and never
        inside an item, so two images with the same placeholder ids never share cache. A
        :meth:`Session.plan_prefill` of this session's is taken as it is (no second expansion).

        The session is always rewound, so a turn starts from a freshly seeded sampler whatever
        the session did before: the same ids and config give the same continuation."""
        session = self.session
        if isinstance(token_ids, PrefillPlan):
            return self._prefill_plan_reusing(token_ids)
        elements = list(token_ids)
        if not elements:
            raise InvalidArgumentError("prefill_reusing() needs at least one token id")
        if not any(isinstance(e, MediaItem) for e in elements):
            ids: list[int] = elements  # type: ignore[assignment]
            keep = session.reset_keep(min(self._reusable(ids, ()), len(ids) - 1))
            fed = self.prefill(ids[keep:])
            self._prompt_end = session.n_past
            return fed
        return self._prefill_plan_reusing(session.plan_prefill(elements))

    def _prefill_plan_reusing(self, plan: PrefillPlan) -> int:
        if not plan.ids:
            raise InvalidArgumentError("prefill_reusing() needs at least one token id")
        keep = self.session.reset_keep(min(self._reusable(plan.ids, plan.spans),
                                           len(plan.ids) - 1))
        fed = self.prefill(plan.tail(keep))
        self._prompt_end = self.session.n_past
        return fed

    def _reusable(self, ids: Sequence[int], spans: Sequence[MediaSpan]) -> int:
        """The prefix of ``ids`` (media ``spans``) the session holds, after the prompt cache
        (when set) saved an evicted conversation and restored a longer prefix."""
        if self.prompt_cache is not None:
            return self.prompt_cache.swap(self.session, ids, spans, self._prompt_end)
        return reusable(self.session.history, self.session.media, ids, spans)

    def chat_elements(self, messages: Sequence[Mapping[str, Any]], *,
                      add_generation_prompt: bool = True,
                      tools: Sequence[Mapping[str, Any]] | None = None,
                      media_limits: MediaLimits | None = None) -> list[int | MediaItem]:
        """:meth:`chat_tokens` for messages whose content may be OpenAI content parts: text,
        ``image_url`` (a base64 data URI; a local file only when ``media_limits.allow_files``)
        and ``input_audio`` (base64 wav / mp3 / flac). Each media part is decoded first
        (:class:`~eliza_backends.errors.MediaError` before any session call) and becomes a
        :class:`~eliza_backends.media.MediaItem` where the part was; a kind the session does
        not take is :class:`UnsupportedOperationError`, before rendering."""
        session = self.session
        template = self._template()
        from .prompt.chat import render_bounds
        from .prompt.chat_tokens import chat_elements

        with render_bounds(cancelled=lambda: session.cancelled):
            elements = chat_elements(session, template, messages,
                                     add_generation_prompt=add_generation_prompt, tools=tools,
                                     limits=media_limits or DEFAULT_LIMITS)
        return elements

    def prefill_messages(self, messages: Sequence[Mapping[str, Any]], *,
                         add_generation_prompt: bool = True,
                         media_limits: MediaLimits | None = None) -> int:
        """Render chat ``messages`` with the model's template (or ``config.chat_template``)
        and prefill them, reusing every token the session already holds: only the part of the
        rendered conversation that differs from :attr:`Session.history` is prefilled (see
        :meth:`prefill_reusing`). Returns the number of tokens prefilled.

        Pass the whole conversation each turn, including the assistant's earlier replies.
        Message content is never read as control tokens (see :meth:`chat_tokens`); it may be
        OpenAI content parts with images and audio (see :meth:`chat_elements`).
        """
        return self.prefill_reusing(self.chat_elements(
            messages, add_generation_prompt=add_generation_prompt, media_limits=media_limits))

    async def aprefill(self, prompt: str | Sequence[int], *,
                       add_special: bool | None = None) -> int:
        """:meth:`prefill` in a worker thread, so the event loop keeps running. Cancelling the
        awaiting task cancels the session (the prefill stops with :class:`CancelledError` on
        backends with ``capabilities.cancel_prefill``)."""
        return await self._in_thread(lambda: self.prefill(prompt, add_special=add_special))

    async def aprefill_messages(self, messages: Sequence[Mapping[str, Any]], *,
                                add_generation_prompt: bool = True) -> int:
        """:meth:`prefill_messages` in a worker thread (see :meth:`aprefill`)."""
        return await self._in_thread(lambda: self.prefill_messages(
            messages, add_generation_prompt=add_generation_prompt))

    async def _in_thread(self, call: Callable[[], T]) -> T:
        import asyncio  # only async callers pay for it

        try:
            return await asyncio.to_thread(call)
        except asyncio.CancelledError:
            self.session.cancel()
            raise

    def save_slot(self, path: str | os.PathLike[str]) -> None:
        """Save the sequence (KV state and token history) to a slot file, atomically (see
        :meth:`Session.save_slot`); :meth:`restore_slot` on a stream over the same model,
        backend and runtime version continues from it."""
        self.session.save_slot(path)

    def restore_slot(self, path: str | os.PathLike[str]) -> None:
        """Replace the sequence with a saved slot (see :meth:`Session.restore_slot`); a
        foreign or damaged file raises :class:`SlotError` and leaves the stream as it was.
        The next :meth:`prefill_messages` reuses the restored tokens."""
        self.session.restore_slot(path)

    def set_turn(self, *, max_tokens: int | None = None,
                 stop: str | Sequence[str] | None = None) -> None:
        """The budget and stop strings of the next turns (from the next prefill on; None: the
        config's), e.g. a request's own; see :meth:`Session.set_turn`."""
        self.session.set_turn(max_tokens=max_tokens, stop=stop)

    def next(self, max_tokens: int | None = None) -> Step:
        """One step: up to ``max_tokens`` tokens (default ``config.tokens_per_step``)."""
        t0 = time.perf_counter()
        step = self.session.next(max_tokens)
        t1 = time.perf_counter()
        m = self.metrics
        m.decode_seconds += t1 - t0
        m.decode_tokens += len(step.tokens)
        m.drafted += step.drafted
        m.accepted += step.accepted
        if self._turn_start is not None and step.tokens:
            m.time_to_first_token = t1 - self._turn_start
            self._turn_start = None
        return step

    def __iter__(self) -> Iterator[Step]:
        while True:
            step = self.next()
            yield step
            if step.final:
                return

    async def __aiter__(self) -> AsyncIterator[Step]:
        """Steps computed in a worker thread, so the event loop keeps running. Cancelling the
        awaiting task cancels the session and waits (without blocking the loop) for the worker
        to stop, so the session is idle again when the cancellation reaches the caller: a
        ``reset()`` right after it works."""
        import asyncio  # only async callers pay for it
        import contextvars

        loop = asyncio.get_running_loop()
        while True:
            finished: asyncio.Future[tuple[Step | None, BaseException | None]] = \
                loop.create_future()
            loop.run_in_executor(None, contextvars.copy_context().run, self._step_for,
                                 loop, finished)
            try:
                step, error = await asyncio.shield(finished)
            except asyncio.CancelledError:
                self.session.cancel()
                while not finished.done():  # the worker stops at its next safe point
                    with contextlib.suppress(asyncio.CancelledError):
                        await asyncio.shield(finished)
                raise
            if error is not None:
                raise error
            assert step is not None
            yield step
            if step.final:
                return

    def _step_for(self, loop: asyncio.AbstractEventLoop,
                  finished: asyncio.Future[tuple[Step | None, BaseException | None]]) -> None:
        """One step in the worker thread; the outcome resolves ``finished`` on the loop."""
        outcome: tuple[Step | None, BaseException | None]
        try:
            outcome = (self.next(), None)
        except BaseException as exc:
            outcome = (None, exc)

        def resolve() -> None:
            if not finished.done():
                finished.set_result(outcome)

        with contextlib.suppress(RuntimeError):  # the loop was closed meanwhile
            loop.call_soon_threadsafe(resolve)

    def text(self) -> str:
        """Run to the end of the stream and return all generated text."""
        return "".join(step.text for step in self)

    def begin_generation(self, owner: object) -> None:
        """Mark a completion (``owner``: its :class:`~eliza_backends.openai.generation.Generation`)
        as the one generating on this stream until :meth:`end_generation`. A second one while
        the first is open (a paused streamed completion, then another completion on the same
        stream, from any thread) raises :class:`SessionBusyError`: the two would interleave
        on one sequence and each would continue the other's text."""
        current = self._generation
        if current is not None and current is not owner:
            raise SessionBusyError(
                "another completion is still open on this Stream (a streamed completion that "
                "was not read to its end?): finish it or close() its iterator first, or give "
                "each completion its own stream")
        self._generation = owner

    def end_generation(self, owner: object | None = None) -> None:
        """The completion ``owner`` is over (None: whichever is open, e.g. abandoned)."""
        if owner is None or self._generation is owner:
            self._generation = None

    def check_generation(self, owner: object) -> None:
        """Raise :class:`SessionBusyError` unless ``owner`` is the open completion."""
        if self._generation is not owner:
            raise SessionBusyError("this completion is no longer the one open on its Stream "
                                   "(it was ended, or another one took the stream over)")

    def cancel(self) -> None:
        """Stop the running or next step with :class:`CancelledError` (any thread)."""
        self.session.cancel()

    def reset(self) -> None:
        """Clear the sequence (see :meth:`Session.reset`)."""
        self.session.reset()

    def reset_keep(self, n_keep: int) -> int:
        """Keep a prefix of the sequence (see :meth:`Session.reset_keep`)."""
        return self.session.reset_keep(n_keep)

    @property
    def closed(self) -> bool:
        """True once :meth:`close` ran."""
        return self._closed

    def close(self) -> None:
        """Close the session, and the context when the stream created it. Idempotent and safe
        from any thread: a call running in another thread is stopped and waited for (it
        raises :class:`SessionClosedError`)."""
        self._closed = True
        self.session.close()
        if self._owns_context:
            self.context.close()

    def __del__(self) -> None:
        # A stream nobody closed frees its session (and its own context's weights) when it is
        # collected, with a ResourceWarning, as an unclosed file does.
        try:
            if not self._closed:
                warnings.warn(f"unclosed {self!r}: close it (or use `with`) to free the model "
                              "when you are done", ResourceWarning, source=self, stacklevel=2)
                self.close()
        except Exception:  # nothing may escape a finalizer (at interpreter shutdown too)
            pass

    def __enter__(self) -> Stream:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def __repr__(self) -> str:
        return f"<Stream {self.backend} on {self.context.bundle_dir} n_past={self.session.n_past}>"


def check_option_keys(config: StreamConfig, registry: Registry) -> None:
    """Every key of ``config.options`` must name a backend (installed, or a known first-party
    one), so a misspelled key is an error instead of silently ignored options."""
    for key in config.options:
        if registry.get(key) is None and key.lower() not in KNOWN_BACKENDS:
            names = sorted({n for f in registry.factories() for n in f.names()})
            raise InvalidArgumentError(f"options[{key!r}] names no backend (known: "
                                       f"{', '.join(names) or 'none installed'})")


def check_capabilities(session: Session, config: StreamConfig, backend: str) -> None:
    """Refuse a config asking for what the session does not have (never a silent downgrade)."""
    caps = session.capabilities
    if caps.embedding is not None:  # decided by the plugin at load (a header walk costs more)
        raise UnsupportedOperationError(
            f"the bundle is an embedding model ({caps.embedding.describe()}, backend {backend}): "
            "it makes vectors, not text; use eliza_backends.embed or POST /v1/embeddings, or a "
            "generation model's bundle for text")
    if config.drafter not in caps.drafters:
        raise UnsupportedOperationError(
            f"backend {backend} does not support drafter={config.drafter!r} (it supports: "
            f"{', '.join(sorted(caps.drafters))}); choose another drafter or backend")
    if not caps.sampling and not config.greedy:
        raise UnsupportedOperationError(
            f"backend {backend} decodes greedily only; set temperature=0 or choose another "
            "backend")
    if set(config.media) - caps.media:
        raise UnsupportedOperationError(
            f"backend {backend} opened a session that takes "
            f"{', '.join(sorted(caps.media)) or 'no media'}, not all of "
            f"{', '.join(sorted(config.media))} (media=...): open it with parallel=1, or "
            "another backend")
    spec = OutputSpec.from_config(config)
    if spec.active:
        check_output_support(caps, config, spec, backend)


def check_media_support(backend: str, media: Mapping[str, str], config: StreamConfig) -> None:
    """Refuse, before any load, a backend that cannot take the media ``config.media`` asks
    for on this bundle (``media``: what :meth:`Factory.media` says it takes)."""
    missing = sorted(set(config.media) - set(media))
    if missing:
        raise UnsupportedOperationError(
            f"backend {backend} takes no {' or '.join(missing)} input on this bundle (it takes "
            f"{', '.join(sorted(media)) or 'text only'}): use a bundle with the model's media "
            "encoder (a projector / mmproj file) and a backend that runs it; explain() says "
            "what each backend takes")


def open_stream(
    bundle: str | os.PathLike[str] | InferenceContext,
    config: StreamConfig | Mapping[str, Any] | None = None,
    *,
    backend: str | None = None,
    environ: Mapping[str, str] | None = None,
    registry: Registry | None = None,
    **overrides: Unpack[StreamOverrides],
) -> Stream:
    """Select a backend for ``bundle`` and open a stream on it.

    ``bundle`` is a bundle directory, a single model artifact (a ``.gguf`` file, an MLX
    folder, ...: an implicit one-artifact bundle), or an :class:`InferenceContext` (to share
    loaded weights between streams). ``config`` and keyword ``overrides`` (the
    :class:`StreamConfig` fields, see :class:`~eliza_backends.config.StreamOverrides`) build
    the :class:`StreamConfig`. ``backend`` is a hard request like ``ELIZA_LLM_BACKEND`` (and
    wins over it).
    """
    cfg = StreamConfig.build(config, **overrides)
    owns = not isinstance(bundle, InferenceContext)
    context = InferenceContext(bundle) if not isinstance(bundle, InferenceContext) else bundle
    try:
        context.check_batch_size(cfg.batch_size)
        # a concurrent context.close() waits for this open, the selection included (a closed
        # context is SessionClosedError, not a selection error about its removed folder)
        with context.opening():
            factory = select(context.bundle_dir, backend=backend, environ=environ,
                             registry=registry)
            check_option_keys(cfg, registry or default_registry())
            factory.parse_options(cfg)  # unknown options fail before any load
            if cfg.media:  # the probe (a header read) only when the stream asks for media
                check_media_support(factory.name, safe_media(factory, context.bundle_dir),
                                    cfg)
            session = factory.open(context, cfg)
            if not isinstance(session, Session):
                raise PluginError(f"backend {factory.name} returned {session!r} from open(), "
                                  "not a Session: a bug in its plugin")
            try:
                check_capabilities(session, cfg, factory.name)
            except BaseException:
                session.close()
                raise
    except BaseException:
        if owns:
            context.close()
        raise
    return Stream(session, backend=factory.name, context=context, owns_context=owns)


async def aopen_stream(
    bundle: str | os.PathLike[str] | InferenceContext,
    config: StreamConfig | Mapping[str, Any] | None = None,
    *,
    backend: str | None = None,
    environ: Mapping[str, str] | None = None,
    registry: Registry | None = None,
    **overrides: Unpack[StreamOverrides],
) -> Stream:
    """:func:`open_stream` in a worker thread, so loading the model does not block the event
    loop. If the awaiting task is cancelled, the load still finishes in its thread and the
    stream it opened is closed."""
    import asyncio  # only async callers pay for it

    task = asyncio.ensure_future(asyncio.to_thread(
        lambda: open_stream(bundle, config, backend=backend, environ=environ,
                            registry=registry, **overrides)))
    try:
        return await asyncio.shield(task)
    except asyncio.CancelledError:
        task.add_done_callback(_close_opened)
        raise


def _close_opened(task: asyncio.Future[Stream]) -> None:
    """Close the stream a cancelled :func:`aopen_stream` opened after all."""
    if not task.cancelled() and task.exception() is None:
        task.result().close()


def generate_chat(bundle: str | os.PathLike[str] | InferenceContext,
                  messages: Sequence[Mapping[str, Any]], *, backend: str | None = None,
                  **config: Unpack[StreamOverrides]) -> str:
    """Open a stream, prefill chat ``messages`` with the model's template, return the reply."""
    with open_stream(bundle, backend=backend, **config) as stream:
        stream.prefill_messages(messages)
        return stream.text()


def generate(bundle: str | os.PathLike[str] | InferenceContext, prompt: str | Sequence[int], *,
             backend: str | None = None, **config: Unpack[StreamOverrides]) -> str:
    """Open a stream, prefill ``prompt``, return the generated text, close the stream."""
    with open_stream(bundle, backend=backend, **config) as stream:
        stream.prefill(prompt)
        return stream.text()


__all__ = ["Stream", "StreamMetrics", "aopen_stream", "check_capabilities", "generate",
           "generate_chat", "open_stream"]
