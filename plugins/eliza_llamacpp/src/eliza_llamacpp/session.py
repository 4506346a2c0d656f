"""The llama.cpp session on llama-cpp-python's low-level API.

A session drives one sequence of a ``llama_context`` through a
:class:`~eliza_llamacpp.lane.Lane`: its own context (:class:`~eliza_llamacpp.solo.SoloLane`,
sequence 0) or, on an :class:`InferenceContext` with ``parallel > 1``, one sequence of a
context shared with other sessions and decoded in batched steps
(:class:`~eliza_llamacpp.batch_engine.SharedLane`). One sampler chain built from the
:class:`StreamConfig` per session, and the weights shared through the context
(:mod:`eliza_llamacpp.model`). Everything here (sampling, stop tokens, the logits hook,
drafting) is the same on both lanes: it runs in the decode's ``then`` callback, on the rows of
this sequence.

Greedy decoding without a repeat penalty reads the token straight off the logits (numpy
``argmax`` over ``llama_get_logits_ith``, the first maximum, as llama.cpp's greedy sampler picks):
the sampler chain builds a candidate array of the whole vocabulary per token, measured
0.45 ms a token on SmolLM2's 49k vocabulary and 2.7 ms on Gemma 3's 262k (argmax: 0.01-0.15 ms;
benchmarks/bench_llamacpp.py shows the effect).

Decoding is lazy by one token (:class:`~eliza_backends.runtime.kv_cursor.KVCursor`): the last
sampled token is fed to the model at the start of the next step, so a step of n tokens costs n
samples and n decodes, and the first token after a prefill is sampled straight from the prefill's
logits (no extra decode before it; on a shared context, where the next step overwrites them, the
prefill keeps a copy of its last row). With a drafter, the core's speculative loop drafts and
this session verifies ``[pending, d1..dk]`` in one batched ``llama_decode``.
"""

from __future__ import annotations

import contextlib
import ctypes
import struct
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any

import numpy as np

from eliza_backends import (
    CancelledError,
    Capabilities,
    Decoded,
    InferenceContext,
    Session,
    SessionClosedError,
    SlotError,
    StreamConfig,
    UnsupportedOperationError,
)
from eliza_backends.backend import (
    Drafter,
    KVCursor,
    MediaItem,
    MediaTokens,
    Sampler,
    accept_greedy,
    accept_sampled,
)

from .bindings import lc
from .lane import Lane, TargetLinkedDrafter
from .model import LoadedModel
from .mtmd import MediaFeeder

if TYPE_CHECKING:  # the step scheduler is imported by the batched path only (issue 42)
    from eliza_backends.backend import StepScheduler

#: Logits row views a session keeps (by address; see ``LlamaCppSession._row``): the rows of a
#: verify batch, with room to spare.
_ROW_VIEWS_KEPT = 64
#: ``llama_token_data`` as a numpy record (id, logit, p), for sampling a saved logits row.
_TOKEN_DATA = np.dtype([("id", "<i4"), ("logit", "<f4"), ("p", "<f4")])


