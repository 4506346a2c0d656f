"""Media in a session's sequence: the plan of a prefill that holds media items, the spans the
items occupy in the history, and the prefix two sequences with media may share.

A sequence is token ids and :class:`~eliza_backends.media.MediaItem` elements. The backend says
how each item enters it (``_media_tokens``: the model's begin marker ids, N embedding positions
shown in the history as a placeholder id, the end marker ids); the history stays a list of
ints, and a :class:`~eliza_backends.backend.types.MediaSpan` records each item's extent (markers
included) and content digest. A prefix cache must compare the digests, not just the ids:
two different images have the same placeholder ids. :func:`reusable_prefix` cuts a shared
prefix at the first item that differs, and never inside an item (an image is encoded and
attended to whole).

Owned by one session; the consumer thread only.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from ..errors import InvalidArgumentError, SlotError, UnsupportedOperationError
from ..media import MediaItem
from .types import Capabilities, MediaSpan, MediaTokens, check_tokens

if TYPE_CHECKING:
    from .hooks import SessionHooks

#: One element of a prompt: a token id or a media item.
Element = int | MediaItem
#: One part of a planned prefill: a run of ids, or an item with its tokens.
Part = list[int] | tuple[MediaItem, MediaTokens]


def has_media(elements: object) -> bool:
    """True when ``elements`` (a prefill's argument) holds a media item or is a plan."""
    if isinstance(elements, PrefillPlan):
        return True
    return isinstance(elements, (list, tuple)) and any(
        isinstance(e, MediaItem) for e in elements)


@dataclass
class PrefillPlan:
    """A prefill with media, checked and expanded by one session (:meth:`Session.plan_prefill`)
    and prefilled only by it. ``ids``: what the history gains (placeholders for embeddings);
    ``parts``: in order, runs of ids and items with their :class:`MediaTokens`; ``spans``: the
    items' extents, positions relative to the plan's start."""

    owner: object
    ids: list[int] = field(default_factory=list)
    parts: list[Part] = field(default_factory=list)
    spans: list[MediaSpan] = field(default_factory=list)

    def tail(self, keep: int) -> PrefillPlan:
        """The plan of positions ``keep ..`` (``keep`` is never inside an item)."""
        out = PrefillPlan(self.owner)
        pos = 0
        for part in self.parts:
            if isinstance(part, list):
                if pos + len(part) > keep:
                    out._add_ids(part[max(0, keep - pos):])
                pos += len(part)
                continue
            size = len(part[1].ids)
            if pos >= keep:
                out._add_item(*part)
            elif pos + size > keep:
                raise InvalidArgumentError("a prefix may not end inside a media item")
            pos += size
        return out

    def _add_ids(self, ids: list[int]) -> None:
        if not ids:
            return
        if self.parts and isinstance(self.parts[-1], list):
            self.parts[-1].extend(ids)
        else:
            self.parts.append(list(ids))
        self.ids.extend(ids)

    def _add_item(self, item: MediaItem, tokens: MediaTokens) -> None:
        ids = tokens.ids
        self.spans.append(MediaSpan(len(self.ids), len(ids), item.kind, item.digest))
        self.parts.append((item, tokens))
        self.ids.extend(ids)


def check_media_kinds(elements: Sequence[object], caps: Capabilities, backend: str) -> None:
    """Every media item's kind is one the session takes; the sequence ends with a token id.
    Runs before any hook."""
    for i, e in enumerate(elements):
        if isinstance(e, MediaItem) and e.kind not in caps.media:
            takes = ", ".join(sorted(caps.media)) or "no media"
            raise UnsupportedOperationError(
                f"element {i} is {e.kind} input, which this {backend} session does not take "
                f"(it takes {takes}); choose a backend and bundle with an {e.kind} encoder "
                "(see explain())")
    if not elements or isinstance(elements[-1], MediaItem):
        raise InvalidArgumentError(
            "a prefill with media must end with a token id (the text after the media, e.g. "
            "the generation prompt), so that the next token is predicted from a token")


def plan_prefill(elements: Sequence[object], *, owner: SessionHooks, vocab: int,
                 media_tokens: Callable[[MediaItem], MediaTokens]) -> PrefillPlan:
    """Expand ``elements`` (ids and media items, kinds already checked) into a plan: the ids
    are checked against the vocabulary, each item expanded by the backend's hook."""
    plan = PrefillPlan(owner)
    run: list[object] = []
    for e in elements:
        if isinstance(e, MediaItem):
            plan._add_ids(check_tokens(vocab, run, what="prefill"))  # type: ignore[arg-type]
            run = []
            tokens = media_tokens(e)
            if not isinstance(tokens, MediaTokens) or tokens.count < 1:
                raise InvalidArgumentError(f"{owner.backend_name} expanded {e!r} to "
                                           f"{tokens!r}: a plugin bug")
            check_tokens(vocab, [*tokens.before, tokens.placeholder, *tokens.after],
                         what=f"{owner.backend_name} media markers")
            plan._add_item(e, tokens)
        else:
            run.append(e)
    plan._add_ids(check_tokens(vocab, run, what="prefill"))  # type: ignore[arg-type]
    return plan


def run_plan(plan: PrefillPlan, prefill: Callable[[list[int]], None],
             prefill_media: Callable[[MediaItem, MediaTokens], None]) -> None:
    """Feed a plan's parts in order through the backend's hooks: each item's marker ids go
    with the runs of ids around it (one ``_prefill`` per run), its embeddings through
    ``_prefill_media``."""
    pending: list[int] = []
    for part in plan.parts:
        if isinstance(part, list):
            pending += part
            continue
        item, tokens = part
        pending += tokens.before
        if pending:
            prefill(pending)
        prefill_media(item, tokens)
        pending = list(tokens.after)
    if pending:
        prefill(pending)


class SessionMedia:
    """The media of one session's sequence: the spans in its history (positions absolute),
    and the checks and plans of its prefills with media (``owner``: the session)."""

    def __init__(self, owner: SessionHooks, vocab: int) -> None:
        self.owner = owner
        self.vocab = vocab
        self.spans: list[MediaSpan] = []

    def parse(self, token_ids: object) -> tuple[list[int], PrefillPlan | Sequence[Element] | None]:
        """A prefill's argument as checked ids (and None), or as a plan or elements with media
        (and no ids): :class:`InvalidArgumentError` for anything else."""
        try:
            return check_tokens(self.vocab, token_ids, what="prefill"), None  # type: ignore[arg-type]
        except InvalidArgumentError:
            pending = self.accept(token_ids)
            if pending is None:
                raise
            return [], pending

    def feed(self, plan: PrefillPlan, offset: int) -> None:
        """Prefill ``plan`` through the owner's hooks (it starts at ``offset``); record its
        spans."""
        run_plan(plan, self.owner._prefill, self.owner._prefill_media)
        self.add(offset, plan.spans)

    def accept(self, elements: object) -> PrefillPlan | Sequence[Element] | None:
        """A prefill argument with media, its kinds checked (None: it holds no media)."""
        if not has_media(elements):
            return None
        if not isinstance(elements, PrefillPlan):
            check_media_kinds(elements, self.owner.capabilities,  # type: ignore[arg-type]
                              self.owner.backend_name)
        return elements  # type: ignore[return-value]

    def plan(self, elements: PrefillPlan | Sequence[Element]) -> PrefillPlan:
        """The plan of ``elements`` (a plan must be this session's own); calls the hooks."""
        if isinstance(elements, PrefillPlan):
            if elements.owner is not self.owner:
                raise InvalidArgumentError("this prefill plan was made by another session")
            return elements
        self.accept(list(elements))  # the kinds, before any hook
        return plan_prefill(elements, owner=self.owner, vocab=self.vocab,
                            media_tokens=self.owner._media_tokens)

    def add(self, offset: int, spans: Sequence[MediaSpan]) -> None:
        """Record a prefill's spans (relative to ``offset``, where it started)."""
        self.spans += [MediaSpan(offset + s.start, s.length, s.kind, s.digest) for s in spans]

    def truncate(self, n: int) -> None:
        """Forget the spans past the first ``n`` positions."""
        while self.spans and self.spans[-1].end > n:
            self.spans.pop()

    def boundary(self, n: int) -> int:
        """The largest ``m <= n`` that does not cut a span."""
        for s in self.spans:
            if s.start < n < s.end:
                return s.start
        return n

    def slot_entries(self) -> list[list[int | str]]:
        """The spans as a slot header's ``media``."""
        return [[s.start, s.length, s.kind, s.digest] for s in self.spans]


def slot_spans(path: object, media: Sequence[Sequence[object]], n: int) -> list[MediaSpan]:
    """A slot header's media spans, checked against its ``n`` tokens (:class:`SlotError`)."""
    spans: list[MediaSpan] = []
    for entry in media:
        start, length, kind, digest = entry
        if not (isinstance(start, int) and isinstance(length, int) and isinstance(kind, str)
                and isinstance(digest, str)) or start < (spans[-1].end if spans else 0) or \
                length < 1 or start + length > n:
            raise SlotError(f"{path}: a media span {list(entry)} does not fit its "
                            f"{n} tokens")
        spans.append(MediaSpan(start, length, kind, digest))
    return spans


def reusable_prefix(common: int, held: Sequence[MediaSpan], wanted: Sequence[MediaSpan]) -> int:
    """How much of a sequence that shares ``common`` leading ids with the held one may be
    kept: cut at the first media span either side has and the other has not identically
    (start, length, kind, digest), and never inside one."""
    keep = common
    have = set(held)
    want = set(wanted)
    changed = True
    while changed:
        changed = False
        for spans, other in ((wanted, have), (held, want)):
            for s in spans:
                if s.start < keep and (s not in other or s.end > keep):
                    keep, changed = s.start, True
    return keep


__all__ = [
    "Element",
    "PrefillPlan",
    "SessionMedia",
    "check_media_kinds",
    "has_media",
    "plan_prefill",
    "reusable_prefix",
    "run_plan",
    "slot_spans",
]
