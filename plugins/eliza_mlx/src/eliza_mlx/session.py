"""The MLX session on mlx-lm: a model loaded once per context, one prompt cache per session.

Prefill runs the prompt through the model into the session's prompt cache
(``make_prompt_cache``) the way mlx-lm's ``generate_step`` does: every token but the last in
``config.batch_size``-token chunks, evaluated one by one with ``cancel()`` checked between them,
then the last token alone, whose logits give the first sample. Greedy decoding without a repeat
penalty takes the argmax on the device; anything else (temperature, top-k/p, min-p, the repeat
penalty) is the core's :class:`~eliza_backends.runtime.sampling.Sampler` on the host, the one
every backend and a batched MLX row use, so a seed gives the same reply whether the session is
batched or not (mlx's own sampler draws from a process-global generator).

Decoding feeds ahead, as ``generate_step`` pipelines: once a token is sampled (lazily), its
forward pass and the sampling of the token after it are queued with ``mx.async_eval`` *before*
Python waits for the token's value, so the model computes while the core assembles text. Prefill
already queues the first token's forward pass (``_ahead``; taken back out of the cache with a
trim if a prefill, rewind or save comes first). A step of n tokens costs n forward passes; the
first token after a prefill is sampled straight from the prefill's logits. The prompt cache
holds the whole :attr:`Session.history` after a step, except when the step surely ends the
stream (the ``max_tokens`` budget or the context window): its last token is then kept back
(``_pending``) and fed with the next prefill, so no forward pass is spent on a token nothing
follows (an end-of-generation token cannot be foreseen and is fed ahead like any other).

Speculative decoding (``drafter="ngram"``, ``"model"`` or ``"mtp"``, greedy only, full-length
trimmable caches, :func:`~eliza_mlx.model.new_prompt_cache`): prefill keeps the prompt's last
token back in ``_pending``. A round drafts ``k`` tokens (the core's
:class:`~eliza_backends.runtime.speculative.NgramDrafter`, a draft MLX folder from
``text/draft/``, :mod:`eliza_mlx.draft`, or Gemma 4's MTP assistant, :mod:`eliza_mlx.mtp`,
through which every forward pass of the model then runs), runs ``[pending, d1..dk]`` in
one call (logits for every position; ``[d1..dk]`` when the last token was already fed ahead and
its successor queued), takes the argmax per position, keeps the agreeing prefix plus the
target's own next token (:func:`~eliza_backends.runtime.speculative.accept_greedy`), trims the
rejected positions off the prompt cache and leaves the last produced token pending. A round with
nothing drafted decodes one token exactly as the plain path does (fed ahead, pipelined).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, cast

import mlx.core as mx  # type: ignore[import-not-found,unused-ignore]
import numpy as np
from mlx_lm.models.cache import (  # type: ignore[import-not-found,unused-ignore]
    can_trim_prompt_cache,
)

from eliza_backends import (
    BackendRuntimeError,
    Capabilities,
    Decoded,
    InferenceContext,
    Session,
    SlotError,
    StreamConfig,
    UnsupportedOperationError,
)
from eliza_backends.backend import Drafter, MediaItem, MediaTokens, Sampler, accept_greedy

from .mlx_thread import on_mlx_thread
from .model import COMPUTE_STREAM, LoadedMLX, TargetLinkedDrafter, new_prompt_cache, trim
from .session_hooks import TokenizerHooks, cut_lazy_cache
from .slot_payload import pack_slot, unpack_slot


def _greedy(logits: Any) -> Any:
    return mx.argmax(logits, axis=-1)


@dataclass
class _Round:
    """One speculative step's state across its rounds: the step's size, whether the stream
    surely ends with it, the queued target of the fed-ahead last token, tokens made so far."""

    max_tokens: int
    ends: bool
    ahead: Any = None
    made: int = 0


class MLXSession(TokenizerHooks, Session):
    """An mlx-lm generation: one prompt cache (KV per layer) on the shared model."""

    backend_name = "mlx-coreml"

    @on_mlx_thread
    def __init__(self, loaded: LoadedMLX, config: StreamConfig,
                 context: InferenceContext | None, drafter: Drafter | None = None) -> None:
        self._loaded = loaded
        self._tokenizer = loaded.tokenizer
        self._speculative = drafter is not None
        # every forward pass of the model: through a drafter that reads the target's own state
        # when there is one (it stages the hidden states it drafts from)
        self._model: Any = drafter.target_forward \
            if isinstance(drafter, TargetLinkedDrafter) else loaded.model
        self._cache: list[Any] = new_prompt_cache(loaded.model, self._speculative)
        self._trimmable = bool(can_trim_prompt_cache(self._cache))
        if drafter is not None and not self._trimmable:
            drafter.close()
            raise UnsupportedOperationError(
                f"{loaded.folder.path.name}: this model's prompt cache cannot be trimmed, so it "
                "cannot verify drafts (capabilities.drafters is {'none'}); use drafter='none'")
        self._last_n = 0  # the repeat penalty's window (0: no penalty)
        if config.repeat_penalty != 1.0 and config.repeat_last_n > 0:
            # a window longer than the context sees the same tokens
            self._last_n = min(config.repeat_last_n, config.context_size)
        #: the core sampler (None: greedy without a penalty, the argmax on the device)
        self._host: Sampler | None = Sampler(config) if not config.greedy or self._last_n \
            else None
        self._n_kv = 0  # positions in the prompt cache (len(history), or one less: _pending)
        self._pending: int | None = None  # the stream's last token, not fed (nothing follows)
        # (token, logits it was sampled from): prefill already queued the forward pass of the
        # first token to come, which is in the cache but not yet in the history
        self._ahead: tuple[Any, Any] | None = None
        self._logits: Any = None  # logits after the last cached token, shape (1, vocab)
        self._y: Any = None  # the next token, sampled (lazily) from _logits
        self._stale = False  # the cache could not be rolled back: only reset() helps
        self._round = _Round(0, False)  # the running speculative step's state
        super().__init__(config, context, loaded.info, drafter=drafter)
        self._seed()

    @property
    def capabilities(self) -> Capabilities:
        drafters = {"none", "ngram", "model", "mtp"} if self._trimmable else {"none"}
        kinds = getattr(self._loaded.model, "kinds", None)  # a multimodal folder (eliza_mlx.vlm)
        return Capabilities(token_input=True, prefix_reuse=True, slots=True,
                            cancel_prefill=False, sampling=True, drafters=frozenset(drafters),
                            logits=True, media=kinds() if kinds is not None else frozenset())

    # ------------------------------------------------------------------ sampling

    def _seed(self) -> None:
        # the sampler's generator starts over from the seed on open and on every rewind
        if self._host is not None:
            self._host.reset()

    def _tail(self, ids: Sequence[int], lazy: Any = None) -> Any:
        """The recent tokens the repetition penalty looks at (``lazy``: a pending token)."""
        keep = self._last_n - (1 if lazy is not None else 0)
        recent = list(ids[-keep:]) if keep > 0 else []
        tail = mx.array(recent, dtype=mx.uint32) if recent else None
        if lazy is None:
            return tail
        return lazy if tail is None else mx.concatenate([tail, lazy])

    def _launch(self, logits: Any, tail: Any) -> None:
        """The next token from ``logits`` (shape (1, vocab)): the argmax queued on the device
        (not waited for) when greedy without a penalty, else the core sampler's draw on the
        host, its repeat penalty over ``tail`` (the recent tokens, :meth:`_tail`)."""
        self._logits = logits
        host = self._host
        if host is None:
            self._y = _greedy(logits)
            mx.async_eval(self._y)  # type: ignore[no-untyped-call,unused-ignore]
            return
        row = np.array(logits[0].astype(mx.float32))
        recent = [] if tail is None else cast(list[int], tail.tolist())
        self._y = mx.array([host.sample(row, recent)], dtype=mx.uint32)

    # ------------------------------------------------------------------ hooks

    @on_mlx_thread
    def _prefill(self, token_ids: list[int]) -> None:
        if self._stale:
            raise BackendRuntimeError("the MLX prompt cache was lost by an interrupted call; "
                                      "call reset() before prefilling again")
        self._undo_ahead()
        model, cache, step = self._model, self._cache, self.config.batch_size
        start = self._n_kv
        history = list(self._sequence)
        feed = token_ids if self._pending is None else [self._pending, *token_ids]
        # As generate_step: every token but the last in chunks (evaluated, cancel between
        # them), then the last token alone, whose logits give the first sample.
        body, last = feed[:-1], feed[-1:]
        try:
            with mx.stream(COMPUTE_STREAM):
                for off in range(0, len(body), step):
                    self._raise_if_cancelled()
                    chunk = body[off:off + step]
                    model(mx.array(chunk, dtype=mx.uint32)[None], cache=cache)
                    self._n_kv = start + off + len(chunk)
                    mx.eval([c.state for c in cache])
                    mx.clear_cache()  # as generate_step: drop the chunk's temporaries
                self._raise_if_cancelled()
                if self._drafter is not None:  # speculative: the first round verifies it
                    self._logits = self._y = None
                    self._pending = last[0]
                    return
                out = model(mx.array(last, dtype=mx.uint32)[None], cache=cache)
                self._n_kv += 1
                if self._guide is not None:  # the guided path samples from masked logits
                    self._logits, self._y = out[:, -1, :], None
                    mx.eval(self._logits)
                    self._pending = None
                    return
                tail = self._tail(history + token_ids) if self._last_n else None
                self._launch(out[:, -1, :], tail)
                # queue the first token's forward pass now, as generate_step does (undone
                # by _undo_ahead, so only while the cache can be trimmed: a sliding layer's
                # past its window cannot, e.g. after an image block before more media; not
                # with the host sampler: an undone draw would shift the seeded sequence)
                if self._trimmable and self._host is None and can_trim_prompt_cache(cache):
                    y, logits = self._y, self._logits
                    nxt = model(y[None], cache=cache)[:, -1, :]
                    self._n_kv += 1
                    self._launch(nxt, None)  # (greedy, no penalty: no tail)
                    self._ahead = (y, logits)
                    mx.eval(y)
                else:
                    mx.eval(self._y)
        except BaseException:
            self._rollback(start)
            raise
        self._pending = None

    @on_mlx_thread
    def _media_tokens(self, item: MediaItem) -> MediaTokens:
        with mx.stream(COMPUTE_STREAM):
            # the loaded model itself: with the MTP drafter self._model is its target_forward
            # (media rows are never staged; a draft after them reads the next text pass's)
            begin, soft, count, end, prepared = self._loaded.model.media_tokens(item.kind,
                                                                                item.data)
        return MediaTokens(before=(begin,), placeholder=soft, count=count, after=(end,),
                           handle=prepared)

    @on_mlx_thread
    def _prefill_media(self, item: MediaItem, tokens: MediaTokens) -> None:
        if self._stale:
            raise BackendRuntimeError("the MLX prompt cache was lost by an interrupted call; "
                                      "call reset() before prefilling again")
        self._undo_ahead()
        start = self._n_kv
        try:
            with mx.stream(COMPUTE_STREAM):
                if self._pending is not None:  # the last sampled token goes in first
                    self._model(mx.array([self._pending], dtype=mx.uint32)[None],
                                cache=self._cache)
                    self._n_kv += 1
                    self._pending = None
                self._raise_if_cancelled()
                self._loaded.model.prefill_embeddings(tokens.handle, self._cache)
                self._n_kv += tokens.count
                self._logits = self._y = None  # the end marker's prefill samples next
        except BaseException:
            self._rollback(start)
            raise

    def _undo_ahead(self) -> None:
        """Take the token prefill fed ahead back out of the cache (nothing consumed it)."""
        if self._ahead is None:
            return
        y, logits = self._ahead
        self._ahead = None
        if trim(self._cache, 1) != 1:
            self._stale = True
            return
        self._n_kv -= 1
        self._y, self._logits = y, logits  # (a sampler draw was spent: deterministic still)

    def _rollback(self, n: int) -> None:
        self._logits = self._y = None
        extra = self._n_kv - n
        if extra > 0:
            if can_trim_prompt_cache(self._cache) and trim(self._cache, extra) == extra:
                self._n_kv = n
            else:
                self._stale = True

    @on_mlx_thread
    def _decode(self, max_tokens: int) -> Decoded:
        if self._guide is not None:
            return self._decode_guided(max_tokens)
        if self._drafter is not None:
            return self._decode_speculative(max_tokens)
        out: list[int] = []
        model, cache, cancelled = self._model, self._cache, self._cancel_requested
        stops = self._stop_tokens
        processors = bool(self._last_n)
        # The stream surely ends after this step (budget or context): its last token is not fed
        # ahead, it waits in _pending for a prefill that continues the sequence.
        ends = self._stream_ends_with(max_tokens)
        with mx.stream(COMPUTE_STREAM):
            for i in range(max_tokens):
                if i and cancelled():
                    self._raise_if_cancelled()
                if self._ahead is not None:  # prefill queued this token's forward pass
                    y, self._ahead = self._ahead[0], None
                    tok = y.item()
                else:
                    y = self._y
                    if ends and i == max_tokens - 1:
                        tok = y.item()
                        out.append(tok)
                        self._pending, self._y, self._logits = tok, None, None
                        break
                    logits = model(y[None], cache=cache)[:, -1, :]
                    self._n_kv += 1
                    tail = self._tail([*self._sequence[-self._last_n:], *out], y) \
                        if processors else None
                    self._launch(logits, tail)
                    tok = y.item()
                out.append(tok)
                if not self._n_kv & 255:
                    mx.clear_cache()  # as generate_step, every 256 tokens
                if tok in stops:
                    break
        return Decoded(out)

    def _decode_guided(self, max_tokens: int) -> Decoded:
        """Decoding through the core's logits hook (a constraint, logprobs): lazy by one, as
        the llama.cpp session. Each step feeds the pending token, queues its forward pass,
        computes the constraint's next mask while it runs, then masks the logits on the host
        and samples them with the session's own sampler; the sampled token stays pending."""
        guide = self._guide
        assert guide is not None
        self._undo_ahead()
        if self._stale:
            raise BackendRuntimeError("the MLX prompt cache was lost by an interrupted call; "
                                      "call reset() before decoding again")
        model, cache, stops = self._model, self._cache, self._stop_tokens
        processors = bool(self._last_n)
        out: list[int] = []
        with mx.stream(COMPUTE_STREAM):
            for i in range(max_tokens):
                if i:
                    self._raise_if_cancelled()
                if self._pending is not None:
                    logits = model(mx.array([self._pending], dtype=mx.uint32)[None],
                                   cache=cache)[:, -1, :]
                    mx.async_eval(logits)  # type: ignore[no-untyped-call,unused-ignore]
                    self._n_kv += 1
                    self._pending = None
                    self._logits = logits
                guide.prepare()  # the mask, while the forward pass runs
                row = guide.process(np.array(self._logits[0].astype(mx.float32)))
                tail = self._tail([*self._sequence, *out]) if processors else None
                self._launch(mx.array(row)[None], tail)
                tok = cast(int, self._y.item())
                guide.accept(tok)
                out.append(tok)
                self._pending, self._y, self._logits = tok, None, None
                if not self._n_kv & 255:
                    mx.clear_cache()  # as generate_step, every 256 tokens
                if tok in stops:
                    break
        return Decoded(out)

    def _decode_speculative(self, max_tokens: int) -> Decoded:
        """The core's speculative loop with this session's verify step (:meth:`_verify`): one
        model call over ``[pending, d1..dk]``, the agreeing prefix plus the target's next token
        kept, the rejected positions trimmed off the prompt cache.

        Between rounds the sequence's last token is either *pending* (not in the cache: the
        next round verifies ``[pending, d1..dk]``) or *fed ahead* (in the cache, the target's
        next token queued lazily in ``_Round.ahead``: the round verifies ``[d1..dk]`` and
        ``ahead`` is the target for d1). A round whose drafter proposes nothing decodes one
        token the way the plain path does, feeding it ahead before waiting for it, so a
        drafter with nothing to say keeps the plain path's pipelining.
        """
        self._round = _Round(max_tokens, self._stream_ends_with(max_tokens),
                             self._start_speculation())
        out = self._speculate(max_tokens, self._verify)
        if self._round.ahead is not None:  # the plain path's state: all cached, next queued
            self._y = self._round.ahead
        return out

    def _start_speculation(self) -> Any:
        """Take back prefill's feed-ahead; the queued target of the sequence's last token when
        that token is in the cache, None when it is pending (after save_slot it is taken back
        out of the cache to be verified with the drafts)."""
        self._undo_ahead()
        if self._stale:
            raise BackendRuntimeError("the MLX prompt cache was lost by an interrupted call; "
                                      "call reset() before decoding again")
        ahead: Any = None
        if self._pending is None:  # the cache holds the whole history
            if self._y is not None:
                ahead = self._y
            else:
                if trim(self._cache, 1) != 1:
                    self._stale = True
                    raise BackendRuntimeError("the MLX prompt cache could not be trimmed")
                self._n_kv -= 1
                self._pending = self._sequence[-1]
        self._logits = self._y = None
        return ahead

    def _verify(self, seq: Sequence[int], drafts: list[int]) -> tuple[list[int], int]:
        r = self._round
        start, pending = self._n_kv, self._pending
        try:
            with mx.stream(COMPUTE_STREAM):
                targets, last = self._forward_drafts(seq, drafts, r.ahead)
                if not drafts:
                    tok = self._feed_ahead(seq, targets[-1:], r)
                    r.made += 1
                    return [tok], 0
                verdict = cast(list[int], targets.tolist())
        except BaseException:
            self._rollback(start)
            self._pending = pending
            if r.made:  # tokens this step made are in the cache, not in the history
                self._stale = True
            raise
        produced, n_ok = accept_greedy(drafts, verdict.__getitem__, self._ends_generation)
        keep = last + len(produced)  # up to the last accepted draft; produced[-1] pends
        extra = self._n_kv - keep  # the rejected drafts (and a fed end token)
        if extra and trim(self._cache, extra) != extra:
            self._stale = True
            raise BackendRuntimeError("the MLX prompt cache could not be trimmed")
        if keep >> 8 != start >> 8:
            mx.clear_cache()  # as generate_step, every 256 tokens
        self._n_kv = keep
        self._pending = produced[-1]
        r.ahead = None
        r.made += len(produced)
        return produced, n_ok

    def _forward_drafts(self, seq: Sequence[int], drafts: list[int], ahead: Any
                        ) -> tuple[Any, int]:
        """The target's token at every position of the round (lazy) and the cache position of
        the sequence's last token: one model call over ``[pending, *drafts]``, or over
        ``drafts`` with ``ahead`` as d1's target when the last token is already fed.
        ``seq``: the sequence so far (its last token is the pending or fed one)."""
        model, cache, start = self._model, self._cache, self._n_kv
        if ahead is None:  # feed the pending token (with the drafts, if any)
            logits = model(mx.array([self._pending, *drafts], dtype=mx.uint32)[None],
                           cache=cache)
            self._n_kv += 1 + len(drafts)
            self._pending = None
            return self._targets(logits[0], seq, drafts), start
        if not drafts:
            return ahead, start - 1
        logits = model(mx.array(drafts, dtype=mx.uint32)[None], cache=cache)
        self._n_kv += len(drafts)
        targets = self._targets(logits[0], [*seq, drafts[0]], drafts[1:])
        return mx.concatenate([ahead, targets]), start - 1

    def _targets(self, logits: Any, before: Sequence[int], inputs: Sequence[int]) -> Any:
        """The greedy token after each row of ``logits`` (shape (n, vocab)): the argmax on
        the device, or with a repeat penalty the core sampler's pick on the host, row ``i``'s
        window ending with ``before + inputs[:i]`` (as the plain path would see it)."""
        host = self._host
        if host is None:
            return _greedy(logits)
        rows = np.array(logits.astype(mx.float32))
        recent = list(before[max(0, len(before) - self._last_n):]) if self._last_n else []
        return mx.array([host.sample(rows[i], recent + list(inputs[:i]))
                         for i in range(rows.shape[0])], dtype=mx.uint32)

    def _feed_ahead(self, seq: Sequence[int], y: Any, r: _Round) -> int:
        """One token decoded the way the plain path does: its forward pass queued before
        waiting for its value (unless it is the stream's last: then it pends). ``seq``: the
        sequence before ``y``."""
        if r.ends and r.made + 1 == r.max_tokens:
            r.ahead = None
            tok: int = y.item()
            self._pending = tok
        else:
            logits = self._model(y[None], cache=self._cache)[:, -1, :]
            r.ahead = _greedy(logits) if self._host is None else \
                self._targets(logits, [*seq, y.item()], ())
            self._n_kv += 1
            mx.async_eval(r.ahead)  # type: ignore[no-untyped-call,unused-ignore]
            tok = y.item()
        if not self._n_kv & 255:
            mx.clear_cache()  # as generate_step, every 256 tokens
        return tok

    @on_mlx_thread
    def _reset(self) -> None:
        self._cache = new_prompt_cache(self._loaded.model, self._speculative)
        self._n_kv = 0
        self._pending = self._ahead = None
        self._logits = self._y = None
        self._stale = False
        self._seed()

    @on_mlx_thread
    def _truncate(self, n_keep: int) -> bool:
        if self._trimmable and self._cache:
            # the cache's own offset is the truth (a call interrupted between a forward pass
            # and the count after it leaves _n_kv behind); the cached positions below n_past
            # hold history tokens
            self._ahead = None
            self._n_kv = int(self._cache[0].offset)
            self._stale = False
        else:
            self._undo_ahead()
        if self._stale:
            return False
        cache = self._cache
        done, pending = cut_lazy_cache(
            self._n_kv, n_keep, self._sequence,
            lambda k: bool(can_trim_prompt_cache(cache)) and trim(cache, k) == k)
        if not done:
            return False
        self._n_kv = min(self._n_kv, n_keep)
        self._pending = pending
        self._logits = self._y = None
        self._seed()
        return True

    # ------------------------------------------------------------------ slots

    @on_mlx_thread
    def _save_state(self) -> bytes:
        """mlx-lm's prompt-cache safetensors file, plus the logits of the last token."""
        self._undo_ahead()
        if self._pending is not None and not self._stale:  # feed the stream's last token
            with mx.stream(COMPUTE_STREAM):
                out = self._model(mx.array([self._pending], dtype=mx.uint32)[None],
                                  cache=self._cache)
                self._n_kv += 1
                self._pending = None
                self._logits = out[:, -1, :]
                mx.eval(self._logits)
        history = self._sequence
        if self._stale or self._n_kv != len(history):
            raise SlotError("the MLX prompt cache does not match the history (interrupted "
                            "call); reset() or prefill again before saving")
        if self._logits is None:  # after reset_keep: recompute the last token's logits
            if not can_trim_prompt_cache(self._cache):
                raise SlotError("this model's cache cannot be trimmed; prefill before saving")
            with mx.stream(COMPUTE_STREAM):
                trim(self._cache, 1)
                out = self._model(mx.array(list(history[-1:]), dtype=mx.uint32)[None],
                                  cache=self._cache)
                self._logits = out[:, -1, :]
                mx.eval(self._logits)
        return pack_slot(self._cache, self._n_kv, self._logits)

    @on_mlx_thread
    def _restore_state(self, payload: bytes, tokens: list[int]) -> None:
        cache, logits, n_kv = unpack_slot(payload, len(tokens))
        fresh = new_prompt_cache(self._loaded.model, self._speculative)
        if len(cache) != len(fresh) or any(type(a) is not type(b)
                                            for a, b in zip(cache, fresh, strict=True)):
            raise SlotError("the saved prompt cache does not fit this model's layers")
        offsets = {getattr(c, "offset", n_kv) for c in cache}
        if offsets != {n_kv} or tuple(logits.shape) != (1, self.vocab_size):
            raise SlotError("the saved prompt cache does not match its token history")
        self._cache = cache
        self._n_kv = n_kv
        self._pending = self._ahead = None
        self._stale = False
        self._seed()
        with mx.stream(COMPUTE_STREAM):
            self._launch(logits, self._tail(tokens) if self._last_n else None)
            mx.eval(self._y)

    # ------------------------------------------------------------------ teardown

    @on_mlx_thread
    def _close(self) -> None:
        self._cache = []
        self._logits = self._y = None


__all__ = ["MLXSession"]
