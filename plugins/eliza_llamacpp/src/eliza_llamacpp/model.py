"""llama.cpp weights: loading a GGUF once per inference context, and the facts about it.

The session, its lanes (:mod:`~eliza_llamacpp.solo`, :mod:`~eliza_llamacpp.engine`) and the
drafters (:mod:`~eliza_llamacpp.draft`, :mod:`~eliza_llamacpp.mtp`) import this module (never
each other): it owns llama.cpp's process-wide setup (backend init, log routing),
:func:`load_model` / :func:`shared_model`, the context, batch and sequence-state calls they all
need, :class:`Lane`, the contract between the session and the sequence it decodes, and
:class:`TargetLinkedDrafter`, the contract between the session and a drafter that reads the
session's own context (Gemma 4's MTP assistant).
"""

from __future__ import annotations

import ctypes
import logging
import os
import threading
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal, Protocol, TypeVar

import llama_cpp as lc

from eliza_backends import (
    BackendRuntimeError,
    BundleError,
    InferenceContext,
    ModelInfo,
    SessionClosedError,
    StreamConfig,
)
from eliza_backends.backend import Drafter, StepScheduler

from . import model_checks, native_guard
from .gguf_header import check_gguf
from .options import LlamaCppOptions

log = logging.getLogger("eliza_llamacpp.native")
if log.level == logging.NOTSET:  # llama.cpp is chatty: errors only, unless the app says otherwise
    log.setLevel(logging.ERROR)
RUNTIME = f"llama-cpp-python {lc.__version__}"
# ggml_log_level: NONE 0, DEBUG 1, INFO 2, WARN 3, ERROR 4, CONT 5 (continues the last line)
_LOG_LEVELS = {1: logging.DEBUG, 2: logging.INFO, 3: logging.WARNING, 4: logging.ERROR}
_last_level = [logging.DEBUG]
#: Token attributes ``llama_tokenize`` matches in text only when ``parse_special`` is on.
_PARSED_SPECIAL = lc.LLAMA_TOKEN_ATTR_CONTROL | lc.LLAMA_TOKEN_ATTR_UNKNOWN
_FLASH_ATTN = {"off": lc.LLAMA_FLASH_ATTN_TYPE_DISABLED, "on": lc.LLAMA_FLASH_ATTN_TYPE_ENABLED,
               "auto": lc.LLAMA_FLASH_ATTN_TYPE_AUTO}
_KV_TYPES = {"f16": lc.GGML_TYPE_F16, "f32": lc.GGML_TYPE_F32, "q8_0": lc.GGML_TYPE_Q8_0}


@lc.llama_log_callback  # type: ignore[untyped-decorator]
def _log_to_logging(level: int, text: bytes, _user: ctypes.c_void_p) -> None:
    """Route llama.cpp's log lines into :mod:`logging` instead of raw stderr."""
    py_level = _last_level[0] if level == 5 else _LOG_LEVELS.get(level, logging.DEBUG)
    _last_level[0] = py_level
    if py_level >= logging.WARNING:
        native_guard.note(text.decode("utf-8", "replace").rstrip())
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
    _pieces: list[bytes | None]
    info: ModelInfo = field(init=False)
    freed: bool = False
    #: Held while the vocabulary is read outside a session call (``control_texts``) and while
    #: the weights are freed, so neither runs under the other.
    lock: threading.Lock = field(default_factory=threading.Lock)

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

    def control_texts(self) -> frozenset[str]:
        """Texts of the tokens ``llama_tokenize`` parses only with ``parse_special`` (a scan
        of the vocabulary, run once on demand: see :attr:`ModelInfo.control_texts`)."""
        with self.lock:
            if self.freed:
                raise SessionClosedError(f"the weights of {self.path.name} were freed (the "
                                         "inference context was closed)")
            vocab, n_vocab = self.vocab, len(self._pieces)
            return frozenset(
                lc.llama_vocab_get_text(vocab, t).decode("utf-8", "replace")
                for t in range(n_vocab) if lc.llama_vocab_get_attr(vocab, t) & _PARSED_SPECIAL)


