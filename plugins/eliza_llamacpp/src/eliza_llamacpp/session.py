"""The llama.cpp session on llama-cpp-python's low-level API.

One ``llama_context`` per session (its own KV cache, sequence 0), one sampler chain built from
the :class:`StreamConfig`, and the weights shared through the :class:`InferenceContext`.

Decoding is lazy by one token: the last sampled token is fed to the model at the start of the
next step, so a step of n tokens costs n samples and n decodes, and the first token after a
prefill is sampled straight from the prefill's logits (no extra decode before it).
"""

from __future__ import annotations

import ctypes
import logging
import os
import struct
import threading
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import llama_cpp as lc
import numpy as np

from eliza_backends import (
    BackendRuntimeError,
    BundleError,
    Capabilities,
    Decoded,
    InferenceContext,
    Session,
    SlotError,
    StreamConfig,
)
from eliza_backends.sampling import Sampler
from eliza_backends.slots import fingerprint_artifact
from eliza_backends.speculative import Drafter, NgramDrafter, accept_greedy, accept_sampled

from . import LlamaCppOptions
from .gguf_header import check_gguf

log = logging.getLogger("eliza_llamacpp.native")
if log.level == logging.NOTSET:  # llama.cpp is chatty: errors only, unless the app says otherwise
    log.setLevel(logging.ERROR)
RUNTIME = f"llama-cpp-python {lc.__version__}"
_DECODE_ABORTED = 2
# ggml_log_level: NONE 0, DEBUG 1, INFO 2, WARN 3, ERROR 4, CONT 5 (continues the last line)
_LOG_LEVELS = {1: logging.DEBUG, 2: logging.INFO, 3: logging.WARNING, 4: logging.ERROR}
_last_level = [logging.DEBUG]


@lc.llama_log_callback  # type: ignore[untyped-decorator]
def _log_to_logging(level: int, text: bytes, _user: ctypes.c_void_p) -> None:
    """Route llama.cpp's log lines into :mod:`logging` instead of raw stderr."""
    py_level = _last_level[0] if level == 5 else _LOG_LEVELS.get(level, logging.DEBUG)
    _last_level[0] = py_level
    if log.isEnabledFor(py_level):
        log.log(py_level, "%s", text.decode("utf-8", "replace").rstrip())


_init_lock = threading.Lock()
_initialised = False


def _init_backend() -> None:
    global _initialised
    with _init_lock:
        if not _initialised:
            lc.llama_log_set(_log_to_logging, ctypes.c_void_p(0))
            lc.llama_backend_init()
            _initialised = True


@dataclass
class LoadedModel:
    """Weights loaded once per (context, file, load options) and shared by sessions."""

    path: Path
    ptr: Any
    vocab: Any
    n_vocab: int
    bos: int | None
    add_bos: bool
    eog: frozenset[int]
    chat_template: str | None
    template_tokens: dict[str, str]
    _pieces: list[bytes | None] = field(default_factory=list)
    _fingerprint: str | None = None

    def piece(self, token: int) -> bytes:
        """The bytes token ``token`` adds to output text (control tokens add none)."""
        cached = self._pieces[token]
        if cached is None:
            buf = ctypes.create_string_buffer(64)
            n = lc.llama_token_to_piece(self.vocab, token, buf, 64, 0, False)
            if n < 0:
                buf = ctypes.create_string_buffer(-n)
                n = lc.llama_token_to_piece(self.vocab, token, buf, -n, 0, False)
            cached = self._pieces[token] = buf.raw[:n]
        return cached

    @property
    def fingerprint(self) -> str:
        """Cheap identity of the GGUF file (see :func:`fingerprint_artifact`)."""
        if self._fingerprint is None:
            self._fingerprint = fingerprint_artifact(self.path)
        return self._fingerprint


