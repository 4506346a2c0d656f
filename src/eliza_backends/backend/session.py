"""The session of the backend contract: :class:`Session`, the one class a plugin subclasses
(the seed's ``LlmBackendSession``; its values are in :mod:`.types`, the factory that opens it
in :mod:`.factory`).

A plugin fills in a handful of underscore hooks that translate to its runtime (a forward pass,
a cache trim, a sampler); the public methods and the helpers here do everything the backends
share, so it is done once and the same way:

* argument checks before anything reaches native code (token ids against the vocabulary,
  the context window, call order, closed sessions);
* single-consumer enforcement, cancellation and Ctrl-C (:class:`~.guard.SessionGuard`);
* the turn: the budget, end-of-generation tokens, stop strings, UTF-8-safe text, the logits
  guide and logprobs (:class:`~.turn.Turn`);
* speculation: the drafter, the draft policy and the speculative loop
  (:class:`~.speculation.Speculation`, :func:`eliza_backends.runtime.speculative.speculate`);
* slot files (atomic, fingerprinted; see :mod:`eliza_backends.runtime.slots`);
* repair after a failed or interrupted call (history and KV cache back in step).

Facts about the loaded model are data, a :class:`~eliza_backends.backend.model_info.ModelInfo`
handed to :class:`Session`, not properties each backend forwards.

Threads: every method except :meth:`Session.cancel` and :meth:`Session.close` belongs to the
one consumer thread that drives the session. ``cancel()`` is safe from anywhere; ``close()``
from another thread cancels the running call and waits for it to return.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, final

from ..config import StreamConfig
from ..errors import ContextFullError, InvalidArgumentError
from ..runtime.draft_policy import DraftPolicy
from ..runtime.speculative import Drafter, Verify
from ..runtime.text import AssemblerState
from ..structured.logits import LogitsGuide, OutputSpec
from .guard import SessionGuard
from .hooks import SessionHooks
from .media_seq import PrefillPlan, SessionMedia
from .model_info import ModelInfo
from .repair import Repair
from .slot_state import SlotSnapshot, SlotState
from .speculation import Speculation
from .turn import Turn, new_guide, turn_settings
from .types import (
    Decoded,
    MediaSpan,
    Step,
    check_embedding_batch,
    check_output_support,
    check_text,
    check_tokens,
)

if TYPE_CHECKING:
    from ..media import MediaItem
    from .context import InferenceContext


class Session(SessionHooks):
    """One active generation on one backend (the seed's ``LlmBackendSession``).

    Lifecycle: ``prefill(ids)`` then ``next()`` until ``step.final``; ``prefill`` again to
    continue (chat turns), ``reset()`` / ``reset_keep(n)`` to rewind, ``close()`` when done;
    an embedding model's session (``capabilities.embedding``) is asked ``embed(batch)`` only.
    The session owns its KV cache and its drafter; the :class:`InferenceContext` owns the
    weights.

    For backends, three kinds of members, told apart by name and by rule:

    * **hooks** (``_prefill``, ``_decode``, ``_reset``, ``_truncate``, ``_token_bytes``,
      ``_tokenize``, ``_detokenize``, ``_save_state``, ``_restore_state``, ``_embed``,
      ``_close``, and the ``capabilities`` and ``scheduler`` properties): a backend
      implements them and never calls them; the base class calls each with the consumer
      lock held, after validating the arguments;
    * **helpers** (``_raise_if_cancelled``, ``_cancel_requested``, ``_sequence``,
      ``_drafter``, ``_guide``, ``_stop_tokens``, ``_ends_generation``, ``_stream_ends_with``,
      ``_turn_max_tokens``, ``_speculate``): a backend
      calls them from inside its hooks and never overrides them (``@final``);
    * **internals** (double underscore, name-mangled): the base class's own state (history,
      and its collaborators: the guard with the lock and cancel flag, the turn with the
      budget, the speculation with the drafter); out of a backend's reach.
    """

    def __init__(self, config: StreamConfig, context: InferenceContext | None,
                 info: ModelInfo, *, context_size: int | None = None,
                 drafter: Drafter | None = None) -> None:
        """``info``: the model's facts (shared by the sessions of one load). ``context_size``:
        the KV window the runtime really allocated (default ``config.context_size``).
        ``drafter``: the speculative drafter (from :meth:`Factory.make_drafter`); the session
        owns it from here: it rewinds it with the sequence and closes it in :meth:`close`.

        Call this last in a subclass's ``__init__``: it registers the session with the
        context, so everything :meth:`_close` uses must exist by then."""
        self.config = config
        self.context = context
        self.__info = info
        self.__eog = info.eog_token_ids
        #: Helper: the ids that end decoding (the end-of-generation ids; none with ignore_eos).
        self._stop_tokens: frozenset[int] = frozenset() if config.ignore_eos else self.__eog
        self.__vocab = info.vocab_size
        self.__n_ctx = config.context_size if context_size is None else context_size
        self.__history: list[int] = []
        self.__media = SessionMedia(self, self.__vocab)
        # the three collaborators (internals, like the rest of the base class's state)
        self.__guard = guard = SessionGuard(self.backend_name)
        self.__cancel = guard.cancelled  # the flags _raise_if_cancelled reads per token
        self.__interrupt = guard.interrupt
        #: Helper: ``_cancel_probe(None)`` is :meth:`_cancel_requested` as a C-implemented
        #: callable (set membership) for native abort callbacks: no Python code runs inside
        #: it, so nothing (a signal handler, a trace function) can raise in the callback,
        #: where ctypes would print the exception and lose it.
        self._cancel_probe: Callable[[object], bool] = guard.probe
        self.__turn = Turn(config, self.__eog)
        spec = OutputSpec.from_config(config)
        self.__output: OutputSpec | None = spec if spec.active else None
        self.__spec = Speculation(config, drafter)
        self.__repair = Repair(self.__history, self.__media, self.__turn, guard, self.__spec, self)
        self.__slots = SlotState(self.__history, self.__media, info, self.__n_ctx,
                                 self.__repair, self, self.__after_rewind)
        if context is not None:
            context.track(self)

    # ---------------------------------------------------------------- what the model is

    @property
    def model_info(self) -> ModelInfo:
        """The model's facts (see :class:`~eliza_backends.backend.model_info.ModelInfo`)."""
        return self.__info

    @property
    def vocab_size(self) -> int:
        """Number of token ids the model accepts (valid ids are 0..vocab_size-1)."""
        return self.__vocab

    @property
    def context_size(self) -> int:
        """The KV context window actually allocated, in tokens."""
        return self.__n_ctx

    @property
    def eog_token_ids(self) -> frozenset[int]:
        """Token ids that end generation (EOS, end-of-turn ...)."""
        return self.__eog

    @property
    def bos_token_id(self) -> int | None:
        """The token ``tokenize(..., add_special=True)`` prepends, if any."""
        return self.__info.bos_token_id

    @property
    def chat_template(self) -> str | None:
        """The model's own jinja chat template, if its artifact ships one."""
        return self.__info.chat_template

    @property
    def template_tokens(self) -> dict[str, str]:
        """Special-token texts a chat template may use (``bos_token``, ``eos_token``)."""
        return dict(self.__info.template_tokens)

    # ---------------------------------------------------------------- public API

    @property
    def history(self) -> tuple[int, ...]:
        """Every token in the session's sequence so far: prompts and generated tokens."""
        return tuple(self.__history)

    @property
    def media(self) -> tuple[MediaSpan, ...]:
        """Each media item in the sequence: its extent in :attr:`history`, its digest."""
        return tuple(self.__media.spans)

    @property
    def n_past(self) -> int:
        """Number of tokens in the sequence (``len(history)``)."""
        return len(self.__history)

    @property
    def closed(self) -> bool:
        """True once :meth:`close` ran."""
        return self.__guard.closed

    @property
    def busy(self) -> bool:
        """True while a consumer call (prefill, next, reset ...) is running."""
        return self.__guard.lock.locked()

    @final
    def prefill(self, token_ids: Sequence[int | MediaItem] | PrefillPlan) -> None:
        """Feed prompt tokens. Raises :class:`InvalidArgumentError` for empty, non-integer or
        out-of-vocabulary ids, :class:`ContextFullError` when they do not fit.

        ``token_ids`` may hold :class:`~eliza_backends.media.MediaItem` s of the kinds in
        ``capabilities.media``, then ending with an id; or be a :meth:`plan_prefill` of it.

        A prefill that fails (an exception from the runtime, a ``KeyboardInterrupt``: see
        :mod:`eliza_backends.backend.interrupts`) leaves :attr:`history` and the KV cache as they
        were before it; prefill again before ``next()``."""
        ids, plan = self.__media.parse(token_ids)
        if plan is None and not ids:
            raise InvalidArgumentError("prefill() needs at least one token id")
        guard, turn = self.__guard, self.__turn
        guard.begin("prefill", guarded=True)
        history = self.__history
        n = -1  # the history length to go back to if this call fails (-1: nothing changed)
        try:
            if plan is not None:
                ids = (plan := self.__media.plan(plan)).ids
            room = self.__n_ctx - len(history)
            if len(ids) > room:
                raise ContextFullError(
                    f"prefill of {len(ids)} tokens does not fit: {len(history)} of "
                    f"{self.__n_ctx} context positions are used ({room} free); raise "
                    "context_size, or reset()/reset_keep() first")
            n = len(history)
            guide = None if self.__output is None else new_guide(
                self.__output, self.__info, self._token_bytes, self._tokenize)
            turn.ready = False
            turn.guide = guide
            turn.apply()
            if plan is None:
                self._prefill(ids)
            else:
                self.__media.feed(plan, n)
            history.extend(ids)
            if guard.interrupting:  # Ctrl-C after the last safe point: undone too
                self.__repair.recover("prefill", None, n, None)
                n = -1
            else:
                turn.start()
            guard.deliver()  # (delivers a deferred Ctrl-C: KeyboardInterrupt)
        except BaseException as exc:
            if n >= 0:
                self.__repair.recover("prefill", exc, n, None)
            raise
        finally:
            guard.end()

    @final
    def plan_prefill(self, elements: Sequence[int | MediaItem]) -> PrefillPlan:
        """Check ``elements`` (see :meth:`prefill`) and expand each media item as the backend
        will (nothing reaches the KV cache): the plan's ``ids`` are what :attr:`history` would
        gain, its ``spans`` where the items sit. :meth:`prefill` takes it, or its ``tail``."""
        self.__guard.begin("plan_prefill", guarded=True)
        try:
            return self.__media.plan(elements)
        finally:
            self.__guard.end()

    @final
    def next(self, max_tokens: int | None = None) -> Step:
        """Generate up to ``max_tokens`` tokens (default ``config.tokens_per_step``, or
        ``draft_length + 1`` when a drafter is on and ``tokens_per_step`` is 1; a speculative
        step runs draft/verify rounds until it has that many tokens or the stream ends, except
        that a default one ends early rather than cut a round's drafts to fit).

        Returns a final :class:`Step` when an end-of-generation token, a stop string, the
        ``config.max_tokens`` budget or the context window ends the stream; calling again after
        that returns an empty final step until the next prefill.

        A step that fails (an exception from the runtime, a ``KeyboardInterrupt``) has no
        effect: :attr:`history` and the KV cache stay the sequence of the steps returned so
        far, and ``next()`` continues from there. Only :meth:`cancel` makes the session refuse
        calls until ``reset()`` / ``reset_keep()``.
        """
        if max_tokens is not None and (isinstance(max_tokens, bool) or not isinstance(
                max_tokens, int) or max_tokens < 1):
            raise InvalidArgumentError(f"max_tokens must be a positive int, got {max_tokens!r}")
        guard, turn = self.__guard, self.__turn
        guard.begin("next", guarded=True)  # the hot path: no context-manager machinery
        history = self.__history
        n = -1  # the history length to go back to if this step fails (-1: nothing changed)
        before: tuple[int, AssemblerState] | None = None
        try:
            if turn.finished:
                step = Step((), "", final=True, finish_reason=None)
            elif not turn.ready:
                raise InvalidArgumentError("call prefill() before next(): there is nothing to "
                                           "continue from")
            else:
                spec = self.__spec  # (the hot path: plain attributes, no calls)
                want = max_tokens or spec.default_step
                budget = turn.max_tokens - turn.generated
                room = self.__n_ctx - len(history)
                if room <= 0:
                    step = turn.finish((), "", 0, 0, "context")
                else:
                    n = len(history)
                    before = (turn.generated, turn.assembler.state())  # (for turn.restore)
                    spec.whole_rounds = max_tokens is None and spec.steps  # (a default step)
                    out = self._decode(min(want, budget, room))
                    step = turn.assemble(out, budget, room, history, self._token_bytes)
                    if guard.interrupting:  # Ctrl-C after the last safe point: the caller
                        self.__repair.recover("next", None, n, before)  # never sees this step
                        n = -1
            guard.deliver()  # (delivers a deferred Ctrl-C: KeyboardInterrupt)
            return step
        except BaseException as exc:
            if n >= 0:
                self.__repair.recover("next", exc, n, before)
            raise
        finally:
            guard.end()

    @final
    def cancel(self) -> None:
        """Ask the running (or next) prefill/next to stop with :class:`CancelledError`.

        Safe from any thread. The session keeps raising it until ``reset()`` or
        ``reset_keep()``; the tokens in :attr:`history` stay valid for ``reset_keep``.
        """
        self.__guard.cancel()

    @property
    def cancelled(self) -> bool:
        """True between :meth:`cancel` and the next reset."""
        return self.__cancel.is_set()

    @final
    def reset(self) -> None:
        """Forget everything: KV cache, history, sampler state, a pending cancel.

        Right after a cancel (``cancel()``, a cancelled ``async for``) it waits for the call
        still running in another thread to stop at its next safe point."""
        self.__guard.begin("reset", allow_cancelled=True, guarded=True)
        try:
            try:
                self._reset()
            except BaseException as exc:
                self.__repair.broken("reset", exc)
                raise
            self.__after_rewind(0)
        finally:
            self.__guard.end()

    @final
    def reset_keep(self, n_keep: int) -> int:
        """Keep the first ``n_keep`` tokens of the sequence, drop the rest; returns how many
        were kept: ``min(n_keep, n_past)``, or 0 when the backend cannot keep a prefix (it did a
        full reset; less than ``n_keep`` when that would cut a media item, which is kept whole
        or not at all). Clears a pending cancel (waiting, like :meth:`reset`, for a cancelled call
        in another thread). Prefill again before ``next()``."""
        if isinstance(n_keep, bool) or not isinstance(n_keep, int) or n_keep < 0:
            raise InvalidArgumentError(f"n_keep must be an int >= 0, got {n_keep!r}")
        self.__guard.begin("reset_keep", allow_cancelled=True, guarded=True)
        try:
            n = self.__media.boundary(min(n_keep, len(self.__history)))
            try:
                self.__spec.truncate(n)
                if n == 0 or not self._truncate(n):
                    self._reset()
                    n = 0
            except BaseException as exc:
                self.__repair.broken("reset_keep", exc)
                raise
            self.__after_rewind(n)
            return n
        finally:
            self.__guard.end()

    def __after_rewind(self, n: int) -> None:
        del self.__history[n:]
        self.__media.truncate(n)
        self.__spec.truncate(n)
        self.__guard.clear_cancel()
        self.__turn.clear()

    @final
    def set_output(self, spec: OutputSpec | None) -> None:
        """What the tokens generated after each following prefill must satisfy and report (a
        constraint, logprobs; see :class:`~eliza_backends.structured.logits.OutputSpec`); None goes
        back to the config's (``response_format`` / ``json_schema`` / ``regex`` / ``grammar``,
        ``logprobs`` / ``top_logprobs``). It takes effect at the next prefill, and every
        prefill starts the constraint afresh. Raises :class:`UnsupportedOperationError` when
        the session cannot (``capabilities.logits`` False, or a drafter is on)."""
        if spec is None:
            spec = OutputSpec.from_config(self.config)
        if not isinstance(spec, OutputSpec):
            raise InvalidArgumentError(f"set_output() takes an OutputSpec or None, got "
                                       f"{type(spec).__name__}")
        if spec.active:
            check_output_support(self.capabilities, self.config, spec, self.backend_name)
        with self.__guard.call("set_output", allow_cancelled=True):
            self.__output = spec if spec.active else None

    @final
    def set_turn(self, *, max_tokens: int | None = None,
                 stop: str | Sequence[str] | None = None) -> None:
        """The budget and stop strings of the turns after each following prefill, as
        :meth:`set_output` sets their constraint; None goes back to the config's
        (``max_tokens``, ``stop``). OpenAI's per-request ``max_tokens`` / ``stop``."""
        settings = turn_settings(max_tokens, stop)
        with self.__guard.call("set_turn", allow_cancelled=True):
            self.__turn.settings = settings

    @final
    def save_slot(self, path: str | os.PathLike[str] | None = None) -> SlotSnapshot:
        """Save the sequence state to ``path`` (atomically; the previous file survives a crash)
        and return it; without ``path``, only return it (what a prompt cache keeps in memory
        for :meth:`restore_slot` here or on a session of the same model and context).
        Raises :class:`UnsupportedOperationError` when ``capabilities.slots`` is False."""
        self.__slots.check("save")
        self.__guard.begin("save_slot", guarded=True)
        try:
            return self.__slots.save(path)
        finally:
            self.__guard.end()

    @final
    def restore_slot(self, source: str | os.PathLike[str] | SlotSnapshot) -> None:
        """Replace the session's state with a slot (a file, or a :meth:`save_slot` snapshot)
        saved by the same backend, model and runtime version; ``next()`` then continues exactly
        as the saved session would have (greedy).

        A foreign, truncated or corrupted file raises :class:`SlotError` and leaves the session
        as it was; a state the runtime itself refuses (another KV layout) is :class:`SlotError`
        too, and leaves the session empty."""
        self.__slots.check("restore")
        self.__guard.begin("restore_slot", allow_cancelled=True, guarded=True)
        try:
            self.__slots.restore(source)
            self.__turn.ready = True
        finally:
            self.__guard.end()

    @final
    def tokenize(self, text: str, *, add_special: bool = True,
                 parse_special: bool = True) -> list[int]:
        """Token ids of ``text`` in the model's vocabulary; ``add_special`` prepends BOS where
        the model uses one; ``parse_special`` turns control-token texts (``"<|end|>"``) into
        their ids (turn it off for text you did not write: chat content, documents).

        A consumer call like the others: ``close()`` from another thread waits for it."""
        check_text(text)
        with self.__guard.call("tokenize", allow_cancelled=True):
            return self._tokenize(text, add_special, parse_special)

    @final
    def embed(self, inputs: Sequence[Sequence[int]]) -> list[list[float]]:
        """One L2-normalised vector per input (token ids), in input order, from an embedding
        session; the inputs are checked first (:func:`~.types.check_embedding_batch`)."""
        batch = check_embedding_batch(self.capabilities.embedding, self.backend_name,
                                      self.__vocab, self.__n_ctx, inputs)
        with self.__guard.call("embed"):
            return self._embed(batch)

    @final
    def detokenize(self, token_ids: Sequence[int]) -> str:
        """Text of ``token_ids`` (invalid UTF-8 becomes U+FFFD)."""
        ids = check_tokens(self.__vocab, token_ids, what="detokenize")
        with self.__guard.call("detokenize", allow_cancelled=True):
            return self._detokenize(ids)

    @final
    def close(self) -> None:
        """Free the session (and its drafter). Idempotent and safe from any thread: it cancels
        the running call, waits for it to return (that call raises
        :class:`SessionClosedError` at its next safe point, or inside a native call that polls
        the cancel probe; never :class:`SessionBusyError`), then frees."""
        self.__guard.close(self.__free)

    def __free(self) -> None:
        """Close the drafter, then the backend's resources, then leave the context."""
        try:
            self.__spec.close()
        finally:
            try:
                self._close()
            finally:
                if self.context is not None:
                    self.context.untrack(self)

    def __enter__(self) -> Session:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # ---------------------------------------------------------------- helpers for backends

    @final
    def _raise_if_cancelled(self) -> None:
        """Raise :class:`CancelledError` if :meth:`cancel` was called, or a Ctrl-C arrived
        (between chunks/tokens); :class:`SessionClosedError` once :meth:`close` started."""
        if self.__cancel.is_set() or self.__interrupt.is_set():
            self.__guard.raise_if_cancelled()

    @final
    def _cancel_requested(self) -> bool:
        """The bare flag :meth:`_raise_if_cancelled` checks, for hot loops and native abort
        callbacks (True after :meth:`cancel` or a Ctrl-C)."""
        return self.__cancel.is_set() or self.__interrupt.is_set()

    @property
    @final
    def _sequence(self) -> Sequence[int]:
        """The sequence so far, live (not a copy): read it inside hooks, never change it."""
        return self.__history

    @property
    @final
    def _drafter(self) -> Drafter | None:
        """The session's drafter (None without one)."""
        return self.__spec.drafter

    @property
    @final
    def _guide(self) -> LogitsGuide | None:
        """This turn's logits hook: call ``process(row)`` on the next-token logits before
        sampling and ``accept(token)`` after (None: the turn asks for nothing; see
        :mod:`eliza_backends.structured.logits`). Only backends with ``capabilities.logits`` see
        one."""
        return self.__turn.guide

    @final
    def _ends_generation(self, token: int) -> bool:
        """True when ``token`` ends the stream: an end-of-generation id, and no ignore_eos."""
        return token in self._stop_tokens

    @property
    @final
    def _turn_max_tokens(self) -> int:
        """This turn's budget (``config.max_tokens`` unless :meth:`set_turn` said otherwise;
        set when a prefill starts)."""
        return self.__turn.max_tokens

    @final
    def _stream_ends_with(self, max_tokens: int) -> bool:
        """True when a ``_decode(max_tokens)`` step surely ends the stream (the budget or the
        context window), so its last token needs no forward pass."""
        return max_tokens >= self.__turn.budget or \
            len(self.__history) + max_tokens >= self.__n_ctx

    @final
    def _speculate(self, max_tokens: int, verify: Verify, *, draft_length: int | None = None,
                   after: Sequence[int] = ()) -> Decoded:
        """Speculative rounds through :func:`~eliza_backends.runtime.speculative.speculate` with the
        session's drafter until ``max_tokens`` tokens or an end token: the core drafts, the
        backend's ``verify`` checks. ``after``: tokens this step already produced (not yet in
        the sequence); they lead the result. ``draft_length`` caps ``config.draft_length``."""
        return self.__spec.run(self.__history, max_tokens, verify, draft_length=draft_length,
                               after=after, ends_generation=self._ends_generation,
                               raise_if_cancelled=self._raise_if_cancelled,
                               batch_cost=self.__batch_cost)

    @property
    @final
    def draft_policy(self) -> DraftPolicy | None:
        """The draft policy steering this session's speculative rounds (None: none yet, or
        ``draft_policy="fixed"``, or a backend that cannot measure its verify cost)."""
        return self.__spec.policy

    def __batch_cost(self, n: int) -> list[float] | None:
        """The batch cost curve up to ``n`` tokens, measured once per loaded model (cached on
        the inference context)."""
        key = ("batch-cost", self.backend_name, str(self.__info.artifact), self.config.threads, n)
        if self.context is not None:
            return self.context.shared(key, lambda: self._batch_cost(n))
        return self._batch_cost(n)


__all__ = ["Session"]
