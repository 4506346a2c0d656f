"""The values of the backend contract: what a step produced (:class:`Step`), what a
backend's ``_decode`` hook returns (:class:`Decoded`), what a session supports
(:class:`Capabilities`), what an embedding model gives (:class:`EmbeddingSpec`) and whether
a backend runs here (:class:`Availability`); and
:func:`check_output_support`, the refusal of a constraint or logprobs a session cannot honour.
"""

from __future__ import annotations

import operator
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Literal, Protocol

from ..errors import InvalidArgumentError, SlotError, UnsupportedOperationError

if TYPE_CHECKING:
    from ..config import StreamConfig
    from ..structured.logits import OutputSpec
    from ..structured.logprobs import TokenLogprob

FinishReason = Literal["eos", "stop", "length", "context"]
#: How an embedding model turns its per-token states into one vector: their mean, the first
#: (CLS) token's, or the last token's (llama.cpp's ``LLAMA_POOLING_TYPE_MEAN/CLS/LAST``).
Pooling = Literal["mean", "cls", "last"]


@dataclass(frozen=True, slots=True)
class EmbeddingSpec:
    """What an embedding model gives (a backend's :meth:`Factory.embedding` answer, and an
    embedding session's ``capabilities.embedding``): one vector of ``dimensions`` floats per
    input, pooled as ``pooling`` says (the model's own pooling, from its file), L2-normalised
    (as llama-server's ``/v1/embeddings`` and sentence-transformers' ``Normalize`` do).
    ``matryoshka``: the shorter lengths the model was trained to be truncated to (its first
    ``n`` dimensions, re-normalised), largest first; empty: a request for fewer dimensions is
    refused. ``max_tokens``: the longest input in tokens (0: the session's context size)."""

    dimensions: int
    pooling: Pooling
    matryoshka: tuple[int, ...] = ()
    max_tokens: int = 0

    def describe(self) -> str:
        """One line for ``explain()``: pooling, dimensions, truncations."""
        cut = (f", truncatable to {'/'.join(map(str, self.matryoshka))}" if self.matryoshka
               else "")
        return f"{self.pooling} pooling, {self.dimensions} dimensions{cut}, L2-normalised"


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
    raises :class:`UnsupportedOperationError`). ``batched``: sessions opened on an
    :class:`InferenceContext` with ``parallel > 1`` share one runtime context and are decoded
    together, one batched step for every sequence that wants tokens (False: each session has its
    own runtime context and ``parallel`` changes nothing). ``media``: the media kinds
    (``"image"``, ``"audio"``) :meth:`Session.prefill` takes as
    :class:`~eliza_backends.media.MediaItem` elements (empty: text only; a media item is then
    refused with :class:`UnsupportedOperationError` before any hook runs). ``embedding``: the
    session embeds (an embedding model's session: :meth:`Session.embed`, with this spec;
    prefill / next are refused) or None (it generates; ``embed`` is refused).
    """

    token_input: bool = True
    prefix_reuse: bool = True
    slots: bool = False
    cancel_prefill: bool = True
    sampling: bool = True
    ignore_eos: bool = True
    drafters: frozenset[str] = frozenset({"none"})
    logits: bool = False
    batched: bool = False
    media: frozenset[str] = frozenset()
    embedding: EmbeddingSpec | None = None


@dataclass(frozen=True)
class MediaTokens:
    """How one media item enters a sequence (a backend's ``_media_tokens`` answer): the
    ``before`` ids (the model's begin marker, e.g. Gemma 4's ``<|image>``), ``count`` embedding
    positions shown in the history as ``placeholder`` (the model's soft-token id), the
    ``after`` ids (the end marker). ``handle``: the backend's own prepared form of the item
    (preprocessed chunks ...), handed back to its ``_prefill_media``."""

    before: tuple[int, ...]
    placeholder: int
    count: int
    after: tuple[int, ...] = ()
    handle: object = None

    @property
    def ids(self) -> list[int]:
        """The item's ids in the history: ``before``, the placeholders, ``after``."""
        return [*self.before, *[self.placeholder] * self.count, *self.after]


class MediaReference(Protocol):
    """A runtime's own media path, called directly (no seam), for ``eliza-backends bench`` to
    time beside the seam's (:meth:`Factory.media_reference`). It uses the same files, threads
    and context size as the session it was made for; one thread at a time."""

    #: what it runs, for the report (e.g. "llama-cpp-python mtmd_helper_eval_chunks")
    name: str

    def prefill(self, kind: str, data: bytes, prefix: str, suffix: str) -> int:
        """Into an empty sequence of its own: ``prefix`` (with the model's BOS), the media
        file ``data`` (decoded by the runtime itself), ``suffix``; returns the positions
        taken (the bench checks them against the seam's)."""
        ...

    def close(self) -> None:
        """Free what it holds (idempotent)."""
        ...


@dataclass(frozen=True)
class MediaSpan:
    """Where a media item's embeddings sit in a session's sequence: history positions
    ``start .. start + length - 1`` (the placeholder run, without the markers), and the item's
    ``kind`` and ``digest`` (what a prefix cache compares)."""

    start: int
    length: int
    kind: str
    digest: str

    @property
    def end(self) -> int:
        """The first position after the span."""
        return self.start + self.length


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


def check_tokens(vocab: int, token_ids: Sequence[int], *, what: str) -> list[int]:
    """``token_ids`` as a list of ints in ``0..vocab-1`` (numpy integers accepted), or
    :class:`InvalidArgumentError` naming the first bad one (``what``: the call, for the
    message). Runs before anything reaches native code."""
    if isinstance(token_ids, (str, bytes)) or not isinstance(token_ids, Sequence):
        raise InvalidArgumentError(
            f"{what}: token ids must be a sequence of ints, got {type(token_ids).__name__}")
    ids = list(token_ids)
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


def check_embedding_batch(spec: EmbeddingSpec | None, backend: str, vocab: int, n_ctx: int,
                          inputs: Sequence[Sequence[int]]) -> list[list[int]]:
    """What :meth:`Session.embed` checks before its hook runs: the session embeds (``spec``;
    else :class:`UnsupportedOperationError`), ``inputs`` is a non-empty list of token-id lists,
    each of in-vocabulary ids, 1..``spec.max_tokens`` (0: ``n_ctx``) long
    (:class:`InvalidArgumentError` naming the first bad input)."""
    if spec is None:
        raise UnsupportedOperationError(
            f"this {backend} session generates text and does not embed: open an embedding "
            "model's bundle with eliza_backends.embed / POST /v1/embeddings")
    limit = spec.max_tokens or n_ctx
    if isinstance(inputs, (str, bytes)) or not isinstance(inputs, Sequence) or not inputs:
        raise InvalidArgumentError("embed() needs a non-empty list of token-id lists")
    batch = [check_tokens(vocab, ids, what=f"embed() input {i}") for i, ids in enumerate(inputs)]
    for i, ids in enumerate(batch):
        if not 0 < len(ids) <= limit:
            raise InvalidArgumentError(
                f"embed() input {i} has {len(ids)} tokens; each input needs 1..{limit} (the "
                "model's window): split longer texts")
    return batch


def check_slot_tokens(path: object, tokens: Sequence[int], vocab: int, n_ctx: int) -> list[int]:
    """A slot file's token history checked against the session (:class:`SlotError` naming
    ``path`` otherwise): not empty, in the vocabulary, within the context window."""
    if not tokens:
        raise SlotError(f"{path} holds no tokens")
    try:
        ids = check_tokens(vocab, tokens, what="slot")
    except InvalidArgumentError as exc:
        raise SlotError(f"{path}: {exc.message}") from None
    if len(ids) > n_ctx:
        raise SlotError(f"{path} holds {len(ids)} tokens, more than this session's "
                        f"context_size {n_ctx}; open it with a larger one")
    return ids


def check_text(text: str) -> None:
    """``tokenize()``'s text is a ``str`` every backend can hand on as UTF-8
    (:class:`InvalidArgumentError` otherwise)."""
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


__all__ = ["Availability", "Capabilities", "Decoded", "EmbeddingSpec", "FinishReason",
           "MediaReference", "MediaSpan", "MediaTokens", "Pooling", "Step",
           "check_embedding_batch", "check_output_support", "check_slot_tokens", "check_text",
           "check_tokens"]