def load_model(path: Path, options: LlamaCppOptions) -> LoadedModel:
    """Check the GGUF header, then load it with llama.cpp."""
    check_gguf(path)
    _init_backend()
    params = lc.llama_model_default_params()
    params.n_gpu_layers = options.n_gpu_layers
    if options.use_mmap is not None:
        params.load_mode = lc.LLAMA_LOAD_MODE_MMAP if options.use_mmap else \
            lc.LLAMA_LOAD_MODE_NONE
    params.use_extra_bufts = use_extra_buffers(options)
    ptr = lc.llama_model_load_from_file(str(path).encode(), params)
    if not ptr:
        raise BundleError(f"llama.cpp could not load {path} (unsupported architecture or "
                          "corrupted tensors; enable logging for 'eliza_llamacpp.native')")
    vocab = lc.llama_model_get_vocab(ptr)
    n_vocab = lc.llama_vocab_n_tokens(vocab)
    eog = frozenset(t for t in range(n_vocab) if lc.llama_vocab_is_eog(vocab, t))
    bos = lc.llama_vocab_bos(vocab)
    eos = lc.llama_vocab_eos(vocab)
    template = lc.llama_model_chat_template(ptr, None)
    template_tokens = {
        key: lc.llama_vocab_get_text(vocab, tok).decode("utf-8", "replace")
        for key, tok in (("bos_token", bos), ("eos_token", eos)) if 0 <= tok < n_vocab}
    return LoadedModel(
        path=path, ptr=ptr, vocab=vocab, n_vocab=n_vocab, bos=bos if bos >= 0 else None,
        add_bos=bool(lc.llama_vocab_get_add_bos(vocab)), eog=eog,
        chat_template=template.decode("utf-8") if template else None,
        template_tokens=template_tokens,
        _pieces=[None] * n_vocab)


def host_has_amx() -> bool:
    """True on x86 CPUs that report AMX (read from /proc/cpuinfo; False where unreadable)."""
    try:
        with open("/proc/cpuinfo", encoding="ascii", errors="replace") as f:
            return any(line.startswith("flags") and " amx_int8" in line for line in f)
    except OSError:
        return False


def use_extra_buffers(options: LlamaCppOptions) -> bool:
    """The ``extra_buffers`` option, resolved for this host (see LlamaCppOptions)."""
    return options.extra_buffers if options.extra_buffers is not None else not host_has_amx()


def free_model(model: LoadedModel) -> None:
    """Release the weights (the context calls this after its sessions are closed)."""
    lc.llama_model_free(model.ptr)


def open_session(context: InferenceContext, config: StreamConfig, options: LlamaCppOptions,
                 path: Path, draft_path: Path | None = None) -> LlamaCppSession:
    """Load (or reuse) the model on ``context`` and open a session on it."""
    key = ("llama.cpp", str(path), options.n_gpu_layers, options.use_mmap,
           use_extra_buffers(options))
    model = context.shared(key, lambda: load_model(path, options), free_model)
    drafter: Drafter | None = None
    if config.drafter == "ngram":
        drafter = NgramDrafter(max_n=config.ngram_size)
    elif draft_path is not None:
        from .draft import open_draft

        drafter = open_draft(context, config, options, draft_path, model.n_vocab,
                             config.threads or _default_threads())
    return LlamaCppSession(model, config, options, context, drafter)


def _default_threads() -> int:
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:  # macOS, Windows
        return os.cpu_count() or 1


