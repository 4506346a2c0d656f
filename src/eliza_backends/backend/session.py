"""The backend contract: :class:`Factory` and :class:`Session`.

These mirror the seed's ``LlmBackendFactory`` / ``LlmBackendSession`` one to one. A plugin
subclasses both and fills in a handful of underscore hooks that translate to its runtime (a
forward pass, a cache trim, a sampler); the public methods and the helpers here do everything
the backends share, so it is done once and the same way:

* argument checks before anything reaches native code (token ids against the vocabulary,
  the context window, call order, closed sessions);
* single-consumer enforcement (a second thread gets :class:`SessionBusyError`);
* cancellation (``cancel()`` from any thread; sticky until ``reset()`` / ``reset_keep()``);
* the generation budget, end-of-generation tokens, stop strings and UTF-8-safe text;
* slot files (atomic, fingerprinted; see :mod:`eliza_backends.runtime.slots`);
* the speculative loop (draft, verify, accept; :func:`eliza_backends.runtime.speculative.speculate`)
  and the drafter's lifecycle (built by :meth:`Factory.make_drafter`, rewound with the
  sequence, closed with the session).

Facts about the loaded model are data, a :class:`~eliza_backends.backend.model_info.ModelInfo`
handed to :class:`Session`, not properties each backend forwards.

Threads: every method except :meth:`Session.cancel` and :meth:`Session.close` belongs to the
one consumer thread that drives the session. ``cancel()`` is safe from anywhere; ``close()``
from another thread cancels the running call and waits for it to return.
"""

from __future__ import annotations

import operator
import os
import threading
from abc import ABC, abstractmethod
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, ClassVar, Literal, final

from pydantic import BaseModel, ValidationError

from ..bundle import artifact_format, find_artifacts
from ..config import StreamConfig, describe_validation_error
from ..errors import (
    BundleError,
    CancelledError,
    ConstraintError,
    ContextFullError,
    InvalidArgumentError,
    SessionBusyError,
    SessionClosedError,
    SlotError,
    Status,
    UnsupportedOperationError,
)
from ..runtime.draft_policy import DraftPolicy
from ..runtime.slots import read_slot, write_slot
from ..runtime.speculative import Drafter, NgramDrafter, Verify, speculate
from ..runtime.text import AssemblerState, TextAssembler
from ..structured.constraint import model_vocabulary
from ..structured.logits import LogitsGuide, OutputSpec
from ..structured.logprobs import TokenLogprob, TopLogprob
from .interrupts import SigintDeferral
from .model_info import ModelInfo

if TYPE_CHECKING:
    from .context import InferenceContext

FinishReason = Literal["eos", "stop", "length", "context"]


@dataclass(frozen=True, slots=True)
class Step:
    """What one :meth:`Session.next` call produced.

    ``tokens``: the token ids generated in this step (up to the one that ended the stream).
    ``text``: their text, never splitting a UTF-8 character, never containing a stop string.
    ``drafted`` / ``accepted``: speculative tokens proposed / accepted in this step (0 without
    a drafter). ``final``: the stream ended; ``finish_reason`` says why. ``logprobs``: one
    :class:`~eliza_backends.structured.logprobs.TokenLogprob` per token when the turn asked for
    logprobs (``StreamConfig.logprobs`` / ``top_logprobs``, or :meth:`Session.set_output`), else
    None.
    """

    tokens: tuple[int, ...]
    text: str
    drafted: int = 0
    accepted: int = 0
    final: bool = False
    finish_reason: FinishReason | None = None
    logprobs: tuple[TokenLogprob, ...] | None = None


@dataclass(frozen=True, slots=True)
class Decoded:
    """What a backend's ``_decode`` hook returns: generated ids and speculative counts.

    ``finish``: the runtime ended the stream itself without handing back a token that says so
    (a text-level runtime stops at an end token it does not return, or at its own output
    budget): the stream ends after ``tokens`` with this reason. Never invent a token for it.
    """

    tokens: list[int]
    drafted: int = 0
    accepted: int = 0
    finish: FinishReason | None = None


@dataclass(frozen=True)
class Capabilities:
    """What a session really supports. The conformance kit checks exactly these.

    ``token_input``: prefill takes any in-vocabulary ids (False: the runtime takes text, so ids
    must round-trip through the tokenizer). ``prefix_reuse``: ``reset_keep`` keeps KV cache
    (False: it always falls back to a full reset). ``slots``: save/restore. ``cancel_prefill``:
    ``cancel()`` interrupts a running prefill (False: only between calls/chunks).
    ``drafters``: the drafter kinds ``StreamConfig.drafter`` may name. ``sampling``: honours
    temperature/top-k/top-p/min-p/seed (False: greedy only). ``logits``: the backend runs the
    core's logits hook (``Session._guide``) at every sampling point, so output constraints and
    logprobs work (False: they are refused). ``ignore_eos``: honours ``config.ignore_eos``
    (False: the runtime ends at its stop tokens itself, so opening with ``ignore_eos=True``
    raises :class:`UnsupportedOperationError`).
    """

    token_input: bool = True
    prefix_reuse: bool = True
    slots: bool = False
    cancel_prefill: bool = True
    sampling: bool = True
    ignore_eos: bool = True
    drafters: frozenset[str] = frozenset({"none"})
    logits: bool = False


