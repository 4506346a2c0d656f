"""The llama.cpp session on llama-cpp-python's low-level API.

One ``llama_context`` per session (its own KV cache, sequence 0), one sampler chain built from
the :class:`StreamConfig`, and the weights shared through the :class:`InferenceContext`
(:mod:`eliza_llamacpp.model`).

Greedy decoding without a repeat penalty reads the token straight off the logits (numpy
``argmax`` over ``llama_get_logits_ith``, the first maximum, as llama.cpp's greedy sampler picks):
the sampler chain builds a candidate array of the whole vocabulary per token, measured
0.45 ms a token on SmolLM2's 49k vocabulary and 2.7 ms on Gemma 3's 262k (argmax: 0.01-0.15 ms;
benchmarks/bench_llamacpp.py shows the effect).

Decoding is lazy by one token (:class:`~eliza_backends.runtime.kv_cursor.KVCursor`): the last
sampled token is fed to the model at the start of the next step, so a step of n tokens costs n
samples and n decodes, and the first token after a prefill is sampled straight from the prefill's
logits (no extra decode before it). With a drafter, the core's speculative loop drafts and this
session verifies ``[pending, d1..dk]`` in one batched ``llama_decode``.
"""

from __future__ import annotations

import ctypes
import struct
from collections.abc import Callable, Sequence
from typing import Any

import llama_cpp as lc
import numpy as np

from eliza_backends import (
    BackendRuntimeError,
    Capabilities,
    Decoded,
    InferenceContext,
    Session,
    SlotError,
    StreamConfig,
)
from eliza_backends.backend import Drafter, KVCursor, Sampler, accept_greedy, accept_sampled

from .model import (
    LoadedModel,
    Outputs,
    TargetLinkedDrafter,
    fill_batch,
    new_context,
    one_token_batch,
)
from .options import LlamaCppOptions

_DECODE_ABORTED = 2