def load_model(path: Path, options: LlamaCppOptions) -> LoadedModel:
    """Check the GGUF header, then load it with llama.cpp on a contained thread: a file whose
    values make llama.cpp abort is a :class:`BundleError`, not the end of the process (see
    :mod:`eliza_llamacpp.native_guard`)."""
    check_gguf(path)
    _init_backend()
    try:
        return native_guard.contained(lambda: _load_native(path, options), release=free_model)
    except native_guard.NativeAbort as exc:
        raise BundleError(f"{path} cannot be loaded: llama.cpp aborted on it ("
                          f"{_abort_reason(str(exc), exc.log_lines)}) while {exc.stage}; the file "
                          "is corrupted or was written by a broken converter: fetch or convert "
                          "it again") from None


def _abort_reason(message: str, lines: list[str]) -> str:
    where, sep, what = message.rpartition(": ")
    reason = f"{what} at {where.rsplit('/', 1)[-1]}" if sep else message
    said = _most_telling(lines)
    return f"{reason}; it logged: {said}" if said else reason


def _most_telling(lines: list[str]) -> str | None:
    """The last line llama.cpp logged that names an error (else one that names a failure)."""
    for word in ("error", "fail"):
        found = [line for line in lines if word in line.lower()]
        if found:
            return found[-1]
    return None


@lc.llama_progress_callback  # type: ignore[untyped-decorator]
def _keep_loading(progress: float, user_data: Any) -> bool:
    """llama.cpp's load progress callback (on the loading thread): False stops the load."""
    return native_guard.keep_going()


def _load_native(path: Path, options: LlamaCppOptions) -> LoadedModel:
    """Everything that reads the file's values natively (runs on the contained thread), in
    O(metadata keys) native calls: no per-vocabulary-entry scan."""
    params = lc.llama_model_default_params()
    params.n_gpu_layers = options.n_gpu_layers
    if options.use_mmap is not None:
        params.load_mode = lc.LLAMA_LOAD_MODE_MMAP if options.use_mmap else \
            lc.LLAMA_LOAD_MODE_NONE
    params.use_extra_bufts = use_extra_buffers(options)
    params.progress_callback = _keep_loading  # an interrupted caller stops the load
    ptr = lc.llama_model_load_from_file(str(path).encode(), params)
    if not ptr:
        said = _most_telling(native_guard.logged()) or "unsupported architecture or corrupted " \
            "tensors"
        raise BundleError(f"llama.cpp could not load {path}: {said} (enable logging for "
                          "'eliza_llamacpp.native' for more)")
    try:
        vocab = lc.llama_model_get_vocab(ptr)
        model_checks.check_vocabulary(vocab, path)
        meta = model_checks.metadata(ptr)
        model_checks.check_compute_values(meta, path)
        n_vocab = lc.llama_vocab_n_tokens(vocab)
        eog = model_checks.eog_token_ids(ptr, vocab, meta)
        bos = lc.llama_vocab_bos(vocab)
        eos = lc.llama_vocab_eos(vocab)
        template = lc.llama_model_chat_template(ptr, None)
        try:
            chat_template = template.decode("utf-8") if template else None
        except UnicodeDecodeError as exc:
            raise BundleError(f"{path}: tokenizer.chat_template is not UTF-8 (byte "
                              f"{exc.start}); re-convert the model or pass "
                              "StreamConfig(chat_template=...)") from None
        template_tokens = {
            key: lc.llama_vocab_get_text(vocab, tok).decode("utf-8", "replace")
            for key, tok in (("bos_token", bos), ("eos_token", eos)) if 0 <= tok < n_vocab}
        add_bos = bool(lc.llama_vocab_get_add_bos(vocab))
        model = LoadedModel(path=path, ptr=ptr, vocab=vocab, _pieces=[None] * n_vocab)
        model.info = ModelInfo(
            vocab_size=n_vocab, eog_token_ids=eog,
            bos_token_id=bos if add_bos and bos >= 0 else None,
            chat_template=chat_template, template_tokens=template_tokens, artifact=path,
            runtime=RUNTIME, control_tokens=model.control_texts)
        return model
    except BaseException:
        lc.llama_model_free(ptr)
        raise


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
    with model.lock:
        if model.freed:
            return
        model.freed = True
        lc.llama_model_free(model.ptr)


def shared_model(context: InferenceContext, path: Path, options: LlamaCppOptions) -> LoadedModel:
    """The weights of ``path`` on ``context``: loaded on first use, then shared."""
    key = ("llama.cpp", str(path), options.n_gpu_layers, options.use_mmap,
           use_extra_buffers(options))
    return context.shared(key, lambda: load_model(path, options), free_model)


def default_threads() -> int:
    """The CPUs this process may run on."""
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:  # macOS, Windows
        return os.cpu_count() or 1


