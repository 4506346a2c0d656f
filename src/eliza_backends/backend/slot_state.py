"""A session's saved states: its sequence state captured in memory (a :class:`SlotSnapshot`,
what a prompt cache keeps) or written to a slot file (:mod:`eliza_backends.runtime.slots` is the
file format), and restored from either.

:class:`SlotState` does the work of ``Session.save_slot`` / ``restore_slot`` inside the
session's guarded call (the consumer thread, the lock
held): the backend's state bytes with the history, the media spans and (in a file) the model's
identity, checked in full before anything reaches the backend's ``_restore_state``.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from dataclasses import dataclass

from ..errors import InvalidArgumentError, SlotError, UnsupportedOperationError
from .hooks import SessionHooks
from .media_seq import SessionMedia, slot_spans
from .model_info import ModelInfo
from .repair import Repair
from .types import MediaSpan, check_slot_tokens


@dataclass(frozen=True, eq=False)
class SlotSnapshot:
    """A session's sequence state held in memory: the history ``tokens`` (the first ones
    cached), the media ``spans`` in it, the backend's ``payload`` and ``min_keep``, the
    shortest prefix a restored copy may be cut back to and still be valid (0: any; a
    sliding-window cache saves only the window's last positions, so its restore can keep
    only about the whole sequence: see ``SessionHooks._state_min_keep``). Restores only
    into a session of the same backend, model and context settings (the runtime checks the
    rest: a refusal is :class:`SlotError`). Immutable; safe to share between threads."""

    tokens: tuple[int, ...]
    spans: tuple[MediaSpan, ...]
    payload: bytes
    min_keep: int = 0

    @property
    def nbytes(self) -> int:
        """Host memory the snapshot holds, in bytes (payload, and 8 per token id and span)."""
        return len(self.payload) + 8 * (len(self.tokens) + len(self.spans))


class SlotState:
    """The slot files of one session: its history (the live list), media spans, model facts,
    repair and hooks; ``rewind(n)`` is the session's own rewind (history, spans, turn)."""

    def __init__(self, history: list[int], media: SessionMedia, info: ModelInfo,
                 n_ctx: int, repair: Repair, hooks: SessionHooks,
                 rewind: Callable[[int], None]) -> None:
        self.history = history
        self.media = media
        self.info = info
        self.n_ctx = n_ctx
        self.repair = repair
        self.hooks = hooks
        self.rewind = rewind

    def check(self, what: str) -> None:
        """:class:`UnsupportedOperationError` unless the session has ``capabilities.slots``
        (``what``: "save" or "restore")."""
        if not self.hooks.capabilities.slots:
            raise UnsupportedOperationError(f"{self.hooks.backend_name} sessions cannot {what} "
                                            "slots (capabilities.slots is False)")

    def capture(self, op: str) -> SlotSnapshot:
        """The sequence's state in memory (``op``: the session call, for the repair)."""
        if not self.history:
            raise InvalidArgumentError("nothing to save: prefill first")
        hooks = self.hooks
        n = len(self.history)
        try:
            payload = hooks._save_state()
            min_keep = hooks._state_min_keep()
        except BaseException as exc:
            self.repair.recover(op, exc, n, None)
            raise
        return SlotSnapshot(tuple(self.history), tuple(self.media.spans), payload, min_keep)

    def save(self, path: str | os.PathLike[str] | None) -> SlotSnapshot:
        """The sequence's state, also written to ``path`` (atomically) when given."""
        snapshot = self.capture("save_slot")
        if path is None:
            return snapshot
        info, hooks = self.info, self.hooks
        from ..runtime.slots import write_slot  # (pydantic: only a slot file pays for it)

        write_slot(path, {"backend": hooks.backend_name, "model_fingerprint": info.fingerprint,
                          "runtime": info.runtime, "tokens": list(snapshot.tokens),
                          "media": self.media.slot_entries()}, snapshot.payload)
        return snapshot

    def restore(self, path: str | os.PathLike[str] | SlotSnapshot) -> None:
        """Make the sequence the one saved at ``path`` (checked in full first; a bad file is
        :class:`SlotError` and changes nothing), or the one a snapshot holds."""
        if isinstance(path, SlotSnapshot):
            self.load(path)
            return
        info, hooks = self.info, self.hooks
        from ..runtime.slots import read_slot

        header, payload = read_slot(path, backend=hooks.backend_name,
                                    model_fingerprint=info.fingerprint, runtime=info.runtime)
        tokens = check_slot_tokens(path, header.tokens, info.vocab_size, self.n_ctx)
        spans = slot_spans(path, header.media, len(tokens))
        self.apply("restore_slot", payload, tokens, spans)

    def apply(self, op: str, payload: bytes, tokens: list[int], spans: list[MediaSpan]) -> None:
        """Make the sequence ``tokens`` (with ``spans``) from a checked ``payload``. When the
        runtime refuses the state (:class:`SlotError` from ``_restore_state``, which may have
        emptied the cache), the session is left empty and the error raised."""
        hooks = self.hooks
        try:
            hooks._restore_state(payload, tokens)
        except SlotError:
            self.empty(op)
            raise
        except (InvalidArgumentError, UnsupportedOperationError):
            raise
        except BaseException as exc:
            self.repair.broken(op, exc)
            raise
        self.rewind(0)
        self.history.extend(tokens)
        self.media.add(0, spans)

    def empty(self, op: str) -> None:
        """Reset the backend and forget the history (after a refused state)."""
        try:
            self.hooks._reset()
        except BaseException as exc:
            self.repair.broken(op, exc)
            raise
        self.rewind(0)

    def load(self, snapshot: SlotSnapshot) -> None:
        """Make the sequence the one captured in ``snapshot`` (by a session of the same
        backend, model and context: :meth:`capture`)."""
        tokens = check_slot_tokens("the saved state", snapshot.tokens, self.info.vocab_size,
                                   self.n_ctx)
        self.apply("restore_slot", snapshot.payload, tokens, list(snapshot.spans))


__all__ = ["SlotSnapshot", "SlotState"]
