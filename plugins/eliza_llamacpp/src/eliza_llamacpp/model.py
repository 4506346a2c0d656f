"""llama.cpp weights: loading a GGUF once per inference context, and the facts about it.

Owns llama.cpp's process-wide setup (backend init, log routing), :class:`LoadedModel`,
:func:`load_model` / :func:`shared_model` / :func:`free_model` and the facts read off loaded
weights (:func:`architecture`). The contexts, batches and sequence states made on the weights
are :mod:`eliza_llamacpp.llama_context`'s; the contract between the session and the sequence it
decodes is :mod:`eliza_llamacpp.lane`'s.
"""

from __future__ import annotations

import ctypes
import logging
import threading
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from eliza_backends import (
    BackendRuntimeError,
    BundleError,
    InferenceContext,
    ModelInfo,
    SessionClosedError,
)
from eliza_backends.backend import distribution_version

from . import model_checks, native_guard
from .bindings import lc, route_logs
from .gguf_header import check_gguf
from .options import LlamaCppOptions

log = logging.getLogger("eliza_llamacpp.native")
if log.level == logging.NOTSET:  # llama.cpp is chatty: errors only, unless the app says otherwise
    log.setLevel(logging.ERROR)
RUNTIME = f"llama-cpp-python {distribution_version('llama-cpp-python') or 'unknown'}"
# ggml_log_level: NONE 0, DEBUG 1, INFO 2, WARN 3, ERROR 4, CONT 5 (continues the last line)
_LOG_LEVELS = {1: logging.DEBUG, 2: logging.INFO, 3: logging.WARNING, 4: logging.ERROR}
_last_level = [logging.DEBUG]
#: Token attributes ``llama_tokenize`` matches in text only when ``parse_special`` is on.
_PARSED_SPECIAL = lc.LLAMA_TOKEN_ATTR_CONTROL | lc.LLAMA_TOKEN_ATTR_UNKNOWN


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
            route_logs(_log_to_logging)
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

    def tokenize(self, text: str, add_special: bool, parse_special: bool) -> list[int]:
        """llama.cpp's tokenization of ``text`` (see ``Session._tokenize``)."""
        data = text.encode("utf-8")
        cap = len(data) + 8
        buf = (lc.llama_token * cap)()
        n = lc.llama_tokenize(self.vocab, data, len(data), buf, cap, add_special, parse_special)
        if n < 0:
            cap = -n
            buf = (lc.llama_token * cap)()
            n = lc.llama_tokenize(self.vocab, data, len(data), buf, cap, add_special,
                                  parse_special)
        if n < 0:
            raise BackendRuntimeError(f"llama_tokenize failed ({n})")
        return list(buf[:n])

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


def meta_value(model: LoadedModel, key: str) -> str | None:
    """The loaded model's metadata value of ``key`` as text (a lookup in what llama.cpp read
    at load), None when the model has no such key."""
    buf = ctypes.create_string_buffer(64)
    n = lc.llama_model_meta_val_str(model.ptr, key.encode(), buf, len(buf))
    return buf.value.decode("utf-8", "replace") if n >= 0 else None


def architecture(model: LoadedModel) -> str:
    """The loaded model's ``general.architecture`` ("" when it has none)."""
    return meta_value(model, "general.architecture") or ""


#: ``general.file_type`` values (llama.cpp's ``llama_ftype``) whose matmuls take llamafile's
#: tinyBLAS from 2 rows and ``vec_dot`` for 1: f32, f16, Q4_0, Q8_0, Q5_0, IQ4_NL, bf16.
ROW_SENSITIVE_FILE_TYPES = frozenset({0, 1, 2, 7, 8, 25, 32})


def file_type(model: LoadedModel) -> int | None:
    """The loaded model's ``general.file_type`` (``llama_ftype``), None when it has none."""
    value = meta_value(model, "general.file_type")
    return int(value) if value is not None and value.strip().isdigit() else None


def pools(model: LoadedModel) -> bool:
    """Whether the loaded model's metadata names a pooling type (``<arch>.pooling_type`` 1-3:
    mean, CLS, last): an embedding model. A lookup in the loaded metadata, where the same
    question asked of the file (:func:`~eliza_llamacpp.gguf_header.embedding_spec`) walks the
    whole header, vocabulary included."""
    value = meta_value(model, f"{architecture(model)}.pooling_type")
    return value is not None and value.strip() in ("1", "2", "3")


__all__ = ["ROW_SENSITIVE_FILE_TYPES", "RUNTIME", "LoadedModel", "architecture", "file_type",
           "free_model", "load_model", "meta_value", "pools", "shared_model", "use_extra_buffers"]