class LlamaCppSession(Session):
    """A llama.cpp generation: one ``llama_context``, sequence 0."""

    backend_name = "llama.cpp"

    def __init__(self, model: LoadedModel, config: StreamConfig, options: LlamaCppOptions,
                 context: InferenceContext | None, drafter: Drafter | None = None) -> None:
        self._model = model
        self._drafter = drafter
        # speculative rounds with sampling or a repeat penalty go through the core's numpy
        # sampler (the standard acceptance rule needs the target's probabilities)
        self._spec_sampler = Sampler(config) if drafter is not None and not (
            config.greedy and config.repeat_penalty == 1.0) else None
        self._ctx: Any = None
        self._sampler: Any = None
        self._batch: Any = None
        self._one: Any = None
        threads = config.threads or _default_threads()
        params = lc.llama_context_default_params()
        params.n_ctx = config.context_size
        params.n_batch = config.batch_size
        params.n_ubatch = min(options.n_ubatch or config.batch_size, config.batch_size)
        params.n_seq_max = 1
        params.n_threads = threads
        params.n_threads_batch = threads
        params.no_perf = True
        ctx = lc.llama_init_from_model(model.ptr, params)
        if not ctx:
            raise BackendRuntimeError(
                f"llama.cpp could not create a context of {config.context_size} tokens; lower "
                "context_size or batch_size")
        self._ctx = ctx
        self._mem = lc.llama_get_memory(ctx)
        self._n_ctx = lc.llama_n_ctx(ctx)
        self._n_batch = lc.llama_n_batch(ctx)
        self._batch = lc.llama_batch_init(self._n_batch, 0, 1)
        self._one = lc.llama_batch_init(1, 0, 1)
        self._one.n_tokens = 1
        self._one.n_seq_id[0] = 1
        self._one.seq_id[0][0] = 0
        self._one.logits[0] = 1
        self._sampler = self._build_sampler(config)
        self._abort = lc.ggml_abort_callback(self._abort_requested)
        self._n_kv = 0  # tokens held in the KV cache: history[:n_kv]
        self._pending: list[int] = []  # history tokens not yet in the KV cache
        super().__init__(config, context)

    # ------------------------------------------------------------------ facts

    @property
    def vocab_size(self) -> int:
        return self._model.n_vocab

    @property
    def context_size(self) -> int:
        return self._n_ctx

    @property
    def eog_token_ids(self) -> frozenset[int]:
        return self._model.eog

    @property
    def bos_token_id(self) -> int | None:
        return self._model.bos if self._model.add_bos else None

    @property
    def chat_template(self) -> str | None:
        """The GGUF's ``tokenizer.chat_template``, if it has one."""
        return self._model.chat_template

    @property
    def template_tokens(self) -> dict[str, str]:
        return dict(self._model.template_tokens)

    @property
    def capabilities(self) -> Capabilities:
        return Capabilities(token_input=True, prefix_reuse=True, slots=True,
                            cancel_prefill=True, sampling=True,
                            drafters=frozenset({"none", "ngram", "model"}))

    # ------------------------------------------------------------------ hooks

    def _build_sampler(self, config: StreamConfig) -> Any:
        chain = lc.llama_sampler_chain_init(lc.llama_sampler_chain_default_params())
        add = lc.llama_sampler_chain_add
        if config.repeat_penalty != 1.0:
            add(chain, lc.llama_sampler_init_penalties(
                self._model.n_vocab, config.repeat_last_n, config.repeat_penalty, 0.0, 0.0))
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

    def _abort_requested(self, _data: ctypes.c_void_p) -> bool:
        return self._cancel.is_set()

    def _prefill(self, token_ids: list[int]) -> None:
        tokens = self._pending + token_ids
        start = self._n_kv
        batch, cap = self._batch, self._n_batch
        lc.llama_set_abort_callback(self._ctx, self._abort, None)
        try:
            for off in range(0, len(tokens), cap):
                self._raise_if_cancelled()
                chunk = tokens[off:off + cap]
                last = off + len(chunk) == len(tokens)
                pos = start + off
                for i, tok in enumerate(chunk):
                    batch.token[i] = tok
                    batch.pos[i] = pos + i
                    batch.n_seq_id[i] = 1
                    batch.seq_id[i][0] = 0
                    batch.logits[i] = 0
                if last:
                    batch.logits[len(chunk) - 1] = 1
                batch.n_tokens = len(chunk)
                self._check_decode(lc.llama_decode(self._ctx, batch))
                self._n_kv = pos + len(chunk)
        except BaseException:
            lc.llama_memory_seq_rm(self._mem, 0, start, -1)
            self._n_kv = start
            raise
        finally:
            lc.llama_set_abort_callback(self._ctx, lc.ggml_abort_callback(), None)
        self._pending = []

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
        if self._pending:
            return self._decode_speculative(max_tokens, list(self._history))
        first = self._decode_plain(1)  # the first token after a prefill: its logits are ready
        if max_tokens == 1 or (not self.config.ignore_eos and first.tokens[0] in self._model.eog):
            return first
        rest = self._decode_speculative(max_tokens - 1, [*self._history, *first.tokens])
        return Decoded(first.tokens + rest.tokens, rest.drafted, rest.accepted)

    def _decode_plain(self, max_tokens: int) -> Decoded:
        out: list[int] = []
        ctx, smpl, one, eog = self._ctx, self._sampler, self._one, self._model.eog
        stop_at_eog = not self.config.ignore_eos
        cancel = self._cancel
        for _ in range(max_tokens):
            if self._pending:
                if cancel.is_set():
                    self._raise_if_cancelled()
                tok = self._pending[0]
                one.token[0] = tok
                one.pos[0] = self._n_kv
                status = lc.llama_decode(ctx, one)
                if status:
                    self._check_decode(status)
                self._n_kv += 1
                self._pending = []
            tok = lc.llama_sampler_sample(smpl, ctx, -1)
            out.append(tok)
            self._pending = [tok]
            if stop_at_eog and tok in eog:
                break
        return Decoded(out)

    def _decode_speculative(self, max_tokens: int, seq: list[int]) -> Decoded:
        """Rounds of: draft k tokens, verify [pending, d1..dk] in one batch, keep the agreeing
        prefix plus the target's next token, roll the KV cache back past the rest. ``seq`` is
        the sequence so far, ending with the pending token (extended in place)."""
        assert self._drafter is not None
        ctx, smpl, eog = self._ctx, self._sampler, self._model.eog
        stop_at_eog = not self.config.ignore_eos
        out: list[int] = []
        drafted = accepted = 0

        def target(i: int) -> int:
            tok: int = lc.llama_sampler_sample(smpl, ctx, i)
            return tok

        sampler, n_vocab = self._spec_sampler, self._model.n_vocab
        recent = self.config.repeat_last_n

        def distribution(i: int) -> tuple[Any, Any]:
            assert sampler is not None
            logits = np.ctypeslib.as_array(lc.llama_get_logits_ith(ctx, i), shape=(n_vocab,))
            return sampler.distribution(logits, seq[len(seq) - recent:] + drafts[:i])

        def is_end(tok: int) -> bool:
            return stop_at_eog and tok in eog

        while len(out) < max_tokens:
            self._raise_if_cancelled()
            k = min(self.config.draft_length, max_tokens - len(out) - 1, self._n_batch - 1)
            drafts = self._drafter.propose(seq, k) if k > 0 else []
            batch = self._batch
            tokens = [self._pending[0], *drafts]
            for i, tok in enumerate(tokens):
                batch.token[i] = tok
                batch.pos[i] = self._n_kv + i
                batch.n_seq_id[i] = 1
                batch.seq_id[i][0] = 0
                batch.logits[i] = 1
            batch.n_tokens = len(tokens)
            status = lc.llama_decode(ctx, batch)
            if status:
                lc.llama_memory_seq_rm(self._mem, 0, self._n_kv, -1)
                self._check_decode(status)
            if sampler is None:
                produced, n_ok = accept_greedy(drafts, target, is_end)
            else:
                produced, n_ok = accept_sampled(drafts, distribution, sampler, is_end)
            keep = self._n_kv + len(produced)  # the pending token + every produced but the last
            if len(drafts) >= len(produced):
                lc.llama_memory_seq_rm(self._mem, 0, keep, -1)
            self._n_kv = keep
            self._pending = [produced[-1]]
            out.extend(produced)
            seq.extend(produced)
            drafted += len(drafts)
            accepted += n_ok
            if is_end(produced[-1]):
                break
        return Decoded(out, drafted, accepted)

    def _reset(self) -> None:
        if self._drafter is not None:
            self._drafter.truncate(0)
        if self._spec_sampler is not None:
            self._spec_sampler.reset()
        lc.llama_memory_clear(self._mem, True)
        lc.llama_sampler_reset(self._sampler)
        self._n_kv = 0
        self._pending = []

    def _truncate(self, n_keep: int) -> bool:
        if self._drafter is not None:
            self._drafter.truncate(n_keep)
        if n_keep < self._n_kv:
            if not lc.llama_memory_seq_rm(self._mem, 0, n_keep, -1):
                return False
            self._n_kv = n_keep
            self._pending = []
        else:
            self._pending = list(self._history[self._n_kv:n_keep])
        lc.llama_sampler_reset(self._sampler)
        return True

    def _token_bytes(self, token_id: int) -> bytes:
        return self._model.piece(token_id)

    def _tokenize(self, text: str, add_special: bool) -> list[int]:
        data = text.encode("utf-8")
        cap = len(data) + 8
        buf = (lc.llama_token * cap)()
        n = lc.llama_tokenize(self._model.vocab, data, len(data), buf, cap, add_special, True)
        if n < 0:
            cap = -n
            buf = (lc.llama_token * cap)()
            n = lc.llama_tokenize(self._model.vocab, data, len(data), buf, cap, add_special, True)
        if n < 0:
            raise BackendRuntimeError(f"llama_tokenize failed ({n})")
        return list(buf[:n])

    # ------------------------------------------------------------------ slots

    def _slot_identity(self) -> tuple[str, str]:
        return self._model.fingerprint, RUNTIME

    def _save_state(self) -> bytes:
        size = lc.llama_state_seq_get_size(self._ctx, 0)
        buf = (ctypes.c_uint8 * size)()
        written = lc.llama_state_seq_get_data(self._ctx, buf, size, 0)
        if written == 0:
            raise SlotError("llama.cpp could not serialise the sequence state")
        return struct.pack("<I", self._n_kv) + bytes(buf[:written])

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
        if self._drafter is not None:
            self._drafter.truncate(0)
        self._n_kv = n_kv
        self._pending = list(tokens[n_kv:])
        if not self._pending:  # logits of the last token are not saved: recompute them
            lc.llama_memory_seq_rm(self._mem, 0, n_kv - 1, -1)
            self._n_kv = n_kv - 1
            self._pending = [tokens[-1]]

    # ------------------------------------------------------------------ teardown

    def _close(self) -> None:
        if self._drafter is not None:
            self._drafter.close()
            self._drafter = None
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


__all__ = ["LlamaCppSession", "LoadedModel", "load_model", "open_session"]
