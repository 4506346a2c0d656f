"""The backend contract: :class:`Factory` and :class:`Session`.

These mirror the seed's ``LlmBackendFactory`` / ``LlmBackendSession`` one to one. A plugin
subclasses both and fills in a handful of underscore hooks that translate to its runtime; the
public methods here do everything the backends share, so it is done once and the same way:

* argument checks before anything reaches native code (token ids against the vocabulary,
  the context window, call order, closed sessions);
* single-consumer enforcement (a second thread gets :class:`SessionBusyError`);
* cancellation (``cancel()`` from any thread; sticky until ``reset()`` / ``reset_keep()``);
* the generation budget, end-of-generation tokens, stop strings and UTF-8-safe text;
* slot files (atomic, fingerprinted; see :mod:`eliza_backends.slots`).

Threads: every method except :meth:`Session.cancel` and :meth:`Session.close` belongs to the
one consumer thread that drives the session. ``cancel()`` is safe from anywhere; ``close()``
from another thread cancels the running call and waits for it to return.
"""

from __future__ import annotations

import operator
import os
import threading
from abc import ABC, abstractmethod
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, ClassVar, Literal

from pydantic import BaseModel, ValidationError

from .bundle import find_artifacts
from .config import StreamConfig, describe_validation_error
from .errors import (
    BundleError,
    CancelledError,
    ContextFullError,
    InvalidArgumentError,
    SessionBusyError,
    SessionClosedError,
    SlotError,
    Status,
    UnsupportedOperationError,
)
from .slots import read_slot, write_slot
from .text import TextAssembler

if TYPE_CHECKING:
    from .context import InferenceContext

FinishReason = Literal["eos", "stop", "length", "context"]


@dataclass(frozen=True, slots=True)
class Step:
    """What one :meth:`Session.next` call produced.

    ``tokens``: the token ids generated in this step (up to the one that ended the stream).
    ``text``: their text, never splitting a UTF-8 character, never containing a stop string.
    ``drafted`` / ``accepted``: speculative tokens proposed / accepted in this step (0 without
    a drafter). ``final``: the stream ended; ``finish_reason`` says why.
    """

    tokens: tuple[int, ...]
    text: str
    drafted: int = 0
    accepted: int = 0
    final: bool = False
    finish_reason: FinishReason | None = None


@dataclass(frozen=True, slots=True)
class Decoded:
    """What a backend's ``_decode`` hook returns: generated ids and speculative counts."""

    tokens: list[int]
    drafted: int = 0
    accepted: int = 0


@dataclass(frozen=True)
class Capabilities:
    """What a session really supports. The conformance kit checks exactly these.

    ``token_input``: prefill takes any in-vocabulary ids (False: the runtime takes text, so ids
    must round-trip through the tokenizer). ``prefix_reuse``: ``reset_keep`` keeps KV cache
    (False: it always falls back to a full reset). ``slots``: save/restore. ``cancel_prefill``:
    ``cancel()`` interrupts a running prefill (False: only between calls/chunks).
    ``drafters``: the drafter kinds ``StreamConfig.drafter`` may name. ``sampling``: honours
    temperature/top-k/top-p/min-p/seed (False: greedy only).
    """

    token_input: bool = True
    prefix_reuse: bool = True
    slots: bool = False
    cancel_prefill: bool = True
    sampling: bool = True
    drafters: frozenset[str] = frozenset({"none"})


@dataclass(frozen=True)
class Availability:
    """Whether a backend can run on this host. Truthy when it can; ``reason`` says why not.

    ``detail`` is extra, backend-defined facts for ``explain()`` (e.g. the accelerator rung).
    """

    ok: bool
    reason: str = ""
    detail: dict[str, str] = field(default_factory=dict)

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