@dataclass(frozen=True)
class Availability:
    """Whether a backend can run on this host. Truthy when it can; ``reason`` says why not.

    ``detail`` is extra, backend-defined facts for ``explain()`` (e.g. the accelerator rung).
    ``installed``: False when what is missing is the runtime package itself (the selector
    then says "not installed", ``ERR_BACKEND_NOT_INSTALLED``, rather than "not available").
    """

    ok: bool
    reason: str = ""
    detail: dict[str, str] = field(default_factory=dict)
    installed: bool = True

    def __bool__(self) -> bool:
        return self.ok

    @classmethod
    def yes(cls, **detail: str) -> Availability:
        """Available."""
        return cls(True, "", dict(detail))

    @classmethod
    def no(cls, reason: str, **detail: str) -> Availability:
        """Unavailable, with the human reason."""
        return cls(False, reason, dict(detail))

    @classmethod
    def missing(cls, reason: str, **detail: str) -> Availability:
        """Unavailable because the runtime package is not installed (``reason``: what to
        pip install)."""
        return cls(False, reason, dict(detail), installed=False)


class Session(ABC):
    """One active generation on one backend (the seed's ``LlmBackendSession``).

    Lifecycle: ``prefill(ids)`` then ``next()`` until ``step.final``; ``prefill`` again to
    continue (chat turns), ``reset()`` / ``reset_keep(n)`` to rewind, ``close()`` when done.
    The session owns its KV cache and its drafter; the :class:`InferenceContext` owns the
    weights.

    For backends, three kinds of members, told apart by name and by rule:

    * **hooks** (``_prefill``, ``_decode``, ``_reset``, ``_truncate``, ``_token_bytes``,
      ``_tokenize``, ``_detokenize``, ``_save_state``, ``_restore_state``, ``_close``, and
      the ``capabilities`` property): a backend implements them and never calls them; the
      base class calls each with the consumer lock held, after validating the arguments;
    * **helpers** (``_raise_if_cancelled``, ``_cancel_requested``, ``_sequence``,
      ``_drafter``, ``_guide``, ``_stop_tokens``, ``_ends_generation``, ``_stream_ends_with``,
      ``_speculate``): a backend
      calls them from inside its hooks and never overrides them (``@final``);
    * **internals** (double underscore, name-mangled): the base class's own state (history,
      lock, cancel flag, budget); out of a backend's reach.
    """

    #: The factory name, for messages and slot headers. Set by subclasses.
    backend_name: ClassVar[str] = "?"

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
        self.__drafter = drafter
        self.__policy: DraftPolicy | None = None
        self.__policy_made = False
        self.__history: list[int] = []
        self.__cancel = threading.Event()
        # why the session is cancelled, when it was not cancel(): an interrupted call that left
        # state only a reset repairs
        self.__cancel_reason: str | None = None
        # set by a deferred SIGINT: the running call stops at its next safe point
        self.__interrupt = threading.Event()
        # holds None while cancel or interrupt is set: its __contains__ is the C-level probe
        # native abort callbacks poll (see _cancel_probe)
        self.__stop: set[None] = set()
        #: Helper: ``_cancel_probe(None)`` is :meth:`_cancel_requested` as a C-implemented
        #: callable (set membership) for native abort callbacks: no Python code runs inside
        #: it, so nothing (a signal handler, a trace function) can raise in the callback,
        #: where ctypes would print the exception and lose it.
        self._cancel_probe: Callable[[object], bool] = self.__stop.__contains__
        self.__deferral = SigintDeferral(self.__on_sigint)
        self.__lock = threading.Lock()
        self.__owner: int | None = None  # the thread inside a call (for re-entrant calls)
        self.__closing = False
        self.__closed = False
        self.__ready = False  # True when the last prefill left logits to sample from
        self.__finished = False
        self.__generated = 0
        self.__assembler = TextAssembler(config.stop)
        spec = OutputSpec.from_config(config)
        self.__output: OutputSpec | None = spec if spec.active else None
        self.__guide: LogitsGuide | None = None  # this turn's, built at prefill
        # with a drafter, a default step is a round's worth (draft_length + 1 tokens) made of
        # whole rounds: it ends early rather than cut a round short (see __whole_rounds)
        self.__speculative_steps = config.drafter != "none" and config.tokens_per_step == 1
        self.__default_step = (config.draft_length + 1 if self.__speculative_steps
                               else config.tokens_per_step)
        self.__whole_rounds = False  # this step is a default speculative one
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

    # ---------------------------------------------------------------- hooks

    @property
    def capabilities(self) -> Capabilities:
        """What this session supports; see :class:`Capabilities`."""
        return Capabilities()

    @abstractmethod
    def _prefill(self, token_ids: list[int]) -> None:
        """Append ``token_ids`` after the sequence in the KV cache and leave the logits of
        the last one ready. Call :meth:`_raise_if_cancelled` between chunks."""

    @abstractmethod
    def _decode(self, max_tokens: int) -> Decoded:
        """Generate 1..``max_tokens`` tokens continuing the sequence.

        Stop early right after an end-of-generation token (unless ``config.ignore_eos``).
        Call :meth:`_raise_if_cancelled` between tokens. With a drafter, run the rounds
        through :meth:`_speculate`.
        """

    @abstractmethod
    def _reset(self) -> None:
        """Clear the KV cache and the sampler state."""

    def _batch_cost(self, max_n: int) -> list[float] | None:
        """Seconds of one forward pass over ``n`` tokens (all with logits), at index ``n - 1``
        for ``n`` in ``1..max_n`` (fewer where the cache or batch has no room): the batch cost
        curve the draft policy weighs drafts with (:mod:`eliza_backends.runtime.draft_policy`).
        Called at most once per loaded model and draft length, from :meth:`_speculate`, when the
        next forward pass starts from the pending tokens (the current logits are not needed);
        it must leave the KV cache as it found it. None (the default): the backend cannot
        measure it, and speculative rounds always draft ``draft_length``."""
        return None

    def _truncate(self, n_keep: int) -> bool:
        """Keep the first ``n_keep`` positions of the KV cache (``n_keep < n_past``).
        Return False when the runtime cannot drop part of its cache."""
        return False

    @abstractmethod
    def _token_bytes(self, token_id: int) -> bytes:
        """The bytes one token contributes to the output text (b"" for control tokens)."""

    @abstractmethod
    def _tokenize(self, text: str, add_special: bool, parse_special: bool) -> list[int]:
        """The model's own tokenization of ``text``: BOS first when ``add_special`` and the
        model uses one; control-token texts (``"<|end|>"``) become their ids only when
        ``parse_special`` (otherwise they are plain text)."""

    def _detokenize(self, token_ids: list[int]) -> str:
        """Text of ``token_ids``; the default joins :meth:`_token_bytes`."""
        return b"".join(self._token_bytes(t) for t in token_ids).decode("utf-8", "replace")

    def _save_state(self) -> bytes:
        """The KV state of the sequence as bytes (``capabilities.slots``)."""
        raise UnsupportedOperationError(f"{self.backend_name} sessions cannot save slots")

    def _restore_state(self, payload: bytes, tokens: list[int]) -> None:
        """Make the KV state that of ``tokens`` from a :meth:`_save_state` payload."""
        raise UnsupportedOperationError(f"{self.backend_name} sessions cannot restore slots")

    def _close(self) -> None:
        """Free the session's own runtime resources (not the shared weights)."""

    # ---------------------------------------------------------------- public API

    @property
    def history(self) -> tuple[int, ...]:
        """Every token in the session's sequence so far: prompts and generated tokens."""
        return tuple(self.__history)

    @property
    def n_past(self) -> int:
        """Number of tokens in the sequence (``len(history)``)."""
        return len(self.__history)

    @property
    def closed(self) -> bool:
        """True once :meth:`close` ran."""
        return self.__closed

    @property
    def busy(self) -> bool:
        """True while a consumer call (prefill, next, reset ...) is running."""
        return self.__lock.locked()

    @final
    def prefill(self, token_ids: Sequence[int]) -> None:
        """Feed prompt tokens. Raises :class:`InvalidArgumentError` for empty, non-integer or
        out-of-vocabulary ids, :class:`ContextFullError` when they do not fit.

        A prefill that fails (an exception from the runtime, a ``KeyboardInterrupt``: see
        :mod:`eliza_backends.backend.interrupts`) leaves :attr:`history` and the KV cache as they
        were before it; prefill again before ``next()``."""
        ids = self.__check_tokens(token_ids, what="prefill")
        if not ids:
            raise InvalidArgumentError("prefill() needs at least one token id")
        self.__begin("prefill", guarded=True)
        history = self.__history
        n = -1  # the history length to go back to if this call fails (-1: nothing changed)
        try:
            room = self.__n_ctx - len(history)
            if len(ids) > room:
                raise ContextFullError(
                    f"prefill of {len(ids)} tokens does not fit: {len(history)} of "
                    f"{self.__n_ctx} context positions are used ({room} free); raise "
                    "context_size, or reset()/reset_keep() first")
            n = len(history)
            guide = None if self.__output is None else self.__new_guide(self.__output)
            self.__ready = False
            self.__guide = guide
            self._prefill(ids)
            history.extend(ids)
            if self.__deferral.interrupting:  # Ctrl-C after the last safe point: undone too
                self.__recover("prefill", None, n, None)
                n = -1
            else:
                self.__assembler = TextAssembler(self.config.stop)
                self.__finished = False
                self.__generated = 0
                self.__ready = True
            self.__deferral.end()  # (delivers a deferred Ctrl-C: KeyboardInterrupt)
        except BaseException as exc:
            if n >= 0:
                self.__recover("prefill", exc, n, None)
            raise
        finally:
            self.__end()

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
        self.__begin("next", guarded=True)  # the hot path: no context-manager machinery
        history = self.__history
        n = -1  # the history length to go back to if this step fails (-1: nothing changed)
        before: tuple[int, AssemblerState] | None = None
        try:
            if self.__finished:
                step = Step((), "", final=True, finish_reason=None)
            elif not self.__ready:
                raise InvalidArgumentError("call prefill() before next(): there is nothing to "
                                           "continue from")
            else:
                want = max_tokens or self.__default_step
                budget = self.config.max_tokens - self.__generated
                room = self.__n_ctx - len(history)
                if room <= 0:
                    step = self.__finish((), "", 0, 0, "context")
                else:
                    n = len(history)
                    before = (self.__generated, self.__assembler.state())
                    self.__whole_rounds = max_tokens is None and self.__speculative_steps
                    out = self._decode(min(want, budget, room))
                    step = self.__assemble(out, budget, room)
                    if self.__deferral.interrupting:  # Ctrl-C after the last safe point: the
                        self.__recover("next", None, n, before)  # caller never sees this step
                        n = -1
            self.__deferral.end()  # (delivers a deferred Ctrl-C: KeyboardInterrupt)
            return step
        except BaseException as exc:
            if n >= 0:
                self.__recover("next", exc, n, before)
            raise
        finally:
            self.__end()

    def __assemble(self, out: Decoded, budget: int, room: int) -> Step:
        eog = self.__eog
        ignore_eos = self.config.ignore_eos
        assembler = self.__assembler
        texts: list[str] = []
        kept: list[int] = []
        reason: FinishReason | None = None
        for tok in out.tokens:
            kept.append(tok)
            if tok in eog and not ignore_eos:
                reason = "eos"
                break
            texts.append(assembler.push(self._token_bytes(tok)))
            if assembler.stopped:
                reason = "stop"
                break
        # every decoded token joins the history (tokens past an end too: it stays the KV's)
        self.__history.extend(out.tokens)
        self.__generated += len(out.tokens)
        if reason is None and len(out.tokens) >= budget:
            reason = "length"
        elif reason is None and len(out.tokens) >= room:
            reason = "context"
        elif reason is None and out.finish is not None:
            reason = out.finish
        logprobs = None if self.__guide is None else self.__logprobs(len(out.tokens), len(kept))
        if reason is None:
            return Step(tuple(kept), "".join(texts), out.drafted, out.accepted,
                        logprobs=logprobs)
        if reason != "stop":
            texts.append(assembler.flush())
        return self.__finish(tuple(kept), "".join(texts), out.drafted, out.accepted, reason,
                             logprobs)

    def __finish(self, tokens: tuple[int, ...], text: str, drafted: int, accepted: int,
                 reason: FinishReason, logprobs: tuple[TokenLogprob, ...] | None = None) -> Step:
        self.__finished = True
        return Step(tokens, text, drafted, accepted, final=True, finish_reason=reason,
                    logprobs=logprobs)

    def __logprobs(self, produced: int, kept: int) -> tuple[TokenLogprob, ...] | None:
        assert self.__guide is not None
        raw = self.__guide.take_logprobs(produced)
        if raw is None:
            return None
        piece = self._token_bytes
        return tuple(TokenLogprob(r.token, piece(r.token), r.logprob,
                                  tuple(TopLogprob(t, piece(t), lp) for t, lp in r.top))
                     for r in raw[:kept])

    def __new_guide(self, spec: OutputSpec) -> LogitsGuide:
        vocabulary = None
        if spec.constraint is not None:
            def control_id(text: str) -> int | None:
                ids = self._tokenize(text, False, True)
                return ids[0] if len(ids) == 1 else None

            vocabulary = model_vocabulary(self.__info, self._token_bytes, control_id)
        return LogitsGuide(spec, vocabulary)

    @final
    def cancel(self) -> None:
        """Ask the running (or next) prefill/next to stop with :class:`CancelledError`.

        Safe from any thread. The session keeps raising it until ``reset()`` or
        ``reset_keep()``; the tokens in :attr:`history` stay valid for ``reset_keep``.
        """
        self.__cancel.set()
        self.__stop.add(None)

    @property
    def cancelled(self) -> bool:
        """True between :meth:`cancel` and the next reset."""
        return self.__cancel.is_set()

    @final
    def reset(self) -> None:
        """Forget everything: KV cache, history, sampler state, a pending cancel.

        Right after a cancel (``cancel()``, a cancelled ``async for``) it waits for the call
        still running in another thread to stop at its next safe point."""
        self.__begin("reset", allow_cancelled=True, guarded=True)
        try:
            try:
                self._reset()
            except BaseException as exc:
                self.__broken("reset", exc)
                raise
            self.__after_rewind(0)
        finally:
            self.__end()

    @final
    def reset_keep(self, n_keep: int) -> int:
        """Keep the first ``n_keep`` tokens of the sequence, drop the rest; returns how many
        were kept: ``min(n_keep, n_past)``, or 0 when the backend cannot keep a prefix (it did a
        full reset). Clears a pending cancel (waiting, like :meth:`reset`, for a cancelled call
        in another thread). Prefill again before ``next()``."""
        if isinstance(n_keep, bool) or not isinstance(n_keep, int) or n_keep < 0:
            raise InvalidArgumentError(f"n_keep must be an int >= 0, got {n_keep!r}")
        self.__begin("reset_keep", allow_cancelled=True, guarded=True)
        try:
            n = min(n_keep, len(self.__history))
            try:
                if self.__drafter is not None:
                    self.__drafter.truncate(n)
                if n == 0 or not self._truncate(n):
                    self._reset()
                    n = 0
            except BaseException as exc:
                self.__broken("reset_keep", exc)
                raise
            self.__after_rewind(n)
            return n
        finally:
            self.__end()

    def __after_rewind(self, n: int) -> None:
        del self.__history[n:]
        if self.__drafter is not None:
            self.__drafter.truncate(n)
        self.__cancel.clear()
        self.__cancel_reason = None
        self.__sync_stop()
        self.__ready = False
        self.__finished = False
        self.__generated = 0
        self.__assembler = TextAssembler(self.config.stop)
        self.__guide = None

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
        self.__begin("set_output", allow_cancelled=True)
        try:
            self.__output = spec if spec.active else None
        finally:
            self.__end()

    @final
    def save_slot(self, path: str | os.PathLike[str]) -> None:
        """Save the sequence state to ``path`` (atomically; the previous file survives a crash).

        Raises :class:`UnsupportedOperationError` when ``capabilities.slots`` is False."""
        if not self.capabilities.slots:
            raise UnsupportedOperationError(
                f"{self.backend_name} sessions cannot save slots (capabilities.slots is False)")
        self.__begin("save_slot", guarded=True)
        try:
            if not self.__history:
                raise InvalidArgumentError("nothing to save: prefill first")
            info = self.__info
            n = len(self.__history)
            try:
                payload = self._save_state()
            except BaseException as exc:
                self.__recover("save_slot", exc, n, None)
                raise
            write_slot(path, {"backend": self.backend_name, "model_fingerprint": info.fingerprint,
                              "runtime": info.runtime, "tokens": list(self.__history)}, payload)
        finally:
            self.__end()

    @final
    def restore_slot(self, path: str | os.PathLike[str]) -> None:
        """Replace the session's state with a slot saved by the same backend, model and runtime
        version; ``next()`` then continues exactly as the saved session would have (greedy).

        A foreign, truncated or corrupted file raises :class:`SlotError` and leaves the session
        as it was."""
        if not self.capabilities.slots:
            raise UnsupportedOperationError(
                f"{self.backend_name} sessions cannot restore slots (capabilities.slots is False)")
        self.__begin("restore_slot", allow_cancelled=True, guarded=True)
        try:
            info = self.__info
            header, payload = read_slot(path, backend=self.backend_name,
                                        model_fingerprint=info.fingerprint, runtime=info.runtime)
            tokens = list(header.tokens)
            if not tokens:
                raise SlotError(f"{path} holds no tokens")
            try:
                tokens = self.__check_tokens(tokens, what="slot")
            except InvalidArgumentError as exc:
                raise SlotError(f"{path}: {exc.message}") from None
            if len(tokens) > self.__n_ctx:
                raise SlotError(f"{path} holds {len(tokens)} tokens, more than this session's "
                                f"context_size {self.__n_ctx}; open it with a larger one")
            try:
                self._restore_state(payload, tokens)
            except (SlotError, InvalidArgumentError, UnsupportedOperationError):
                raise
            except BaseException as exc:
                self.__broken("restore_slot", exc)
                raise
            self.__after_rewind(0)
            self.__history.extend(tokens)
            self.__ready = True
        finally:
            self.__end()

    @final
    def tokenize(self, text: str, *, add_special: bool = True,
                 parse_special: bool = True) -> list[int]:
        """Token ids of ``text`` in the model's vocabulary; ``add_special`` prepends BOS where
        the model uses one; ``parse_special`` turns control-token texts (``"<|end|>"``) into
        their ids (turn it off for text you did not write: chat content, documents).

        A consumer call like the others: ``close()`` from another thread waits for it."""
        if not isinstance(text, str):
            raise InvalidArgumentError(f"tokenize() takes str, got {type(text).__name__}")
        if not text.isascii():  # every backend hands text on as UTF-8
            try:
                text.encode("utf-8")
            except UnicodeEncodeError as exc:
                raise InvalidArgumentError(
                    f"tokenize(): the text holds a lone surrogate {text[exc.start]!r} at index "
                    f"{exc.start}, which is not valid Unicode text (often from json.loads of "
                    "'\\ud800'); decode the source with errors='replace' or drop it") from None
        self.__begin("tokenize", allow_cancelled=True)
        try:
            return self._tokenize(text, add_special, parse_special)
        finally:
            self.__end()

    @final
    def detokenize(self, token_ids: Sequence[int]) -> str:
        """Text of ``token_ids`` (invalid UTF-8 becomes U+FFFD)."""
        ids = self.__check_tokens(token_ids, what="detokenize")
        self.__begin("detokenize", allow_cancelled=True)
        try:
            return self._detokenize(ids)
        finally:
            self.__end()

    @final
    def close(self) -> None:
        """Free the session (and its drafter). Idempotent and safe from any thread: it cancels
        the running call, waits for it to return (that call raises :class:`CancelledError` or
        :class:`SessionClosedError`, never :class:`SessionBusyError`), then frees."""
        if self.__closed:
            return
        if self.__owner == threading.get_ident():  # (the lock is not re-entrant)
            raise SessionBusyError("close() was called from inside a call on this session")
        self.__closing = True
        self.__cancel.set()
        self.__stop.add(None)
        with self.__lock:
            if self.__closed:
                return
            self.__closed = True
            drafter, self.__drafter = self.__drafter, None
            try:
                if drafter is not None:
                    drafter.close()
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
        (between chunks/tokens)."""
        if self.__cancel.is_set() or self.__interrupt.is_set():
            raise CancelledError(self.__cancel_reason or (
                f"{self.backend_name}: cancelled by cancel(); call reset() or reset_keep() to "
                "use the session again" if self.__cancel.is_set() else
                f"{self.backend_name}: interrupted (SIGINT)"))

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
        return self.__drafter

    @property
    @final
    def _guide(self) -> LogitsGuide | None:
        """This turn's logits hook: call ``process(row)`` on the next-token logits before
        sampling and ``accept(token)`` after (None: the turn asks for nothing; see
        :mod:`eliza_backends.structured.logits`). Only backends with ``capabilities.logits`` see
        one."""
        return self.__guide

    @final
    def _ends_generation(self, token: int) -> bool:
        """True when ``token`` ends the stream: an end-of-generation id, and no ignore_eos."""
        return token in self._stop_tokens

    @final
    def _stream_ends_with(self, max_tokens: int) -> bool:
        """True when a ``_decode(max_tokens)`` step surely ends the stream (the budget or the
        context window), so its last token needs no forward pass."""
        return max_tokens >= self.config.max_tokens - self.__generated or \
            len(self.__history) + max_tokens >= self.__n_ctx

    @final
    def _speculate(self, max_tokens: int, verify: Verify, *, draft_length: int | None = None,
                   after: Sequence[int] = ()) -> Decoded:
        """Speculative rounds through :func:`~eliza_backends.runtime.speculative.speculate` with the
        session's drafter until ``max_tokens`` tokens or an end token: the core drafts, the
        backend's ``verify`` checks. ``after``: tokens this step already produced (not yet in
        the sequence); they lead the result. ``draft_length`` caps ``config.draft_length``."""
        drafter = self.__drafter
        if drafter is None:
            raise UnsupportedOperationError("_speculate() needs a drafter")
        k = self.config.draft_length if draft_length is None else draft_length
        if not self.__policy_made:
            self.__policy_made = True
            self.__policy = self.__make_policy(drafter, k)
        tokens, drafted, accepted = speculate(
            drafter, [*self.__history, *after], max_tokens - len(after), k, verify,
            self._ends_generation, self._raise_if_cancelled, self.__policy,
            whole_rounds=self.__whole_rounds)
        return Decoded([*after, *tokens], drafted, accepted)

    @property
    @final
    def draft_policy(self) -> DraftPolicy | None:
        """The draft policy steering this session's speculative rounds (None: none yet, or
        ``draft_policy="fixed"``, or a backend that cannot measure its verify cost)."""
        return self.__policy

    def __make_policy(self, drafter: Drafter, k: int) -> DraftPolicy | None:
        """The policy for ``config.draft_policy="auto"``, on the batch cost curve measured once
        per loaded model (cached on the inference context)."""
        if self.config.draft_policy != "auto":
            return None
        key = ("batch-cost", self.backend_name, str(self.__info.artifact), self.config.threads,
               k + 1)
        if self.context is not None:
            cost = self.context.shared(key, lambda: self._batch_cost(k + 1))
        else:
            cost = self._batch_cost(k + 1)
        if not cost:
            return None
        return DraftPolicy(cost, k, cheap_drafter=isinstance(drafter, NgramDrafter))

    # ---------------------------------------------------------------- internals

    def __check_open(self) -> None:
        if self.__closed or self.__closing:
            raise SessionClosedError(f"this {self.backend_name} session is closed; open a new one")

    def __check_tokens(self, token_ids: Sequence[int], *, what: str) -> list[int]:
        if isinstance(token_ids, (str, bytes)) or not isinstance(token_ids, Sequence):
            raise InvalidArgumentError(
                f"{what}: token ids must be a sequence of ints, got {type(token_ids).__name__}")
        ids = list(token_ids)
        vocab = self.__vocab
        for i, t in enumerate(ids):
            if not isinstance(t, int) or isinstance(t, bool):
                try:
                    if isinstance(t, bool) or (hasattr(t, "dtype") and t.dtype.kind == "b"):
                        raise TypeError
                    t = operator.index(t)  # numpy integers are fine
                except TypeError:
                    raise InvalidArgumentError(
                        f"{what}: token id at index {i} is {t!r}, not an int") from None
                ids[i] = t
            if not 0 <= t < vocab:
                raise InvalidArgumentError(
                    f"{what}: token id {t} at index {i} is outside the vocabulary "
                    f"(0..{vocab - 1}); tokenize with this model's own tokenizer")
        return ids

    def __begin(self, op: str, *, allow_cancelled: bool = False, guarded: bool = False) -> None:
        """Take the consumer lock and check the session is usable; the caller then runs the
        call in ``try: ... finally: self.__end()``. ``guarded``: the call changes the
        session's state, so SIGINT is deferred to its safe points while it runs (the caller
        delivers it with ``self.__deferral.end()`` once the state is consistent)."""
        lock = self.__lock
        if not lock.acquire(blocking=False):
            self.__check_open()  # close() holds it, or waits for the running call
            if self.__owner == threading.get_ident():
                raise SessionBusyError(f"{op}() was called from inside a call on this session")
            if not self.__cancel.is_set():
                raise SessionBusyError(
                    f"{op}(): another thread is using this session; a session has one "
                    "consumer (open one session per thread)")
            if not allow_cancelled:
                self._raise_if_cancelled()
            lock.acquire()  # the cancelled call stops at its next safe point: wait for it
        try:
            self.__owner = threading.get_ident()  # (cleared by __end)
            if self.__closed or self.__closing or (
                    not allow_cancelled and self.__cancel.is_set()):
                self.__check_open()
                self._raise_if_cancelled()
            if guarded:
                if self.__interrupt.is_set():
                    self.__interrupt.clear()
                    self.__sync_stop()
                self.__deferral.begin()
        except BaseException:
            try:
                self.__deferral.end()
            finally:
                self.__owner = None
                lock.release()
            raise

    def __end(self) -> None:
        """Release what :meth:`__begin` took (the deferral too, if the call did not end it:
        then a deferred Ctrl-C is delivered here)."""
        try:
            self.__deferral.end()
        finally:
            self.__owner = None
            self.__lock.release()

    # ---------------------------------------------------------------- repair after a failure

    def __recover(self, op: str, exc: BaseException | None, n: int,
                  before: tuple[int, AssemblerState] | None) -> None:
        """A call failed (``exc``) or was interrupted after its last safe point (``exc`` is
        None): put the history back to its first ``n`` tokens and the KV cache back in step
        with it. Refusals (bad arguments, missing features) changed nothing; a cancel() is
        sticky and repaired by the reset that must follow. If the repair fails too, the
        session refuses calls until reset() / reset_keep()."""
        limit = isinstance(exc, ConstraintError)  # raised mid-step: undo it, end the turn
        if exc is not None and not limit and (isinstance(exc, (InvalidArgumentError,
                                                               UnsupportedOperationError)) or (
                isinstance(exc, CancelledError) and not self.__interrupt.is_set())):
            return
        self.__interrupt.clear()
        self.__sync_stop()
        del self.__history[n:]
        if before is not None:
            self.__generated, state = before
            self.__assembler.restore(state)
            self.__finished = False
        if op == "prefill":
            self.__ready = False
        try:
            if self.__ready:
                self.__refeed(n)
            else:
                self.__rewind_cache(n)
            if op == "next" and self.__guide is not None and limit:
                self.__guide = None  # the turn is over: prefill again
                self.__ready = False
            elif op == "next" and self.__guide is not None:  # the constraint saw the undone
                raise UnsupportedOperationError(  # tokens and cannot be rewound with them
                    "an output constraint cannot be rewound")
        except BaseException as err:
            self.__interrupt.clear()
            self.__sync_stop()
            what = f"{type(exc).__name__} in {op}()" if exc is not None else f"{op}() interrupted"
            self.__broken(op, err, f"{what}, then the repair of the KV cache failed")

    def __rewind_cache(self, n: int) -> None:
        """Make the KV cache hold ``history[:n]`` (``n == len(history)``), no logits kept."""
        if self.__drafter is not None:
            self.__drafter.truncate(n)
        if n == 0:
            self._reset()
        elif not self._truncate(n):
            raise UnsupportedOperationError(f"{self.backend_name} cannot truncate its cache")

    def __refeed(self, n: int) -> None:
        """Make the KV cache hold ``history[:n]`` with the logits after it ready (the state
        after a prefill): cut it before the last token and feed that token again."""
        history = self.__history
        last = history[n - 1]
        self.__ready = False
        self.__rewind_cache(n - 1)
        del history[n - 1:]
        try:
            self._prefill([last])
        finally:
            history.append(last)
        self.__ready = True

    def __broken(self, op: str, exc: BaseException, what: str | None = None) -> None:
        """The session's state is no longer known to match its history: refuse calls with
        :class:`CancelledError` until reset() / reset_keep() / restore_slot()."""
        if isinstance(exc, (InvalidArgumentError, UnsupportedOperationError, SlotError)) and \
                what is None:
            return
        why = what or f"{type(exc).__name__} in {op}()"
        self.__cancel_reason = (f"{self.backend_name}: {why} left the session's cache unknown; "
                                "call reset() (or reset_keep()) to use it again")
        self.__cancel.set()
        self.__stop.add(None)

    def __on_sigint(self) -> None:
        """A deferred SIGINT that will raise KeyboardInterrupt: stop at the next safe point."""
        self.__interrupt.set()
        self.__stop.add(None)

    def __sync_stop(self) -> None:
        """After clearing a flag: the probe says stop only while cancel or interrupt is set
        (discard first, then re-add: a concurrent cancel() is never lost)."""
        self.__stop.discard(None)
        if self.__cancel.is_set() or self.__interrupt.is_set():
            self.__stop.add(None)


def check_output_support(caps: Capabilities, config: StreamConfig, spec: OutputSpec,
                         backend: str) -> None:
    """Refuse an output constraint or logprobs the session cannot honour (never a silent
    unconstrained answer)."""
    what = spec.constraint.kind if spec.constraint is not None else "logprobs"
    if not caps.logits:
        raise UnsupportedOperationError(
            f"backend {backend} does not expose next-token logits (capabilities.logits is "
            f"False), so it cannot apply {what}; choose another backend (llama.cpp, mlx, or "
            "litert-lm with session='interpreter')")
    if config.drafter != "none":
        raise UnsupportedOperationError(
            f"{what} with speculative decoding is not supported: use drafter='none' for "
            "this stream")


class Factory(ABC):
    """A backend (the seed's ``LlmBackendFactory``): one instance per installed runtime.

    ``available()`` and ``can_serve()`` must be cheap: no model load, no heavy import.
    """

    #: Canonical backend name, e.g. ``"llama.cpp"``.
    name: ClassVar[str]
    #: Other names ``ELIZA_LLM_BACKEND`` / ``backend=`` accept (case-insensitive).
    aliases: ClassVar[tuple[str, ...]] = ()
    #: Artifact formats (see :data:`eliza_backends.bundle.FORMATS`) this backend serves.
    formats: ClassVar[tuple[str, ...]] = ()
    #: The ``pip install eliza-backends[<extra>]`` extra that installs this backend.
    pip_extra: ClassVar[str | None] = None
    #: Pydantic model of this backend's ``StreamConfig.options[name]``; None = takes none.
    options_model: ClassVar[type[BaseModel] | None] = None

    @abstractmethod
    def available(self) -> Availability:
        """Whether the runtime is installed and usable on this host (cheap, cacheable)."""

    def can_serve(self, bundle_dir: str | os.PathLike[str]) -> bool:
        """Whether the bundle ships an artifact this backend serves (a directory probe)."""
        return bool(find_artifacts(bundle_dir, self.formats))

    def cannot_serve_reason(self, bundle_dir: str | os.PathLike[str]) -> str:
        """One line for ``explain()`` and errors: why :meth:`can_serve` is False for
        ``bundle_dir``. A backend whose artifacts may be present yet unrunnable on this host
        (a Core ML model off macOS) overrides it to say so."""
        return f"no {'/'.join(self.formats) or 'matching'} artifact under text/"

    def drafters(self, bundle_dir: str | os.PathLike[str]) -> Mapping[str, str]:
        """For :func:`~eliza_backends.explain`: each speculative drafter kind this backend runs
        (``StreamConfig.drafter``), with one line saying what a stream with it would use on
        ``bundle_dir`` or why it cannot. Cheap (directory and header probes, no model load).
        The default says nothing."""
        return {}

    def pinned(self, name: str) -> Factory:
        """The factory a hard request by ``name`` (one of :meth:`names`) gets: this one, or,
        for an alias that names one engine of a multi-engine backend (``coreml``), a factory
        whose ``available()`` / ``can_serve()`` / ``open()`` answer for that engine alone, so
        the request fails loudly where that engine cannot run."""
        return self

    def preference_rank(self) -> int:
        """Higher wins auto-selection. llama.cpp is 0; a rank <= 0 is chosen only when
        llama.cpp cannot serve the bundle (it may depend on the host)."""
        return 0

    def rank_reason(self) -> str:
        """One line for ``explain()``: why the rank is what it is on this host."""
        return ""

    @abstractmethod
    def open(self, context: InferenceContext, config: StreamConfig) -> Session:
        """Open a session on ``context.bundle_dir`` (re-resolve the artifact there)."""

    def names(self) -> tuple[str, ...]:
        """The canonical name and the aliases."""
        return (self.name, *self.aliases)

    def parse_options(self, config: StreamConfig) -> Any:
        """This backend's validated options from ``config.options`` (by name or alias).

        Returns an ``options_model`` instance (defaults when none were given), or None when
        the backend takes no options. Unknown fields raise :class:`InvalidArgumentError`.
        """
        given: dict[str, Any] = {}
        for key, value in config.options.items():
            if key.lower() in (n.lower() for n in self.names()):
                given.update(value)
        if self.options_model is None:
            if given:
                raise InvalidArgumentError(f"backend {self.name} takes no options, got "
                                           f"{sorted(given)}")
            return None
        try:
            return self.options_model.model_validate(given)
        except ValidationError as exc:
            raise InvalidArgumentError(
                describe_validation_error(exc, f"options for {self.name}")) from None

    def artifact(self, bundle_dir: str | os.PathLike[str], *, role: Literal["model", "draft"]
                 = "model", name: str | None = None,
                 formats: Sequence[str] | None = None) -> Path:
        """The artifact to open: the one called ``name`` if given, else the first by name, of
        ``formats`` (default :attr:`formats`) under ``text/`` (``role="draft"``:
        ``text/draft/``). :class:`BundleError` (``ERR_CANNOT_SERVE``) when there is none."""
        kinds = tuple(self.formats if formats is None else formats)
        found = find_artifacts(bundle_dir, kinds, role=role)
        if name is not None:
            found = [p for p in found if p.name == name]
        if not found:
            where = "text/draft/" if role == "draft" else "text/"
            want = f"{name!r}" if name else f"{'/'.join(kinds)} artifact"
            hint = (" (ship a smaller model with the same vocabulary there, or set draft_model)"
                    if role == "draft" else "")
            raise BundleError(f"{bundle_dir} has no {want} under {where} for {self.name}{hint}",
                              code=Status.ERR_CANNOT_SERVE)
        return found[0]

    def draft_artifact(self, bundle_dir: str | os.PathLike[str], config: StreamConfig, *,
                       formats: Sequence[str] | None = None) -> Path:
        """The draft model for ``drafter="model"``: ``config.draft_model`` (a path relative to
        the bundle, which must stay inside it and be one of ``formats``), else the first
        artifact under ``text/draft/``. :class:`BundleError` otherwise."""
        kinds = tuple(self.formats if formats is None else formats)
        if config.draft_model is None:
            return self.artifact(bundle_dir, role="draft", formats=kinds)
        root = Path(bundle_dir).resolve()
        path = (root / config.draft_model).resolve()
        if not path.is_relative_to(root) or artifact_format(path) not in kinds:
            raise BundleError(f"draft_model {config.draft_model!r} is not a {'/'.join(kinds)} "
                              f"artifact inside the bundle {bundle_dir}")
        return path

    def make_drafter(self, context: InferenceContext, config: StreamConfig, target: ModelInfo,
                     *, greedy_only: bool = False) -> Drafter | None:
        """The drafter ``config.drafter`` names, for a session on ``target``: None for
        ``"none"``, the core's :class:`~eliza_backends.runtime.speculative.NgramDrafter` for
        ``"ngram"``, :meth:`make_draft_model` for ``"model"``; ``"mtp"`` is refused here (a
        backend with an MTP drafter builds it in :meth:`open`: it reads the session's own
        runtime state). ``greedy_only``: the backend
        verifies greedily only, so sampling with a drafter is refused here. The session the
        drafter is handed to owns it (rewinds and closes it)."""
        if config.drafter == "none":
            return None
        if greedy_only and (not config.greedy or config.repeat_penalty != 1.0):
            raise UnsupportedOperationError(
                f"{self.name} speculative decoding is greedy-only here: use temperature=0 and "
                "repeat_penalty=1 with a drafter, or drafter='none' to sample")
        if config.drafter == "ngram":
            return NgramDrafter(max_n=config.ngram_size)
        if config.drafter == "mtp":
            raise UnsupportedOperationError(
                f"{self.name} has no MTP drafter (a target's multi-token-prediction assistant, "
                "Gemma 4's): use backend='llama.cpp' for it, or drafter='ngram'")
        return self.make_draft_model(context, config, target)

    def make_draft_model(self, context: InferenceContext, config: StreamConfig,
                         target: ModelInfo) -> Drafter:
        """The ``drafter="model"`` drafter. A backend with draft models overrides this: load
        :meth:`draft_artifact` through ``context.shared`` and wrap it in a
        :class:`~eliza_backends.runtime.speculative.ModelDrafter` (vocabulary checked against
        ``target``). The default refuses."""
        raise UnsupportedOperationError(
            f"{self.name} has no draft-model drafter: use drafter='ngram', or a backend with "
            "draft models (llama.cpp, mlx)")

    def __repr__(self) -> str:
        return f"<{type(self).__name__} {self.name!r}>"


__all__ = ["Availability", "Capabilities", "Decoded", "Factory", "FinishReason", "ModelInfo",
           "Session", "Step", "check_output_support"]
