"""A host-memory prompt cache: the KV states of conversations evicted from a session, kept in
a byte-bounded LRU and restored by longest prefix when a conversation comes back.

A server has more open conversations than sessions (slots). When a session that holds
conversation A is about to serve a request that keeps less than :data:`SIMILARITY` of A,
:meth:`PromptCache.swap` first saves A's state (``Session.save_slot()`` without a path:
the backend's KV bytes, the history and its media spans) into the cache; then, when an entry
shares a longer reusable prefix with the request than the session itself does, that entry is
restored into the session (``Session.restore_slot``) and only the rest of the prompt is
prefilled. This is llama-server's ``--cache-ram``: its slots' prompts are saved on a new task
and the entry with the longest common prefix is loaded. Unlike llama-server's, a restored entry
stays in the cache (as the most recently used): when the session is evicted again still
holding that conversation, unchanged or cut back (a prompt asked again gets the same greedy
reply), nothing is copied (:attr:`CacheStats.covered`); a conversation that grew is saved,
and the longer state replaces the entry it covers.

* **Prefix.** Ids compare as ids; media items compare by their content digest
  (:func:`~eliza_backends.backend.media_seq.reusable_prefix`, as the prefix reuse of one
  session): a prefix never ends inside an item and never crosses an item that differs.
* **Valid cuts only.** An entry restores only when the request keeps at least its
  ``min_keep`` (a sliding-window cache saves only the window's last positions, so a restored
  state can be cut back only to about its whole length: Gemma 3 / 4); the session's own cut
  refuses an invalid one anyway (a full prefill, never a wrong prefix).
* **Bounds.** ``limit_bytes`` bounds the entries' :attr:`SlotSnapshot.nbytes`; storing past it
  drops the least recently stored / used entries; a state larger than the whole limit is not
  stored. An entry whose sequence is a prefix of a new one's is dropped when the new one can
  be cut back to it (it covers it); a state an entry covers is not stored.

Thread-safe: sessions on several threads share one cache; the lock guards only the entries
(a save or restore runs on the calling session's thread, outside it). A session is used from
its own consumer thread, as always.
"""

from __future__ import annotations

import logging
import threading
from collections import OrderedDict
from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from ..errors import ElizaError, SlotError
from .media_seq import reusable_prefix
from .slot_state import SlotSnapshot
from .types import MediaSpan

if TYPE_CHECKING:
    from .session import Session

log = logging.getLogger("eliza_backends.prompt_cache")

#: A request continues what a session holds when it keeps at least this fraction of it
#: (below it, the session's conversation is saved before it is cut; the server's slot
#: routing uses the same rule).
SIMILARITY = 0.5


def common_length(a: Sequence[int], b: Sequence[int]) -> int:
    """Length of the longest common prefix of two id sequences (slices compared in C, halving
    the range)."""
    lo, hi = 0, min(len(a), len(b))
    ta, tb = tuple(a[:hi]), tuple(b[:hi])
    while lo < hi:
        mid = (lo + hi + 1) // 2
        if ta[lo:mid] == tb[lo:mid]:
            lo = mid
        else:
            hi = mid - 1
    return lo


def reusable(held: Sequence[int], held_spans: Sequence[MediaSpan], ids: Sequence[int],
             spans: Sequence[MediaSpan]) -> int:
    """How many leading positions of ``ids`` (with media ``spans``) a sequence ``held`` (with
    ``held_spans``) may give: the common ids, cut at the first media item that differs."""
    return reusable_prefix(common_length(held, ids), held_spans, spans)


@dataclass
class CacheStats:
    """Counters of a :class:`PromptCache` since it was made."""

    #: requests that restored an entry, and prompt tokens those entries gave
    hits: int = 0
    hit_tokens: int = 0
    #: requests that found neither their session nor an entry holding half their prompt
    misses: int = 0
    #: states saved, dropped by the byte bound, and refused by the runtime when restored
    stored: int = 0
    dropped: int = 0
    refused: int = 0
    #: evictions whose states entries already held (nothing saved: the session's state is
    #: copied out only when the cache lacks it)
    covered: int = 0