class Session(ABC):
    """One active generation on one backend (the seed's ``LlmBackendSession``).

    Lifecycle: ``prefill(ids)`` then ``next()`` until ``step.final``; ``prefill`` again to
    continue (chat turns), ``reset()`` / ``reset_keep(n)`` to rewind, ``close()`` when done.
    The session owns its KV cache; the :class:`InferenceContext` owns the weights.

    Backends implement the underscore hooks; each is called with the consumer lock held and
    after the public method validated its arguments.
    """

    #: The factory name, for messages and slot headers. Set by subclasses.
    backend_name: ClassVar[str] = "?"

    def __init__(self, config: StreamConfig, context: InferenceContext | None = None) -> None:
        self.config = config
        self.context = context
        self._history: list[int] = []
        self._cancel = threading.Event()
        self._lock = threading.Lock()
        self._closed = False
        self._ready = False  # True when the last prefill left logits to sample from
        self._finished = False
        self._generated = 0
        self._assembler = TextAssembler(config.stop)
        # with a drafter, a default step is one speculative round (draft_length + 1 tokens)
        speculative = config.drafter != "none" and config.tokens_per_step == 1
        self._default_step = config.draft_length + 1 if speculative else config.tokens_per_step
        if context is not None:
            context.track(self)

    # ---------------------------------------------------------------- backend hooks

    @property
    @abstractmethod
    def vocab_size(self) -> int:
        """Number of token ids the model accepts (valid ids are 0..vocab_size-1)."""

    @property
    @abstractmethod
    def context_size(self) -> int:
        """The KV context window actually allocated, in tokens."""

    @property
    @abstractmethod
    def eog_token_ids(self) -> frozenset[int]:
        """Token ids that end generation (EOS, end-of-turn ...)."""

    @property
    def capabilities(self) -> Capabilities:
        """What this session supports; see :class:`Capabilities`."""
        return Capabilities()

    @property
    def bos_token_id(self) -> int | None:
        """The token ``tokenize(..., add_special=True)`` prepends, if any."""
        return None

    @property
    def chat_template(self) -> str | None:
        """The model's own jinja chat template, if its artifact ships one."""
        return None

    @property
    def template_tokens(self) -> dict[str, str]:
        """Special-token texts a chat template may use (``bos_token``, ``eos_token``)."""
        return {}

    @abstractmethod
    def _prefill(self, token_ids: list[int]) -> None:
        """Append ``token_ids`` after :attr:`history` in the KV cache and leave the logits of
        the last one ready. Call :meth:`_raise_if_cancelled` between chunks."""

    @abstractmethod
    def _decode(self, max_tokens: int) -> Decoded:
        """Generate 1..``max_tokens`` tokens continuing :attr:`history`.

        Stop early right after an end-of-generation token (unless ``config.ignore_eos``).
        Call :meth:`_raise_if_cancelled` between tokens.
        """

    @abstractmethod
    def _reset(self) -> None:
        """Clear the KV cache and the sampler state."""

    def _truncate(self, n_keep: int) -> bool:
        """Keep the first ``n_keep`` positions of the KV cache (``n_keep < len(history)``).
        Return False when the runtime cannot drop part of its cache."""
        return False

    def _token_bytes(self, token_id: int) -> bytes:
        """The bytes one token contributes to the output text."""
        raise NotImplementedError

    @abstractmethod
    def _tokenize(self, text: str, add_special: bool) -> list[int]:
        """The model's own tokenization of ``text``."""

    def _detokenize(self, token_ids: list[int]) -> str:
        return b"".join(self._token_bytes(t) for t in token_ids).decode("utf-8", "replace")

    def _save_state(self) -> bytes:
        raise UnsupportedOperationError(f"{self.backend_name} sessions cannot save slots")

    def _restore_state(self, payload: bytes, tokens: list[int]) -> None:
        raise UnsupportedOperationError(f"{self.backend_name} sessions cannot restore slots")

    def _slot_identity(self) -> tuple[str, str]:
        """(model fingerprint, runtime version) written into and checked against slot files."""
        raise UnsupportedOperationError(f"{self.backend_name} sessions cannot save slots")

    def _close(self) -> None:
        """Free the session's own runtime resources (not the shared weights)."""

    # ---------------------------------------------------------------- public API

    @property
    def history(self) -> tuple[int, ...]:
        """Every token in the session's sequence so far: prompts and generated tokens."""
        return tuple(self._history)

    @property
    def n_past(self) -> int:
        """Number of tokens in the sequence (``len(history)``)."""
        return len(self._history)

    @property
    def closed(self) -> bool:
        """True once :meth:`close` ran."""
        return self._closed

    def prefill(self, token_ids: Sequence[int]) -> None:
        """Feed prompt tokens. Raises :class:`InvalidArgumentError` for empty, non-integer or
        out-of-vocabulary ids, :class:`ContextFullError` when they do not fit."""
        ids = self._check_tokens(token_ids, what="prefill")
        if not ids:
            raise InvalidArgumentError("prefill() needs at least one token id")
        with self._consumer("prefill"):
            room = self.context_size - len(self._history)
            if len(ids) > room:
                raise ContextFullError(
                    f"prefill of {len(ids)} tokens does not fit: {len(self._history)} of "
                    f"{self.context_size} context positions are used ({room} free); raise "
                    "context_size, or reset()/reset_keep() first")
            self._ready = False
            self._prefill(ids)
            self._history.extend(ids)
            self._ready = True
            self._finished = False
            self._generated = 0
            self._assembler = TextAssembler(self.config.stop)

    def next(self, max_tokens: int | None = None) -> Step:
        """Generate up to ``max_tokens`` tokens (default ``config.tokens_per_step``, or
        ``draft_length + 1`` when a drafter is on and ``tokens_per_step`` is 1; a speculative
        step runs draft/verify rounds until it has that many tokens or the stream ends).

        Returns a final :class:`Step` when an end-of-generation token, a stop string, the
        ``config.max_tokens`` budget or the context window ends the stream; calling again after
        that returns an empty final step until the next prefill.
        """
        if max_tokens is not None and (isinstance(max_tokens, bool) or not isinstance(
                max_tokens, int) or max_tokens < 1):
            raise InvalidArgumentError(f"max_tokens must be a positive int, got {max_tokens!r}")
        self._enter("next")  # the hot path: no context-manager machinery
        try:
            if self._finished:
                return Step((), "", final=True, finish_reason=None)
            if not self._ready:
                raise InvalidArgumentError("call prefill() before next(): there is nothing to "
                                           "continue from")
            want = max_tokens or self._default_step
            budget = self.config.max_tokens - self._generated
            room = self.context_size - len(self._history)
            if room <= 0:
                return self._finish((), "", 0, 0, "context")
            out = self._decode(min(want, budget, room))
            return self._assemble(out, budget, room)
        finally:
            self._lock.release()

    def _assemble(self, out: Decoded, budget: int, room: int) -> Step:
        eog = self.eog_token_ids
        ignore_eos = self.config.ignore_eos
        assembler = self._assembler
        texts: list[str] = []
        kept: list[int] = []
        reason: FinishReason | None = None
        for tok in out.tokens:
            self._history.append(tok)
            kept.append(tok)
            if tok in eog and not ignore_eos:
                reason = "eos"
                break
            texts.append(assembler.push(self._token_bytes(tok)))
            if assembler.stopped:
                reason = "stop"
                break
        self._generated += len(out.tokens)
        if len(kept) < len(out.tokens):  # tokens past an end were decoded: keep history true
            self._history.extend(out.tokens[len(kept):])
        if reason is None and len(out.tokens) >= budget:
            reason = "length"
        elif reason is None and len(out.tokens) >= room:
            reason = "context"
        if reason is None:
            return Step(tuple(kept), "".join(texts), out.drafted, out.accepted)
        if reason != "stop":
            texts.append(assembler.flush())
        return self._finish(tuple(kept), "".join(texts), out.drafted, out.accepted, reason)

    def _finish(self, tokens: tuple[int, ...], text: str, drafted: int, accepted: int,
                reason: FinishReason) -> Step:
        self._finished = True
        return Step(tokens, text, drafted, accepted, final=True, finish_reason=reason)

    def cancel(self) -> None:
        """Ask the running (or next) prefill/next to stop with :class:`CancelledError`.

        Safe from any thread. The session keeps raising it until ``reset()`` or
        ``reset_keep()``; the tokens in :attr:`history` stay valid for ``reset_keep``.
        """
        self._cancel.set()

    @property
    def cancelled(self) -> bool:
        """True between :meth:`cancel` and the next reset."""
        return self._cancel.is_set()

    def reset(self) -> None:
        """Forget everything: KV cache, history, sampler state, a pending cancel."""
        with self._consumer("reset", allow_cancelled=True):
            self._reset()
            self._after_rewind(0)

    def reset_keep(self, n_keep: int) -> int:
        """Keep the first ``n_keep`` tokens of the sequence, drop the rest; returns how many
        were kept: ``min(n_keep, n_past)``, or 0 when the backend cannot keep a prefix (it did a
        full reset). Clears a pending cancel. Prefill again before ``next()``."""
        if isinstance(n_keep, bool) or not isinstance(n_keep, int) or n_keep < 0:
            raise InvalidArgumentError(f"n_keep must be an int >= 0, got {n_keep!r}")
        with self._consumer("reset_keep", allow_cancelled=True):
            n = min(n_keep, len(self._history))
            if n == 0 or not self._truncate(n):
                self._reset()
                n = 0
            self._after_rewind(n)
            return n

    def _after_rewind(self, n: int) -> None:
        del self._history[n:]
        self._cancel.clear()
        self._ready = False
        self._finished = False
        self._generated = 0
        self._assembler = TextAssembler(self.config.stop)

    def save_slot(self, path: str | os.PathLike[str]) -> None:
        """Save the sequence state to ``path`` (atomically; the previous file survives a crash).

        Raises :class:`UnsupportedOperationError` when ``capabilities.slots`` is False."""
        if not self.capabilities.slots:
            raise UnsupportedOperationError(
                f"{self.backend_name} sessions cannot save slots (capabilities.slots is False)")
        with self._consumer("save_slot"):
            if not self._history:
                raise InvalidArgumentError("nothing to save: prefill first")
            fingerprint, runtime = self._slot_identity()
            payload = self._save_state()
            write_slot(path, {"backend": self.backend_name, "model_fingerprint": fingerprint,
                              "runtime": runtime, "tokens": list(self._history)}, payload)

    def restore_slot(self, path: str | os.PathLike[str]) -> None:
        """Replace the session's state with a slot saved by the same backend, model and runtime
        version; ``next()`` then continues exactly as the saved session would have (greedy).

        A foreign, truncated or corrupted file raises :class:`SlotError` and leaves the session
        as it was."""
        if not self.capabilities.slots:
            raise UnsupportedOperationError(
                f"{self.backend_name} sessions cannot restore slots (capabilities.slots is False)")
        with self._consumer("restore_slot", allow_cancelled=True):
            fingerprint, runtime = self._slot_identity()
            header, payload = read_slot(path, backend=self.backend_name,
                                        model_fingerprint=fingerprint, runtime=runtime)
            tokens = list(header.tokens)
            if not tokens:
                raise SlotError(f"{path} holds no tokens")
            try:
                tokens = self._check_tokens(tokens, what="slot")
            except InvalidArgumentError as exc:
                raise SlotError(f"{path}: {exc.message}") from None
            if len(tokens) > self.context_size:
                raise SlotError(f"{path} holds {len(tokens)} tokens, more than this session's "
                                f"context_size {self.context_size}; open it with a larger one")
            self._restore_state(payload, tokens)
            self._after_rewind(0)
            self._history.extend(tokens)
            self._ready = True

    def tokenize(self, text: str, *, add_special: bool = True) -> list[int]:
        """Token ids of ``text`` in the model's vocabulary; ``add_special`` prepends BOS where
        the model uses one."""
        if not isinstance(text, str):
            raise InvalidArgumentError(f"tokenize() takes str, got {type(text).__name__}")
        self._check_open()
        return self._tokenize(text, add_special)

    def detokenize(self, token_ids: Sequence[int]) -> str:
        """Text of ``token_ids`` (invalid UTF-8 becomes U+FFFD)."""
        ids = self._check_tokens(token_ids, what="detokenize")
        self._check_open()
        return self._detokenize(ids)

    def close(self) -> None:
        """Free the session. Idempotent; from another thread it cancels the running call and
        waits for it to return first."""
        if self._closed:
            return
        self._cancel.set()
        with self._lock:
            if self._closed:
                return
            self._closed = True
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

    def _raise_if_cancelled(self) -> None:
        """Backends call this between chunks/tokens."""
        if self._cancel.is_set():
            raise CancelledError(f"{self.backend_name}: cancelled by cancel(); call reset() or "
                                 "reset_keep() to use the session again")

    def _check_open(self) -> None:
        if self._closed:
            raise SessionClosedError(f"this {self.backend_name} session is closed; open a new one")

    def _check_tokens(self, token_ids: Sequence[int], *, what: str) -> list[int]:
        if isinstance(token_ids, (str, bytes)) or not isinstance(token_ids, Sequence):
            raise InvalidArgumentError(
                f"{what}: token ids must be a sequence of ints, got {type(token_ids).__name__}")
        ids = list(token_ids)
        vocab = self.vocab_size
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

    def _enter(self, op: str, *, allow_cancelled: bool = False) -> None:
        """Take the consumer lock and check the session is usable; the caller releases it."""
        if not self._lock.acquire(blocking=False):
            self._check_open()
            raise SessionBusyError(
                f"{op}(): another thread is using this session; a session has one consumer "
                "(open one session per thread)")
        if self._closed or (not allow_cancelled and self._cancel.is_set()):
            self._lock.release()
            self._check_open()
            self._raise_if_cancelled()

    @contextmanager
    def _consumer(self, op: str, *, allow_cancelled: bool = False) -> Iterator[None]:
        self._enter(op, allow_cancelled=allow_cancelled)
        try:
            yield
        finally:
            self._lock.release()


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
                 = "model", name: str | None = None) -> Path:
        """The artifact to open: the one called ``name`` if given, else the first by name."""
        found = find_artifacts(bundle_dir, self.formats, role=role)
        if name is not None:
            found = [p for p in found if p.name == name]
        if not found:
            where = "text/draft/" if role == "draft" else "text/"
            want = f"{name!r}" if name else f"a {'/'.join(self.formats)} artifact"
            raise BundleError(f"{bundle_dir} has no {want} under {where} for {self.name}",
                              code=Status.ERR_CANNOT_SERVE)
        return found[0]

    def __repr__(self) -> str:
        return f"<{type(self).__name__} {self.name!r}>"


__all__ = ["Availability", "Capabilities", "Decoded", "Factory", "FinishReason", "Session", "Step"]
