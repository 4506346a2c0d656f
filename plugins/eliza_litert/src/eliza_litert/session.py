"""The token-exact LiteRT session: the model's own ``prefill_<N>`` / ``decode`` signatures on
ai-edge-litert's Interpreter, with the KV cache held in numpy by the session (or, with the
``runtime="compiled"`` option, on ai-edge-litert's CompiledModel with the KV cache in the
session's TensorBuffers, each passed as both input and output so it is updated in place; see
:mod:`eliza_litert.kv_store`). The model is loaded by :mod:`eliza_litert.model`.

The litert-torch export takes ``tokens``, ``input_pos``, an additive float ``mask`` and per-layer
``kv_cache_k_i`` / ``kv_cache_v_i``, and returns the updated caches (``decode`` also ``logits``).
Prefill returns no logits, so the last token of each prompt goes through ``decode``.

Prefill chunks are padded to an exported length; the padding writes cache slots past the real
tokens, which the causal mask hides until real tokens overwrite them. For the same reason
``reset_keep(n)`` is O(1): positions >= n are simply overwritten later.

Decoding is lazy by one token, like the llama.cpp session (the core's
:class:`~eliza_backends.runtime.kv_cursor.KVCursor`): the sampled token is fed to ``decode`` at the
start of the next step, so the first token after a prefill is sampled from the prefill's logits.

Speculative decoding (``drafter="ngram"``, greedy only) runs the core's loop
(:func:`~eliza_backends.runtime.speculative.speculate`); this session's verify step goes through
``decode`` one position at a time, stopping at the first disagreement
(:func:`~eliza_backends.runtime.speculative.accept_greedy` asks for the target's token after
``[last, d1..di]`` only once ``d1..d(i-1)`` agreed, so only accepted drafts are ever written
into the KV cache and a rejection needs no rollback). The litert-torch export's ``prefill_<N>``
signatures return no logits and its ``decode`` takes one token, so there is no batched
verification here: the output is identical and the per-step drafted/accepted counts are real,
but a round costs one ``decode`` per produced token, exactly like decoding without a drafter
(see the plugin README for the numbers).

The interpreter (the weights) is shared between sessions through the inference context and is
not thread-safe: every invoke holds the model's lock. Each session owns its own KV arrays.
"""

from __future__ import annotations

import json
import struct
from collections.abc import Sequence
from typing import Any

import numpy as np

from eliza_backends import (
    Capabilities,
    Decoded,
    InferenceContext,
    Session,
    SlotError,
    StreamConfig,
)
from eliza_backends.backend import Drafter, KVCursor, Sampler, accept_greedy

from .kv_store import BufferKV, NumpyKV, run
from .ladder import Rung
from .model import LoadedModel

_SLOT_MAGIC = b"ELZLTKV1"