class PromptCache:
    """The evicted sessions' states, at most ``limit_bytes`` of them; see the module doc.
    ``limit_bytes`` 0 keeps nothing (and :meth:`swap` only measures the session's own
    prefix)."""

    def __init__(self, limit_bytes: int) -> None:
        if limit_bytes < 0:
            raise ValueError(f"limit_bytes must be >= 0, got {limit_bytes}")
        self.limit_bytes = limit_bytes
        self._entries: OrderedDict[int, SlotSnapshot] = OrderedDict()
        self._next = 0
        self._bytes = 0
        self._lock = threading.Lock()
        self.counts = CacheStats()

    # ------------------------------------------------------------------ the one call

    def swap(self, session: Session, ids: Sequence[int], spans: Sequence[MediaSpan] = (),
             prompt_end: int = 0) -> int:
        """Before ``session`` prefills ``ids`` (with media ``spans``): save what it holds
        when the request keeps less than :data:`SIMILARITY` of it, and restore the entry that
        gives the request the longest valid prefix when that beats the session's own. Returns
        the prefix the session now shares with the request. ``prompt_end``: the length of
        what the session held when its last reply started (see :meth:`evict`). On the
        session's consumer thread, between generations."""
        history = session.history
        held = reusable(history, session.media, ids, spans)
        if not self.limit_bytes or not session.capabilities.slots:
            return held
        entry = self._find(ids, spans, held)
        if history and held < SIMILARITY * len(history):
            try:
                self.evict(session, prompt_end)
            except ElizaError as exc:  # the request goes on without the cache's help
                log.warning("the session's state was not kept in the prompt cache: %s", exc)
        if entry is None:
            self._count(misses=int(held < SIMILARITY * len(ids)))
            return held
        try:
            session.restore_slot(entry)
        except SlotError:  # another layout (the session is empty now): prefill it all
            self._discard(entry)
            self._count(refused=1, misses=1)
            return 0
        gained = reusable(session.history, session.media, ids, spans)
        self._count(hits=1, hit_tokens=min(gained, len(ids) - 1))
        return gained

    def _count(self, **added: int) -> None:
        with self._lock:
            for name, n in added.items():
                setattr(self.counts, name, getattr(self.counts, name) + n)

    def evict(self, session: Session, prompt_end: int = 0) -> None:
        """Store what ``session`` holds; when that state restores only for about its whole
        length (a sliding window) and ``prompt_end`` (where its last reply started) is before
        that, also the state cut back there: the conversation comes back with the reply as
        text, which need not tokenize as it was generated (llama-server keeps context
        checkpoints for the same reason). The session is cut back then.

        Nothing is saved when entries already cover both (a conversation that came back,
        was answered the same way and leaves again; llama-server's cache skips it so too):
        the covering entries are only marked recently used."""
        history, spans = session.history, session.media
        reply_start = prompt_end if 0 < prompt_end < len(history) else len(history)
        if self._holds(history, spans) and self._holds(
                history[:reply_start], [s for s in spans if s.end <= reply_start]):
            self._count(covered=1)
            return
        state = session.save_slot()
        if 0 < prompt_end - 1 < state.min_keep and prompt_end < len(state.tokens) and \
                session.reset_keep(prompt_end) == prompt_end:
            self.store(session.save_slot())  # first: the whole state is the fresher entry
        self.store(state)

    # ------------------------------------------------------------------ entries

    def store(self, snapshot: SlotSnapshot) -> bool:
        """Keep ``snapshot`` (dropping the oldest entries past the byte bound); False when it
        was not kept (larger than the bound, or a prefix of an entry)."""
        size = snapshot.nbytes
        if size > self.limit_bytes or len(snapshot.tokens) < 2:
            return False
        with self._lock:
            for key, entry in list(self._entries.items()):
                if _covers(entry, snapshot.tokens, snapshot.spans):
                    self._entries.move_to_end(key)
                    return False
                if _covers(snapshot, entry.tokens, entry.spans):
                    self._drop(key)
            while self._entries and self._bytes + size > self.limit_bytes:
                self._drop(next(iter(self._entries)))
                self.counts.dropped += 1
            self._entries[self._next] = snapshot
            self._next += 1
            self._bytes += size
            self.counts.stored += 1
        return True

    def _holds(self, tokens: Sequence[int], spans: Sequence[MediaSpan]) -> bool:
        """True (the entry marked recently used) when an entry covers the state ``tokens``
        with media ``spans`` (see :func:`_covers`)."""
        with self._lock:
            for key, entry in self._entries.items():
                if _covers(entry, tokens, spans):
                    self._entries.move_to_end(key)
                    return True
            return False

    def _find(self, ids: Sequence[int], spans: Sequence[MediaSpan], beat: int
              ) -> SlotSnapshot | None:
        """The entry giving ``ids`` the longest valid prefix longer than ``beat`` (at least
        its ``min_keep``, and short of the last id: it is prefilled again for its logits),
        marked recently used; it stays in the cache."""
        last = len(ids) - 1
        with self._lock:
            best, best_n = None, beat
            for key, entry in self._entries.items():
                n = min(reusable(entry.tokens, entry.spans, ids, spans), last)
                if n > best_n and n >= entry.min_keep:
                    best, best_n = key, n
            if best is None:
                return None
            self._entries.move_to_end(best)
            return self._entries[best]

    def _discard(self, snapshot: SlotSnapshot) -> None:
        """Drop ``snapshot``'s entry, if it is still there (the runtime refused it)."""
        with self._lock:
            for key, entry in list(self._entries.items()):
                if entry is snapshot:
                    self._drop(key)

    def _drop(self, key: int) -> None:
        self._bytes -= self._entries.pop(key).nbytes

    def clear(self) -> None:
        """Forget every entry."""
        with self._lock:
            self._entries.clear()
            self._bytes = 0

    def stats(self) -> dict[str, Any]:
        """JSON-ready counters: ``hits``, ``misses``, ``hit_tokens``, ``stored``, ``dropped``,
        ``refused``, ``covered``, ``entries``, ``bytes``, ``limit_bytes``."""
        with self._lock:
            return {**self.counts.__dict__, "entries": len(self._entries),
                    "bytes": self._bytes, "limit_bytes": self.limit_bytes}


def _covers(big: SlotSnapshot, tokens: Sequence[int], spans: Sequence[MediaSpan]) -> bool:
    """True when ``big`` serves every request a state of ``tokens`` (with media ``spans``)
    serves: the sequence is a prefix of ``big``'s (ids and media) and ``big`` may be cut back
    to it."""
    n = len(tokens)
    return n <= len(big.tokens) and tuple(big.tokens[:n]) == tuple(tokens) and \
        reusable_prefix(n, big.spans, spans) == n and big.min_keep <= n - 1


__all__ = ["SIMILARITY", "CacheStats", "PromptCache", "common_length", "reusable"]