R = TypeVar("R")

#: Which rows of a batch have outputs (logits, hidden states): every one, the last, none.
Outputs = Literal["all", "last", "none"]


class TargetLinkedDrafter(Drafter, Protocol):
    """A drafter built on the session's own ``llama_context`` (Gemma 4's MTP assistant reads
    the target's KV cache and hidden states): the session builds it once its context exists,
    owns it like any drafter, and reports every decode on that context to it."""

    def target_decoded(self, start: int, tokens: Sequence[int], outputs: Outputs) -> None:
        """The session's context just decoded ``tokens`` at positions ``start..`` with outputs
        for ``outputs`` (as :func:`fill_batch` set them). Called right after each successful
        ``llama_decode`` of the sequence, on the session's thread, before anything else runs on
        that context (the hidden rows are read here; the next decode overwrites them)."""
        ...


class Lane(Protocol):
    """One sequence of a ``llama_context``, as a session drives it: its own context
    (:class:`~eliza_llamacpp.solo.SoloLane`, sequence 0) or one sequence of a context shared by
    ``parallel`` sessions and decoded in batched steps (:class:`~eliza_llamacpp.engine.
    SharedLane`). The session's sampling, drafting and bookkeeping are the same on both; only
    this interface differs. Used on the session's consumer thread."""

    #: The ``llama_context`` whose output rows the ``then`` callbacks read.
    ctx: Any
    #: The most tokens a decode with outputs for every token may carry.
    n_batch: int
    #: The most drafts one verify should carry (a shared context: the sequence's share of the
    #: batch, so every sequence's verify fits one step with room for a prefill piece).
    draft_cap: int
    #: The step scheduler of a shared context (None: an own context).
    scheduler: StepScheduler | None
    #: Positions this sequence may use (the session's context window).
    n_ctx: int
    #: True when the sequence shares its context with others (decoded in batched steps).
    batched: bool
    #: True when the outputs of the lane's last decode stay readable until its next one
    #: (its own context); False: only inside the decode's ``then`` callback.
    keeps_logits: bool
    #: The session's C-level abort callback, polled inside a long ``llama_decode`` (own
    #: contexts; a shared one stops a cancelled sequence between steps instead).
    abort: Any
    #: A drafter reading this lane's context, told of every decode (own contexts only).
    linked: TargetLinkedDrafter | None

    def decode(self, tokens: list[int], start: int, outputs: Outputs,
               then: Callable[[int], R], cancelled: Callable[[], bool]) -> R:
        """Decode ``tokens`` at positions ``start..`` (``"all"``: at most :attr:`n_batch` of
        them; otherwise any number, in pieces), then return ``then(last_row)`` run while the
        outputs are readable; ``last_row`` is the output row of the last token (with
        ``"all"``, token ``j`` is row ``last_row - len(tokens) + 1 + j``). Raises
        :class:`~eliza_backends.CancelledError` when ``cancelled()`` turned true before the
        last piece (positions at ``start..`` may then be held: the caller drops them),
        :class:`~eliza_backends.BackendRuntimeError` when llama.cpp fails."""
        ...

    def drop(self, p0: int) -> bool:
        """Drop the positions ``p0..`` of the sequence (False: llama.cpp cannot)."""
        ...

    def clear(self) -> None:
        """Drop every position of the sequence."""
        ...

    def pos_max(self) -> int:
        """The last position the sequence holds (-1: none)."""
        ...

    def save(self) -> bytes:
        """The sequence's state (``llama_state_seq_get_data``); b"" when llama.cpp fails."""
        ...

    def load(self, state: bytes, tokens: Sequence[int]) -> bool:
        """Replace the sequence by a saved state holding ``tokens``; False when llama.cpp
        refuses it (the sequence is then empty)."""
        ...

    def idle(self) -> None:
        """The sequence's stream ended: it will not ask for a decode soon."""
        ...

    def batch_cost(self, token: int, n_kv: int, max_n: int) -> list[float] | None:
        """The seconds of one decode of n = 1..max_n tokens after position ``n_kv`` (see
        :meth:`eliza_backends.Session._batch_cost`); None where it cannot be measured alone
        (a shared context)."""
        ...

    def close(self) -> None:
        """Free what the lane owns (idempotent)."""
        ...