class LlamaCppSession(Session):
    """A llama.cpp generation: one ``llama_context``, sequence 0."""

    backend_name = "llama.cpp"

    def __init__(self, model: LoadedModel, config: StreamConfig, options: LlamaCppOptions,
                 context: InferenceContext | None, drafter: Drafter | None = None, *,
                 linked: Callable[[Any], TargetLinkedDrafter] | None = None) -> None:
        """``drafter``: a drafter of its own (n-gram, draft model); ``linked``: builds one on
        this session's ``llama_context`` instead (the MTP assistant), told of every decode."""
        self._model = model
        # speculative rounds with sampling or a repeat penalty go through the core's numpy
        # sampler (the standard acceptance rule needs the target's probabilities)
        self._spec_sampler = Sampler(config) if (drafter or linked) is not None and not (
            config.greedy and config.repeat_penalty == 1.0) else None
        self._linked: TargetLinkedDrafter | None = None
        self._ctx: Any = None
        self._sampler: Any = None
        self._batch: Any = None
        self._one: Any = None
        ctx = new_context(model, config, "a context", n_ubatch=options.n_ubatch,
                          flash_attention=options.flash_attention,
                          kv_cache_type=options.kv_cache_type)
        self._ctx = ctx
        self._mem = lc.llama_get_memory(ctx)
        self._n_batch = lc.llama_n_batch(ctx)
        self._batch = lc.llama_batch_init(self._n_batch, 0, 1)
        self._one = one_token_batch()
        self._sampler = self._build_sampler(config)
        # the chain is exactly llama.cpp's greedy sampler then: the argmax gives its token
        self._argmax = config.greedy and config.repeat_penalty == 1.0
        self._cursor = KVCursor()
        if linked is not None:
            try:
                drafter = self._linked = linked(ctx)
            except BaseException:
                self._close()
                raise
        super().__init__(config, context, model.info, context_size=lc.llama_n_ctx(ctx),
                         drafter=drafter)
        # llama.cpp polls this inside llama_decode: the core's C-level cancel probe, so no
        # Python code (where a KeyboardInterrupt would be printed and lost) runs in it
        self._abort = lc.ggml_abort_callback(self._cancel_probe)

    @property
    def capabilities(self) -> Capabilities:
        return Capabilities(token_input=True, prefix_reuse=True, slots=True,
                            cancel_prefill=True, sampling=True,
                            drafters=frozenset({"none", "ngram", "model", "mtp"}),
                            logits=True)

    # ------------------------------------------------------------------ hooks

    def _build_sampler(self, config: StreamConfig) -> Any:
        chain = lc.llama_sampler_chain_init(lc.llama_sampler_chain_default_params())
        add = lc.llama_sampler_chain_add
        if config.repeat_penalty != 1.0:
            add(chain, lc.llama_sampler_init_penalties(
                self._model.info.vocab_size, config.repeat_last_n, config.repeat_penalty, 0.0,
                0.0))
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

    def _prefill(self, token_ids: list[int]) -> None:
        kv = self._cursor
        tokens = kv.pending + token_ids
        start = kv.n_kv
        batch, cap = self._batch, self._n_batch
        lc.llama_set_abort_callback(self._ctx, self._abort, None)
        try:
            for off in range(0, len(tokens), cap):
                self._raise_if_cancelled()
                chunk = tokens[off:off + cap]
                last = off + len(chunk) == len(tokens)
                outputs: Outputs = "last" if last else "none"
                fill_batch(batch, chunk, start + off, outputs)
                self._check_decode(lc.llama_decode(self._ctx, batch))
                kv.n_kv = start + off + len(chunk)
                if self._linked is not None:
                    self._linked.target_decoded(start + off, chunk, outputs)
        except BaseException:
            lc.llama_memory_seq_rm(self._mem, 0, start, -1)
            kv.n_kv = start
            raise
        finally:
            lc.llama_set_abort_callback(self._ctx, lc.ggml_abort_callback(), None)
        kv.pending = []

    def _check_decode(self, status: int) -> None:
        if status == 0:
            return
        if status == _DECODE_ABORTED:
            self._raise_if_cancelled()
        raise BackendRuntimeError(f"llama_decode failed with status {status}"
                                  + (" (no KV slot: context full)" if status == 1 else ""))

    def _decode(self, max_tokens: int) -> Decoded:
        if self._drafter is None:
            return self._decode_plain(max_tokens)
        draft_length = min(self.config.draft_length, self._n_batch - 1)
        if self._cursor.pending:
            return self._speculate(max_tokens, self._verify, draft_length=draft_length)
        first = self._decode_plain(1)  # the first token after a prefill: its logits are ready
        if max_tokens == 1 or self._ends_generation(first.tokens[0]):
            return first
        return self._speculate(max_tokens, self._verify, draft_length=draft_length,
                               after=first.tokens)

    def _sample_at(self, i: int) -> int:
        """The token for output row ``i`` of the last decode (-1: the last row)."""
        if self._argmax:
            logits = np.ctypeslib.as_array(lc.llama_get_logits_ith(self._ctx, i),
                                           shape=(self.vocab_size,))
            return int(logits.argmax())
        tok: int = lc.llama_sampler_sample(self._sampler, self._ctx, i)
        return tok

    def _decode_plain(self, max_tokens: int) -> Decoded:
        sample_at, ctx, guide = self._sample_at, self._ctx, self._guide

        def sample(_out: list[int]) -> int:
            return sample_at(-1)

        if guide is not None:  # the core's logits hook: masked in place, then sampled as usual
            n_vocab = self.vocab_size

            def sample(_out: list[int]) -> int:
                guide.process(np.ctypeslib.as_array(lc.llama_get_logits_ith(ctx, -1),
                                                    shape=(n_vocab,)))
                tok = sample_at(-1)
                guide.accept(tok)
                return tok

        return Decoded(self._cursor.decode(max_tokens, self._feed_pending, sample,
                                       self._stop_tokens, self._raise_if_cancelled))

    def _feed_pending(self) -> None:
        """Decode the tokens the KV cache does not hold yet (usually the one sampled last)."""
        kv, one = self._cursor, self._one
        if len(kv.pending) > 1:  # after restore_slot / reset_keep beyond the cache
            self._prefill([])
            return
        one.token[0] = kv.pending[0]
        one.pos[0] = kv.n_kv
        status = lc.llama_decode(self._ctx, one)
        if status:
            self._check_decode(status)
        if self._linked is not None:
            self._linked.target_decoded(kv.n_kv, kv.pending, "last")
        kv.n_kv += 1
        kv.pending = []

    def _verify(self, seq: Sequence[int], drafts: list[int]) -> tuple[list[int], int]:
        """One batched decode over ``[pending, d1..dk]`` (logits for every position), the
        acceptance rule, then the KV cache rolled back past the rejected drafts."""
        ctx, kv = self._ctx, self._cursor
        fed = [kv.pending[0], *drafts]
        fill_batch(self._batch, fed, kv.n_kv, "all")
        status = lc.llama_decode(ctx, self._batch)
        if status:
            lc.llama_memory_seq_rm(self._mem, 0, kv.n_kv, -1)
            self._check_decode(status)
        if self._linked is not None:
            self._linked.target_decoded(kv.n_kv, fed, "all")
        sampler = self._spec_sampler
        if sampler is None or (not drafts and self.config.repeat_penalty == 1.0):
            # greedy, or a plain round (the policy's k = 0) that needs no probabilities: the
            # C sampler chain, as without a drafter (the numpy one costs ~5 ms a token at a
            # 262k vocabulary); with a repeat penalty the chain would not have seen the drafted
            # rounds' tokens, so those rounds stay with the numpy sampler
            produced, n_ok = accept_greedy(drafts, self._sample_at, self._ends_generation)
        else:
            n_vocab, recent = self.vocab_size, self.config.repeat_last_n
            window = list(seq[len(seq) - recent:])

            def distribution(i: int) -> tuple[Any, Any]:
                logits = np.ctypeslib.as_array(lc.llama_get_logits_ith(ctx, i),
                                               shape=(n_vocab,))
                return sampler.distribution(logits, window + drafts[:i])

            produced, n_ok = accept_sampled(drafts, distribution, sampler,
                                            self._ends_generation)
        keep = kv.n_kv + len(produced)  # the pending token + every produced but the last
        if len(drafts) >= len(produced):
            lc.llama_memory_seq_rm(self._mem, 0, keep, -1)
        kv.n_kv = keep
        kv.pending = [produced[-1]]
        return produced, n_ok

    def _batch_cost(self, max_n: int) -> list[float] | None:
        """Time ``llama_decode`` over n = 1..max_n copies of the pending token at the free
        positions after the cache (logits for all), dropping them after each call. The sizes
        take turns (1, 2, .. max_n, 1, 2, ..; one unmeasured turn first) so that a busy spell
        on a shared machine hits every size alike, and each size keeps its fastest of 4 (the
        minimum is the cost, the rest is other work). The curve is not made monotone: ggml's
        repacked quantized matmuls take rows in groups, so a longer batch can cost less than a
        shorter one (Gemma 3 270M Q4_K_M, 1 thread: 4 tokens 3.1x one, 3 tokens 4.3x), and the
        policy should see that."""
        import time

        kv, batch, ctx = self._cursor, self._batch, self._ctx
        max_n = min(max_n, self._n_batch, self.context_size - kv.n_kv)
        if max_n < 2 or not kv.pending:
            return None
        best = [float("inf")] * max_n
        try:
            for turn in range(5):
                for n in range(1, max_n + 1):
                    fill_batch(batch, [kv.pending[0]] * n, kv.n_kv, "all")
                    t0 = time.perf_counter()
                    status = lc.llama_decode(ctx, batch)
                    dt = time.perf_counter() - t0
                    lc.llama_memory_seq_rm(self._mem, 0, kv.n_kv, -1)
                    if status:
                        return None
                    if turn:
                        best[n - 1] = min(best[n - 1], dt)
        finally:
            lc.llama_memory_seq_rm(self._mem, 0, kv.n_kv, -1)
        return best

    def _reset(self) -> None:
        if self._spec_sampler is not None:
            self._spec_sampler.reset()
        lc.llama_memory_clear(self._mem, True)
        lc.llama_sampler_reset(self._sampler)
        self._cursor.reset()

    def _truncate(self, n_keep: int) -> bool:
        # llama.cpp's own count of the cached positions is the truth (a call interrupted
        # between a decode and the cursor's update leaves the cursor behind or ahead); the
        # cached positions below n_past hold history tokens, everything past n_keep goes
        kv = self._cursor
        kv.n_kv = lc.llama_memory_seq_pos_max(self._mem, 0) + 1
        kv.truncate(self._sequence, n_keep)
        if not lc.llama_memory_seq_rm(self._mem, 0, kv.n_kv, -1):
            return False
        lc.llama_sampler_reset(self._sampler)
        return True

    def _token_bytes(self, token_id: int) -> bytes:
        return self._model.piece(token_id)

    def _tokenize(self, text: str, add_special: bool, parse_special: bool) -> list[int]:
        data = text.encode("utf-8")
        vocab = self._model.vocab
        cap = len(data) + 8
        buf = (lc.llama_token * cap)()
        n = lc.llama_tokenize(vocab, data, len(data), buf, cap, add_special, parse_special)
        if n < 0:
            cap = -n
            buf = (lc.llama_token * cap)()
            n = lc.llama_tokenize(vocab, data, len(data), buf, cap, add_special, parse_special)
        if n < 0:
            raise BackendRuntimeError(f"llama_tokenize failed ({n})")
        return list(buf[:n])

    # ------------------------------------------------------------------ slots

    def _save_state(self) -> bytes:
        size = lc.llama_state_seq_get_size(self._ctx, 0)
        buf = (ctypes.c_uint8 * size)()
        written = lc.llama_state_seq_get_data(self._ctx, buf, size, 0)
        if written == 0:
            raise SlotError("llama.cpp could not serialise the sequence state")
        return struct.pack("<I", self._cursor.n_kv) + bytes(buf[:written])

    def _restore_state(self, payload: bytes, tokens: list[int]) -> None:
        if len(payload) < 4:
            raise SlotError("slot payload is too short for a llama.cpp state")
        (n_kv,) = struct.unpack_from("<I", payload)
        if not 1 <= n_kv <= len(tokens):
            raise SlotError(f"slot says {n_kv} cached tokens for a history of {len(tokens)}")
        state = payload[4:]
        buf = (ctypes.c_uint8 * len(state)).from_buffer_copy(state)
        lc.llama_memory_clear(self._mem, True)
        if lc.llama_state_seq_set_data(self._ctx, buf, len(state), 0) == 0:
            self._reset()
            raise SlotError("llama.cpp refused the saved state (a different context size or "
                            "model configuration?); prefill again")
        lc.llama_sampler_reset(self._sampler)
        if self._cursor.restore(tokens, n_kv):  # logits of the last token are not saved
            lc.llama_memory_seq_rm(self._mem, 0, n_kv - 1, -1)

    # ------------------------------------------------------------------ teardown

    def _close(self) -> None:
        if self._batch is not None:
            lc.llama_batch_free(self._batch)
            lc.llama_batch_free(self._one)
            self._batch = self._one = None
        if self._sampler is not None:
            lc.llama_sampler_free(self._sampler)
            self._sampler = None
        if self._ctx is not None:
            lc.llama_free(self._ctx)
            self._ctx = None

    def __del__(self) -> None:
        try:
            if not self.closed:
                self.close()
        except Exception:
            pass


__all__ = ["LlamaCppSession"]
