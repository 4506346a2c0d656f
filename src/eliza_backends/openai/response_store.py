"""The in-process store of responses that ``previous_response_id`` continues and
``GET``/``DELETE /v1/responses/{id}`` read: bounded by count and by bytes, least recently used
first out.

Each entry is a finished :class:`~.responses_types.Response` and the conversation it ended
(the chat messages of its input, earlier responses included, then its output), so a request
naming it as ``previous_response_id`` prefixes that conversation to its own input. Nothing is
written to disk: a restart forgets every response.
"""

from __future__ import annotations

import threading
from collections import OrderedDict
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from .responses_types import Response

#: Default bounds: how many responses, and how many bytes of them (their JSON), are kept.
MAX_RESPONSES = 1024
MAX_BYTES = 64 << 20


@dataclass(frozen=True)
class StoredResponse:
    """A stored response and the conversation it ends (chat messages as template dicts,
    without the request's ``instructions``, which a continuation does not inherit)."""

    response: Response
    conversation: tuple[Mapping[str, Any], ...]
    size: int


class ResponseStore:
    """Responses by id, at most ``max_responses`` of them and ``max_bytes`` of their JSON; the
    least recently used go first. Thread-safe (one lock)."""

    def __init__(self, max_responses: int = MAX_RESPONSES, max_bytes: int = MAX_BYTES) -> None:
        self.max_responses = max_responses
        self.max_bytes = max_bytes
        self._entries: OrderedDict[str, StoredResponse] = OrderedDict()
        self._bytes = 0
        self._lock = threading.Lock()

    def put(self, response: Response, conversation: Sequence[Mapping[str, Any]]) -> None:
        """Keep ``response`` (and the ``conversation`` it ends); evicts the least recently used
        entries past the bounds. One larger than ``max_bytes`` alone is not kept."""
        size = len(response.model_dump_json()) + sum(len(repr(m)) for m in conversation)
        entry = StoredResponse(response, tuple(conversation), size)
        with self._lock:
            self._drop(response.id)
            if size > self.max_bytes:
                return
            self._entries[response.id] = entry
            self._bytes += size
            while len(self._entries) > self.max_responses or self._bytes > self.max_bytes:
                self._drop(next(iter(self._entries)))

    def get(self, response_id: str) -> StoredResponse | None:
        """The entry of ``response_id`` (now the most recently used), or None."""
        with self._lock:
            entry = self._entries.get(response_id)
            if entry is not None:
                self._entries.move_to_end(response_id)
            return entry

    def delete(self, response_id: str) -> bool:
        """Forget ``response_id``; False when it was not stored."""
        with self._lock:
            return self._drop(response_id)

    def _drop(self, response_id: str) -> bool:
        entry = self._entries.pop(response_id, None)
        if entry is None:
            return False
        self._bytes -= entry.size
        return True

    def __len__(self) -> int:
        return len(self._entries)

    @property
    def bytes(self) -> int:
        """The bytes the stored entries count for."""
        return self._bytes


_PROCESS_STORE: ResponseStore | None = None
_PROCESS_LOCK = threading.Lock()


def process_store() -> ResponseStore:
    """The process's store, made on first use with the default bounds: where the in-process
    :func:`~eliza_backends.openai.local_fronts.responses` keeps responses unless given
    another."""
    global _PROCESS_STORE
    with _PROCESS_LOCK:
        if _PROCESS_STORE is None:
            _PROCESS_STORE = ResponseStore()
        return _PROCESS_STORE


__all__ = ["MAX_BYTES", "MAX_RESPONSES", "ResponseStore", "StoredResponse", "process_store"]