def new_context(model: LoadedModel, config: StreamConfig, what: str, *,
                n_ubatch: int | None = None,
                flash_attention: Literal["off", "on", "auto"],
                kv_cache_type: Literal["f16", "f32", "q8_0"],
                mtp_target: Any = None, n_seq: int = 1, kv_unified: bool = True) -> Any:
    """A ``llama_context`` on ``model`` for ``n_seq`` sequences of ``config.context_size``
    positions each, with ``n_ubatch`` (default: the batch size), flash attention and the KV
    cache's element type (no defaults here: :class:`LlamaCppOptions` holds them); ``what``
    names it in the error message. ``n_seq > 1``: with ``kv_unified``, one KV cache of
    ``n_seq * context_size`` cells that the sequences share (a copied prefix costs no cells),
    else one of ``context_size`` cells per sequence (see :mod:`eliza_llamacpp.engine`).
    ``mtp_target``: a target's ``llama_context``; the context is then an MTP one
    (``LLAMA_CONTEXT_TYPE_MTP``) over it, one token and one output per decode (Gemma 4's
    assistant: its attention reads that context's KV cache, so the flash attention setting
    and cache type must be the target's)."""
    threads = config.threads or default_threads()
    params = lc.llama_context_default_params()
    params.n_ctx = config.context_size * n_seq
    params.n_batch = config.batch_size
    params.n_ubatch = min(n_ubatch or config.batch_size, config.batch_size)
    if mtp_target is not None:
        params.ctx_type = lc.LLAMA_CONTEXT_TYPE_MTP
        params.ctx_other = mtp_target
        params.n_batch = params.n_ubatch = params.n_outputs_max = 1
    params.n_seq_max = n_seq
    params.kv_unified = n_seq > 1 and kv_unified
    params.n_threads = params.n_threads_batch = threads
    params.no_perf = True
    params.flash_attn_type = _FLASH_ATTN[flash_attention]
    params.type_k = params.type_v = _KV_TYPES[kv_cache_type]
    ctx = model_checks.new_context(model.ptr, params, model.path)
    if not ctx:
        raise BackendRuntimeError(
            f"llama.cpp could not create {what} of {config.context_size * n_seq} tokens; lower "
            "context_size or batch_size" + (" or parallel" if n_seq > 1 else ""))
    return ctx


def one_token_batch() -> Any:
    """A ``llama_batch`` for one token of sequence 0 with its logits (set token and pos)."""
    one = lc.llama_batch_init(1, 0, 1)
    one.n_tokens = 1
    one.n_seq_id[0] = 1
    one.seq_id[0][0] = 0
    one.logits[0] = 1
    return one


def fill_batch(batch: Any, tokens: list[int], start: int, outputs: Outputs) -> None:
    """Put ``tokens`` at positions ``start..`` of sequence 0 into ``batch``, with logits for
    ``outputs``: every position, the last one, or none."""
    every = outputs == "all"
    for i, tok in enumerate(tokens):
        batch.token[i] = tok
        batch.pos[i] = start + i
        batch.n_seq_id[i] = 1
        batch.seq_id[i][0] = 0
        batch.logits[i] = every
    if outputs == "last":
        batch.logits[len(tokens) - 1] = 1
    batch.n_tokens = len(tokens)


def save_seq(ctx: Any, seq: int) -> bytes:
    """Sequence ``seq``'s state in ``ctx`` (b"" when llama.cpp writes nothing)."""
    size = lc.llama_state_seq_get_size(ctx, seq)
    buf = (ctypes.c_uint8 * size)()
    written = lc.llama_state_seq_get_data(ctx, buf, size, seq)
    return bytes(buf[:written])


def load_seq(ctx: Any, seq: int, state: bytes) -> bool:
    """Load a saved sequence state into sequence ``seq`` of ``ctx`` (which must be empty)."""
    buf = (ctypes.c_uint8 * len(state)).from_buffer_copy(state)
    return bool(lc.llama_state_seq_set_data(ctx, buf, len(state), seq))


def architecture(model: LoadedModel) -> str:
    """The loaded model's ``general.architecture`` ("" when it has none)."""
    buf = ctypes.create_string_buffer(64)
    n = lc.llama_model_meta_val_str(model.ptr, b"general.architecture", buf, len(buf))
    return buf.value.decode("utf-8", "replace") if n >= 0 else ""


__all__ = ["RUNTIME", "Lane", "LoadedModel", "Outputs", "TargetLinkedDrafter", "architecture",
           "default_threads", "fill_batch", "free_model", "load_model", "load_seq",
           "new_context", "one_token_batch", "save_seq", "shared_model", "use_extra_buffers"]