class LlamaCppSession(Session):
    """A llama.cpp generation: one sequence, on its own context or a shared one (``lane``)."""

    backend_name = "llama.cpp"

    def __init__(self, model: LoadedModel, config: StreamConfig, lane: Lane,
                 context: InferenceContext | None, drafter: Drafter | None = None, *,
                 linked: Callable[[Any], TargetLinkedDrafter] | None = None,
                 media: MediaFeeder | None = None) -> None:
        """``lane``: the sequence the session decodes, its own context or one sequence of a
        shared one (the session owns it from here: it closes it). ``drafter``: a drafter of
        its own (n-gram, draft model); ``linked``: builds one on this session's
        ``llama_context`` instead (the MTP assistant; own contexts only), told of every
        decode. ``media``: images / audio through the bundle's projector (not with a linked
        drafter, which would not see the media's positions)."""
        self._model = model
        #: the sliding window of the model's SWA layers (0: none; see _state_min_keep)
        self._n_swa = int(lc.llama_model_n_swa(model.ptr))
        self._media = media if linked is None else None
        # speculative rounds with sampling go through the core's numpy sampler (the standard
        # acceptance rule needs the target's probabilities)
        self._spec_sampler = Sampler(config) if (drafter or linked) is not None and \
            not config.greedy else None
        # the repeat penalty is the core's (Sampler.penalize: the last repeat_last_n tokens of
        # the sequence, prompt included), applied to the logits row in place on every path
        self._penalty = Sampler(config) if config.repeat_penalty != 1.0 and \
            config.repeat_last_n > 0 else None
        #: the tokens between the session's sequence and the row being sampled (this step's)
        self._extra: Sequence[int] = ()
        self._linked: TargetLinkedDrafter | None = None
        self._sampler: Any = None
        self._lane = lane
        self._row_views: dict[int, np.ndarray] = {}
        try:
            self._sampler = self._build_sampler(config)
            if linked is not None:
                if lane.batched:
                    raise UnsupportedOperationError(
                        "a drafter that reads the session's llama.cpp context (mtp) needs a "
                        "context of its own: open the session with parallel=1")
                drafter = self._linked = lane.linked = linked(lane.ctx)
        except BaseException:
            self._close()
            raise
        self._batched = lane.batched
        # the chain is exactly llama.cpp's greedy sampler then: the argmax gives its token
        self._argmax = config.greedy
        self._cursor = KVCursor()
        #: The last prefill's logits row, copied (a shared context's next step overwrites it);
        #: None on an own context, where the row stays readable, and once it was used.
        self._saved: np.ndarray | None = None
        super().__init__(config, context, model.info, context_size=lane.n_ctx,
                         drafter=drafter)
        # llama.cpp polls this inside llama_decode: the core's C-level cancel probe, so no
        # Python code (where a KeyboardInterrupt would be printed and lost) runs in it
        self._abort = lane.abort = lc.ggml_abort_callback(self._cancel_probe)

    @property
    def capabilities(self) -> Capabilities:
        drafters = {"none", "ngram", "model"} if self._batched else {
            "none", "ngram", "model", "mtp"}
        return Capabilities(token_input=True, prefix_reuse=True, slots=True,
                            cancel_prefill=True, sampling=True, drafters=frozenset(drafters),
                            logits=True, batched=self._batched,
                            media=self._media.kinds if self._media is not None else frozenset())

    @property
    def scheduler(self) -> StepScheduler | None:
        """The step scheduler of the shared context this session decodes on (its records
        and :meth:`~eliza_backends.backend.StepScheduler.stats`); None on an own context."""
        return self._lane.scheduler

    # ------------------------------------------------------------------ hooks

    def _build_sampler(self, config: StreamConfig) -> Any:
        chain = lc.llama_sampler_chain_init(lc.llama_sampler_chain_default_params())
        add = lc.llama_sampler_chain_add
        if config.greedy:
            add(chain, lc.llama_sampler_init_greedy())
            return chain
        if config.top_k > 0:
            add(chain, lc.llama_sampler_init_top_k(config.top_k))
        if config.top_p < 1.0:
            add(chain, lc.llama_sampler_init_top_p(config.top_p, 1))
        if config.min_p > 0.0:
            add(chain, lc.llama_sampler_init_min_p(config.min_p, 1))
        add(chain, lc.llama_sampler_init_temp(config.temperature))
        add(chain, lc.llama_sampler_init_dist(config.seed))
        return chain

    def _stopped(self, exc: BaseException) -> None:
        """A lane's CancelledError becomes the session's own (with its reason)."""
        if isinstance(exc, CancelledError):
            self._raise_if_cancelled()

    def _prefill(self, token_ids: list[int]) -> None:
        kv, lane = self._cursor, self._lane
        tokens = kv.pending + token_ids
        start = kv.n_kv
        self._saved = None
        try:
            self._saved = lane.decode(tokens, start, "last", self._keep_row,
                                      self._cancel_requested)
        except BaseException as exc:
            self._undo_decode(start, exc)
            raise
        kv.n_kv = start + len(tokens)
        kv.pending = []

    def _undo_decode(self, start: int, exc: BaseException) -> None:
        """After a prefill decode at ``start`` failed: drop what it may have written, put the
        cursor back, and make a lane's CancelledError the session's own."""
        with contextlib.suppress(SessionClosedError):
            self._lane.drop(start)
        self._cursor.n_kv = start
        self._stopped(exc)

    def _media_tokens(self, item: MediaItem) -> MediaTokens:
        assert self._media is not None  # (the core checked capabilities.media)
        return self._media.tokens(item)

    def _prefill_media(self, item: MediaItem, tokens: MediaTokens) -> None:
        kv, lane = self._cursor, self._lane
        assert self._media is not None
        if kv.pending:  # the last sampled token goes in first
            self._prefill([])
        start = kv.n_kv
        self._saved = None
        try:
            kv.n_kv = self._media.decode(lane, item, tokens, start, self._cancel_requested)
        except BaseException as exc:
            self._undo_decode(start, exc)
            raise

    def _keep_row(self, last_row: int) -> np.ndarray | None:
        """A prefill's ``then``: a copy of its last logits row where the next step overwrites
        them (a shared context)."""
        return None if self._lane.keeps_logits else self._row(last_row).copy()

    def _row(self, i: int) -> np.ndarray:
        """Output row ``i`` of the last decode (a view; -1: its last row). Made with
        ``np.frombuffer`` on a ctypes array at the row's address, as ``np.ctypeslib.as_array``
        makes it, without importing ``numpy.ctypeslib`` on the first token's path; kept by
        address (:attr:`_row_views`), since llama.cpp writes every decode's logits into the same
        buffer: a token's sampling reuses the view of the last one (a view is only handed out
        for the address llama.cpp just gave, so a buffer llama.cpp reallocated is never read)."""
        address = ctypes.addressof(lc.llama_get_logits_ith(self._lane.ctx, i).contents)
        views = self._row_views
        view = views.get(address)
        if view is None:
            if len(views) >= _ROW_VIEWS_KEPT:
                views.clear()
            floats = (ctypes.c_float * self.vocab_size).from_address(address)
            view = views[address] = np.frombuffer(memoryview(floats), dtype=np.float32)
        return view

    def _decode(self, max_tokens: int) -> Decoded:
        out = self._decode_tokens(max_tokens)
        if self._batched and out.tokens and (self._ends_generation(out.tokens[-1]) or (
                len(out.tokens) >= max_tokens and self._stream_ends_with(max_tokens))):
            self._lane.idle()  # the stream ends: the next step need not wait for it
        return out

    def _decode_tokens(self, max_tokens: int) -> Decoded:
        if self._drafter is None:
            return self._decode_plain(max_tokens)
        draft_length = min(self.config.draft_length, self._lane.draft_cap)
        if self._cursor.pending:
            return self._speculate(max_tokens, self._verify, draft_length=draft_length)
        first = self._decode_plain(1)  # the first token after a prefill: its logits are ready
        if max_tokens == 1 or self._ends_generation(first.tokens[0]):
            return first
        return self._speculate(max_tokens, self._verify, draft_length=draft_length,
                               after=first.tokens)

    def _pick(self, i: int) -> int:
        """The token for output row ``i`` of the last decode (-1: its last row): the logits
        hook, the repeat penalty, then the argmax or the sampler chain."""
        guide = self._guide
        if guide is None and self._penalty is None:
            if self._argmax:
                return int(self._row(i).argmax())
            return int(lc.llama_sampler_sample(self._sampler, self._lane.ctx, i))
        if guide is not None:
            guide.process(self._row(i))  # the core's logits hook: masked in place
        self._penalize(self._row(i))
        tok = int(self._row(i).argmax()) if self._argmax else int(
            lc.llama_sampler_sample(self._sampler, self._lane.ctx, i))
        if guide is not None:
            guide.accept(tok)
        return tok

    def _penalize(self, row: np.ndarray) -> None:
        """The repeat penalty on ``row`` in place (none set: nothing): the core sampler's, over
        the sequence so far and then :attr:`_extra`, the tokens before this row."""
        penalty = self._penalty
        if penalty is not None:
            seq, n = self._sequence, self.config.repeat_last_n
            penalty.penalize(row, [*seq[max(0, len(seq) - n):], *self._extra], in_place=True)

    def _pick_saved(self, row: np.ndarray) -> int:
        """:meth:`_pick` on a saved logits row."""
        guide = self._guide
        if guide is not None:
            guide.process(row)
        self._penalize(row)
        tok = int(row.argmax()) if self._argmax else self._sample_row(row)
        if guide is not None:
            guide.accept(tok)
        return tok

    def _sample_row(self, row: np.ndarray) -> int:
        """The sampler chain over a logits row outside the context: what
        ``llama_sampler_sample`` does with a context's row (candidates, apply, accept)."""
        n = len(row)
        data = np.empty(n, dtype=_TOKEN_DATA)
        data["id"] = np.arange(n, dtype=np.int32)
        data["logit"] = row
        data["p"] = 0.0
        cur = lc.llama_token_data_array(
            data=data.ctypes.data_as(ctypes.POINTER(lc.llama_token_data)), size=n,
            selected=-1, sorted=False)
        lc.llama_sampler_apply(self._sampler, ctypes.byref(cur))
        tok = int(cur.data[cur.selected].id)
        lc.llama_sampler_accept(self._sampler, tok)
        return tok

    def _decode_plain(self, max_tokens: int) -> Decoded:
        kv, lane, pick, cancelled = self._cursor, self._lane, self._pick, self._cancel_requested
        fed: list[int] = []  # the token sampled in the last feed's decode, not yet taken
        self._extra = ()  # then the step's tokens so far (the loop's own list, below)

        def feed() -> None:
            """Decode the tokens the KV cache does not hold yet (usually the one sampled
            last) and sample the next token from its row."""
            self._saved = None
            if len(kv.pending) > 1:  # after restore_slot / reset_keep beyond the cache
                self._prefill([])
                return
            try:
                fed.append(lane.decode(kv.pending, kv.n_kv, "last", pick, cancelled))
            except BaseException as exc:
                self._stopped(exc)
                raise
            kv.n_kv += 1
            kv.pending = []

        def sample(out: list[int]) -> int:
            self._extra = out  # (the same list all step: the next feed's pick sees it grow)
            if fed:
                return fed.pop()
            saved, self._saved = self._saved, None
            return pick(-1) if saved is None else self._pick_saved(saved)

        return Decoded(kv.decode(max_tokens, feed, sample, self._stop_tokens,
                                 self._raise_if_cancelled))

    def _verify(self, seq: Sequence[int], drafts: list[int]) -> tuple[list[int], int]:
        """One batched decode over ``[pending, d1..dk]`` (logits for every position), the
        acceptance rule in its callback, then the KV cache rolled back past the rejected
        drafts."""
        kv, lane = self._cursor, self._lane
        fed = [kv.pending[0], *drafts]
        self._saved = None
        try:
            produced, n_ok = lane.decode(
                fed, kv.n_kv, "all", lambda last: self._accept(seq, drafts, last - len(drafts)),
                self._cancel_requested)
        except BaseException as exc:
            with contextlib.suppress(SessionClosedError):
                lane.drop(kv.n_kv)
            self._stopped(exc)
            raise
        keep = kv.n_kv + len(produced)  # the pending token + every produced but the last
        if len(drafts) >= len(produced):
            lane.drop(keep)
        kv.n_kv = keep
        kv.pending = [produced[-1]]
        return produced, n_ok

    def _accept(self, seq: Sequence[int], drafts: list[int], base: int
                ) -> tuple[list[int], int]:
        """The acceptance rule over the verify rows ``base..base+k``."""
        sampler, pick = self._spec_sampler, self._pick
        if sampler is None or not drafts:
            # greedy, or a plain round (the policy's k = 0) that needs no probabilities: the
            # pick of the path without a drafter (the numpy sampler costs ~5 ms a token at a
            # 262k vocabulary), its repeat penalty seeing this step's tokens and the drafts
            done = list(seq[len(self._sequence):])

            def target(i: int) -> int:
                self._extra = [*done, *drafts[:i]]
                return pick(base + i)

            return accept_greedy(drafts, target, self._ends_generation)
        recent = self.config.repeat_last_n
        window = list(seq[len(seq) - recent:])

        def distribution(i: int) -> tuple[Any, Any]:
            return sampler.distribution(self._row(base + i), window + drafts[:i])

        return accept_sampled(drafts, distribution, sampler, self._ends_generation)

    def _batch_cost(self, max_n: int) -> list[float] | None:
        kv = self._cursor
        if not kv.pending:
            return None
        return self._lane.batch_cost(kv.pending[0], kv.n_kv,
                                     min(max_n, self.context_size - kv.n_kv))

    def _reset(self) -> None:
        if self._spec_sampler is not None:
            self._spec_sampler.reset()
        self._lane.clear()
        lc.llama_sampler_reset(self._sampler)
        self._cursor.reset()
        self._saved = None

    def _truncate(self, n_keep: int) -> bool:
        # llama.cpp's own count of the cached positions is the truth (a call interrupted
        # between a decode and the cursor's update leaves the cursor behind or ahead); the
        # cached positions below n_past hold history tokens, everything past n_keep goes
        kv, lane = self._cursor, self._lane
        kv.n_kv = lane.pos_max() + 1
        if not self._window_holds(min(n_keep, kv.n_kv)):
            return False  # a restored sliding-window cache lacks the window before n_keep
        kv.truncate(self._sequence, n_keep)
        self._saved = None
        lane.idle()
        if not lane.drop(kv.n_kv):
            return False
        lc.llama_sampler_reset(self._sampler)
        return True

    def _token_bytes(self, token_id: int) -> bytes:
        return self._model.piece(token_id)

    def _tokenize(self, text: str, add_special: bool, parse_special: bool) -> list[int]:
        return self._model.tokenize(text, add_special, parse_special)

    # ------------------------------------------------------------------ slots

    def _save_state(self) -> bytes:
        state = self._lane.save()
        if not state:
            raise SlotError("llama.cpp could not serialise the sequence state")
        return b"".join((struct.pack("<I", self._cursor.n_kv), state))  # the one copy

    def _window_holds(self, n: int) -> bool:
        """Whether the sequence can decode position ``n`` after its cache is cut there: a
        sliding-window layer attends to the ``n_swa - 1`` positions before it, so they must
        all be held (llama.cpp's saved state of a sequence keeps only the window's last
        positions of its SWA cache, so a restored one starts past 0)."""
        if not self._n_swa or n <= 0:
            return True
        low = self._lane.pos_min()
        return low <= 0 or low + self._n_swa - 1 <= n

    def _state_min_keep(self) -> int:
        if not self._n_swa:
            return 0
        n_kv = self._cursor.n_kv  # the state llama.cpp writes drops the masked positions
        first = max(self._lane.pos_min(), n_kv - self._n_swa)
        return 0 if first <= 0 else first + self._n_swa - 1

    def _restore_state(self, payload: bytes, tokens: list[int]) -> None:
        if len(payload) < 4:
            raise SlotError("slot payload is too short for a llama.cpp state")
        (n_kv,) = struct.unpack_from("<I", payload)
        if not 1 <= n_kv <= len(tokens):
            raise SlotError(f"slot says {n_kv} cached tokens for a history of {len(tokens)}")
        self._saved = None
        if not self._lane.load(memoryview(payload)[4:], tokens[:n_kv]):
            self._reset()
            raise SlotError("llama.cpp refused the saved state (a different context size or "
                            "model configuration?); prefill again")
        lc.llama_sampler_reset(self._sampler)
        if self._cursor.restore(tokens, n_kv):  # logits of the last token are not saved
            self._lane.drop(n_kv - 1)

    # ------------------------------------------------------------------ teardown

    def _close(self) -> None:
        self._row_views.clear()
        if self._sampler is not None:
            lc.llama_sampler_free(self._sampler)
            self._sampler = None
        self._lane.close()

    def __del__(self) -> None:
        try:
            if not self.closed:
                self.close()
        except Exception:
            pass


__all__ = ["LlamaCppSession"]
