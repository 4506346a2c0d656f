"""The hooks of the backend contract: what a backend implements and never calls.

:class:`SessionHooks` declares them (abstract where a backend must implement them, with a
default where it may). :class:`~eliza_backends.backend.session.Session` derives from it and
calls each hook with the consumer lock held, after validating the arguments; a plugin
subclasses ``Session``, the one contract, and overrides these.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from typing import TYPE_CHECKING, ClassVar

from ..errors import UnsupportedOperationError
from .types import Capabilities, Decoded, MediaTokens

if TYPE_CHECKING:
    from ..media import MediaItem
    from ..runtime.batching import StepScheduler


class SessionHooks(ABC):
    """The hooks of :class:`~eliza_backends.backend.session.Session` (see its docstring for
    the three kinds of members: hooks, helpers, internals)."""

    #: The factory name, for messages and slot headers. Set by subclasses.
    backend_name: ClassVar[str] = "?"

    @property
    def capabilities(self) -> Capabilities:
        """What this session supports; see :class:`Capabilities`."""
        return Capabilities()

    @property
    def scheduler(self) -> StepScheduler | None:
        """The step scheduler of the batched runtime context this session decodes on (its
        ``stats()``, and ``adopt()`` for a server's stream loop); None (the default) on a
        context of its own."""
        return None

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

    def _state_min_keep(self) -> int:
        """The shortest prefix that the state :meth:`_save_state` writes now, once restored,
        may be cut back to (:meth:`_truncate`) and still decode correctly; 0: any. A backend
        whose saved state omits positions (llama.cpp's sliding-window cache keeps only the
        window's last positions) says how far back it still holds everything needed."""
        return 0

    def _media_tokens(self, item: MediaItem) -> MediaTokens:
        """How ``item`` (a kind in ``capabilities.media``) enters the sequence: the model's
        begin/end marker ids, the number of embedding positions and the placeholder id the
        history shows for them, and a prepared ``handle`` (see :class:`MediaTokens`). Called
        before anything is written to the KV cache; it may preprocess (resize, mel features)
        but must not change the cache. Raise :class:`~eliza_backends.errors.MediaError` for an
        item this model cannot take (audio longer than its encoder's window ...)."""
        raise UnsupportedOperationError(f"{self.backend_name} sessions take no media")

    def _prefill_media(self, item: MediaItem, tokens: MediaTokens) -> None:
        """Append ``item``'s ``tokens.count`` embedding positions after the sequence, with the
        model's own attention rule over them (the core prefilled ``tokens.before`` with
        :meth:`_prefill` just before, and prefills ``tokens.after`` next). Call
        :meth:`_raise_if_cancelled` between encoder chunks."""
        raise UnsupportedOperationError(f"{self.backend_name} sessions take no media")

    def _embed(self, batch: list[list[int]]) -> list[list[float]]:
        """One vector per input of ``batch`` (each a non-empty list of in-vocabulary ids that
        fits ``capabilities.embedding.max_tokens``, checked by the core), pooled as the model
        pools and L2-normalised, ``capabilities.embedding.dimensions`` floats each, in input
        order. The backend batches as its runtime allows (many inputs per forward pass); each
        input's vector must not depend on the others in ``batch`` (beyond float rounding).
        It leaves no state behind (the next call starts clean). Call
        :meth:`_raise_if_cancelled` between forward passes. Only sessions whose
        ``capabilities.embedding`` is set are asked."""
        raise UnsupportedOperationError(f"{self.backend_name} sessions do not embed")

    def _close(self) -> None:
        """Free the session's own runtime resources (not the shared weights)."""


__all__ = ["SessionHooks"]