class LiteRTSession(Session):
    """A token-exact generation on the Interpreter (or CompiledModel): the session's own KV
    cache, the core's numpy sampler."""

    backend_name = "litert-lm"

    def __init__(self, model: LoadedModel, config: StreamConfig,
                 context: InferenceContext | None, rung: Rung,
                 drafter: Drafter | None = None) -> None:
        self._model = model
        # the Interpreter runs on XNNPACK (CPU) whatever the rung; the compiled model on the rung
        self.accelerator = "cpu" if model.runtime == "interpreter" else rung.engine_backend
        self.ladder_rung = rung.name
        self._kv: NumpyKV | BufferKV = run("the KV cache", BufferKV if model.runtime ==
                                           "compiled" else NumpyKV, model)
        self._sampler = Sampler(config)
        self._logits: Any = None
        self._cursor = KVCursor()
        lengths = sorted(model.prefill)
        self._lengths = [n for n in lengths if n <= config.batch_size] or lengths[:1]
        super().__init__(config, context, model.info,
                         context_size=min(config.context_size, model.cache_len), drafter=drafter)

    @property
    def capabilities(self) -> Capabilities:
        return Capabilities(token_input=True, prefix_reuse=True, slots=True,
                            cancel_prefill=False, sampling=True,
                            drafters=frozenset({"none", "ngram"}), logits=True)

    # ------------------------------------------------------------------ model calls

    def _run_prefill(self, tokens: list[int]) -> None:
        """Put ``tokens`` at positions n_kv.. into the cache (no logits)."""
        m, cursor = self._model, self._cursor
        start = cursor.n_kv
        i = 0
        while i < len(tokens):
            self._raise_if_cancelled()
            pos = start + i
            fitting = [n for n in self._lengths if pos + n <= m.cache_len]
            if not fitting:  # the cache's tail: one token at a time through decode
                self._run_decode(tokens[i])
                i += 1
                continue
            remaining = len(tokens) - i
            size = next((n for n in fitting if n >= remaining), fitting[-1])
            chunk = tokens[i:i + size]
            ids = np.zeros((1, size), dtype=np.int32)
            ids[0, :len(chunk)] = chunk
            positions = np.arange(pos, pos + size, dtype=np.int32)
            self._kv.prefill(size, ids, positions, m.masks[pos:pos + size][None, None])
            i += len(chunk)
            cursor.n_kv = start + i

    def _run_decode(self, token: int) -> None:
        """Feed one token at position n_kv; keeps its logits."""
        masks, cursor = self._model.masks, self._cursor
        pos = cursor.n_kv
        self._logits = self._kv.decode(np.array([[token]], dtype=np.int32),
                                       np.array([pos], dtype=np.int32),
                                       masks[pos][None, None, None])
        cursor.n_kv = pos + 1

    def _feed_pending(self) -> None:
        """Feed the history tokens the KV cache does not hold yet; leaves their logits."""
        pending = self._cursor.pending
        if len(pending) > 1:  # after restore_slot / reset_keep beyond the cache
            self._run_prefill(pending[:-1])
        self._run_decode(pending[-1])
        self._cursor.pending = []

    # ------------------------------------------------------------------ hooks

    def _prefill(self, token_ids: list[int]) -> None:
        cursor = self._cursor
        tokens = cursor.pending + token_ids
        start = cursor.n_kv
        try:
            if len(tokens) > 1:
                self._run_prefill(tokens[:-1])
            self._raise_if_cancelled()
            self._run_decode(tokens[-1])
        except BaseException:
            cursor.n_kv = start  # the slots past start are garbage the mask hides
            self._logits = None
            raise
        cursor.pending = []

    def _decode(self, max_tokens: int) -> Decoded:
        if self._drafter is not None:
            return self._speculate(max_tokens, self._verify)
        sampler, history = self._sampler, self._sequence
        window = self.config.repeat_last_n if self.config.repeat_penalty != 1.0 else -1

        def sample(out: list[int]) -> int:
            if window >= 0:
                recent = list(history[-window:]) if window else []
                return sampler.sample(self._logits, recent + out)
            if sampler.greedy:
                return int(self._logits.argmax())
            return sampler.sample(self._logits)

        guide = self._guide
        if guide is not None:  # the core's logits hook, then the same sampler
            def sample(out: list[int]) -> int:
                row = guide.process(np.array(self._logits, dtype=np.float32).reshape(-1))
                recent = list(history[-window:]) if window > 0 else []
                tok = sampler.sample(row, recent + out if window >= 0 else ())
                guide.accept(tok)
                return tok

        return Decoded(self._cursor.decode(max_tokens, self._feed_pending, sample,
                                           self._stop_tokens, self._raise_if_cancelled))

    def _verify(self, seq: Sequence[int], drafts: list[int]) -> tuple[list[int], int]:
        """Greedy verification through ``decode``, one accepted draft at a time (with a
        repeat penalty, the sampler's greedy pick over ``seq`` and the drafts before it)."""
        if self._cursor.pending:
            self._feed_pending()
        n = self.config.repeat_last_n if self.config.repeat_penalty != 1.0 else 0
        recent = list(seq[max(0, len(seq) - n):]) if n else []

        def target(i: int) -> int:
            # the token after [last, d1..di]; called only when d1..d(i-1) were accepted, so
            # feeding d_i here writes an accepted token at the next position: no rollback
            if i > 0:
                self._raise_if_cancelled()
                self._run_decode(drafts[i - 1])
            if n:
                return self._sampler.sample(self._logits, recent + drafts[:i])
            return int(self._logits.argmax())

        produced, n_ok = accept_greedy(drafts, target, self._ends_generation)
        self._cursor.pending = [produced[-1]]
        return produced, n_ok

    def _reset(self) -> None:
        self._cursor.reset()
        self._logits = None
        self._sampler.reset()

    def _truncate(self, n_keep: int) -> bool:
        # slots >= n_keep are overwritten before anything reads them: nothing to drop
        self._cursor.truncate(self._sequence, n_keep)
        self._logits = None
        self._sampler.reset()
        return True

    def _token_bytes(self, token_id: int) -> bytes:
        return self._model.tokenizer.piece(token_id)

    def _tokenize(self, text: str, add_special: bool, parse_special: bool) -> list[int]:
        ids = self._model.tokenizer.encode(text, add_special=False, parse_special=parse_special)
        bos = self.bos_token_id
        if add_special and bos is not None:
            ids = [bos, *ids]
        return ids

    # ------------------------------------------------------------------ slots

    def _save_state(self) -> bytes:
        cache = self._kv.arrays()
        names = sorted(cache)
        head = json.dumps({"n_kv": self._cursor.n_kv, "arrays": [
            [n, list(cache[n].shape), str(cache[n].dtype)] for n in names]}).encode()
        parts = [_SLOT_MAGIC, struct.pack("<I", len(head)), head]
        parts += [np.ascontiguousarray(cache[n]).tobytes() for n in names]
        return b"".join(parts)

    def _restore_state(self, payload: bytes, tokens: list[int]) -> None:
        try:
            if payload[:8] != _SLOT_MAGIC:
                raise ValueError("not a LiteRT KV payload")
            (hlen,) = struct.unpack_from("<I", payload, 8)
            head = json.loads(payload[12:12 + hlen])
            n_kv = int(head["n_kv"])
            offset = 12 + hlen
            cache = {}
            for name, shape, dtype in head["arrays"]:
                spec = self._model.cache_specs.get(name)
                if spec is None or tuple(shape) != spec[0] or np.dtype(dtype) != np.dtype(spec[1]):
                    raise ValueError(f"array {name} {shape} {dtype} does not fit this model")
                nbytes = int(np.prod(shape)) * np.dtype(dtype).itemsize
                if offset + nbytes > len(payload):
                    raise ValueError("payload is truncated")
                cache[name] = np.frombuffer(payload, dtype=dtype, count=int(np.prod(shape)),
                                            offset=offset).reshape(shape).copy()
                offset += nbytes
            if set(cache) != set(self._model.cache_specs) or offset != len(payload):
                raise ValueError("arrays missing or trailing bytes")
        except (ValueError, KeyError, TypeError, struct.error) as exc:
            raise SlotError(f"slot payload is not a LiteRT KV state for this model: {exc}") \
                from None
        if not 1 <= n_kv <= len(tokens):
            raise SlotError(f"slot says {n_kv} cached tokens for a history of {len(tokens)}")
        self._kv.load(cache)
        self._sampler.reset()
        self._logits = None
        # the logits are not saved: the last token is fed again by the first next() (the
        # slot past it is overwritten, nothing to drop)
        self._cursor.restore(tokens, n_kv)

    def _close(self) -> None:
        self._kv.close()
        self._logits = None


__all__ = ["LiteRTSession"]
