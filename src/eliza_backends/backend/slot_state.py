"""A session's slot files: its sequence state saved to, and restored from, a slot file
(:mod:`eliza_backends.runtime.slots` is the file format).

:class:`SlotState` does the work of ``Session.save_slot`` / ``restore_slot`` inside the
session's guarded call (the consumer thread, the lock held): the backend's state bytes with the
history, the media spans and the model's identity, checked in full before anything reaches the
backend's ``_restore_state``.
"""

from __future__ import annotations

import os
from collections.abc import Callable

from ..errors import InvalidArgumentError, SlotError, UnsupportedOperationError
from .hooks import SessionHooks
from .media_seq import SessionMedia, slot_spans
from .model_info import ModelInfo
from .repair import Repair
from .types import check_slot_tokens


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

    def save(self, path: str | os.PathLike[str]) -> None:
        """Write the sequence's state to ``path`` (atomically)."""
        if not self.history:
            raise InvalidArgumentError("nothing to save: prefill first")
        info, hooks = self.info, self.hooks
        n = len(self.history)
        try:
            payload = hooks._save_state()
        except BaseException as exc:
            self.repair.recover("save_slot", exc, n, None)
            raise
        from ..runtime.slots import write_slot  # (pydantic: only a slot save pays for it)

        write_slot(path, {"backend": hooks.backend_name, "model_fingerprint": info.fingerprint,
                          "runtime": info.runtime, "tokens": list(self.history),
                          "media": self.media.slot_entries()}, payload)

    def restore(self, path: str | os.PathLike[str]) -> None:
        """Make the sequence the one saved at ``path`` (checked in full first; a bad file is
        :class:`SlotError` and changes nothing)."""
        info, hooks = self.info, self.hooks
        from ..runtime.slots import read_slot

        header, payload = read_slot(path, backend=hooks.backend_name,
                                    model_fingerprint=info.fingerprint, runtime=info.runtime)
        tokens = check_slot_tokens(path, header.tokens, info.vocab_size, self.n_ctx)
        spans = slot_spans(path, header.media, len(tokens))
        try:
            hooks._restore_state(payload, tokens)
        except (SlotError, InvalidArgumentError, UnsupportedOperationError):
            raise
        except BaseException as exc:
            self.repair.broken("restore_slot", exc)
            raise
        self.rewind(0)
        self.history.extend(tokens)
        self.media.add(0, spans)


__all__ = ["SlotState"]
