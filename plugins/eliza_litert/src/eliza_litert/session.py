"""The token-exact LiteRT session: the model's own ``prefill_<N>`` / ``decode`` signatures on
ai-edge-litert's Interpreter, with the KV cache held in numpy by the session.

The litert-torch export takes ``tokens``, ``input_pos``, an additive float ``mask`` and per-layer
``kv_cache_k_i`` / ``kv_cache_v_i``, and returns the updated caches (``decode`` also ``logits``).
Prefill returns no logits, so the last token of each prompt goes through ``decode``.

Prefill chunks are padded to an exported length; the padding writes cache slots past the real
tokens, which the causal mask hides until real tokens overwrite them. For the same reason
``reset_keep(n)`` is O(1): positions >= n are simply overwritten later.

Decoding is lazy by one token, like the llama.cpp session: the sampled token is fed to
``decode`` at the start of the next step, so the first token after a prefill is sampled from the
prefill's logits.

The interpreter (the weights) is shared between sessions through the inference context and is
not thread-safe: every invoke holds the model's lock. Each session owns its own KV arrays.
"""

from __future__ import annotations

import importlib.metadata
import json
import os
import struct
import threading
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
from ai_edge_litert.interpreter import Interpreter  # type: ignore[import-untyped]

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
from eliza_backends.hf_tokenizer import HFTokenizer
from eliza_backends.sampling import Sampler
from eliza_backends.slots import fingerprint_artifact

from . import LiteRTOptions
from .container import LlmMetadata, check_tflite, read_container
from .ladder import Rung

RUNTIME = f"ai-edge-litert {importlib.metadata.version('ai-edge-litert')}"
_SLOT_MAGIC = b"ELZLTKV1"


@dataclass
class LoadedModel:
    """One interpreter and what the session needs to know about the model, shared by sessions."""

    path: Path
    interpreter: Any
    prefill: dict[int, Any]  # exported prefill length -> signature runner
    decode: Any
    cache_specs: dict[str, tuple[tuple[int, ...], Any]]
    cache_len: int
    vocab_size: int
    tokenizer: HFTokenizer
    bos: int | None
    eog: frozenset[int]
    chat_template: str | None
    masks: Any  # [cache_len, cache_len] float32 causal rows
    lock: threading.Lock = field(default_factory=threading.Lock)
    _fingerprint: str | None = None

    @property
    def fingerprint(self) -> str:
        """Cheap identity of the artifact (see :func:`fingerprint_artifact`)."""
        if self._fingerprint is None:
            self._fingerprint = fingerprint_artifact(self.path)
        return self._fingerprint


def _find_tokenizer(path: Path, container_json: str | None) -> HFTokenizer:
    if container_json is not None:
        return HFTokenizer(container_json)
    text = path.parent
    sibling = text / f"{path.stem}.litertlm"
    if path.suffix == ".tflite" and sibling.is_file():
        found = read_container(sibling).hf_tokenizer_json()
        if found is not None:
            return HFTokenizer(found)
    for candidate in (text / f"{path.stem}.tokenizer.json", text / "tokenizer.json"):
        if candidate.is_file():
            return HFTokenizer.from_file(candidate)
    raise BundleError(f"no tokenizer for {path}: the .litertlm has no HF_Tokenizer_Zlib section "
                      f"and neither {path.stem}.litertlm, {path.stem}.tokenizer.json nor "
                      "tokenizer.json is beside it in text/")


def _special_ids(tok: HFTokenizer, meta: LlmMetadata) -> tuple[int | None, frozenset[int]]:
    bos: int | None = meta.start_token_ids[0] if meta.start_token_ids else None
    if bos is None and meta.start_token_str:
        bos = tok.token_id(meta.start_token_str)
    eog = {ids[0] for ids in meta.stop_token_ids if len(ids) == 1}
    for text in meta.stop_token_strs:
        tid = tok.token_id(text)
        if tid is not None:
            eog.add(tid)
    if not meta.stop_token_ids and not meta.stop_token_strs:  # a bare .tflite
        for name in ("<|eos|>", "<|end|>", "</s>", "<eos>", "<|endoftext|>", "<end_of_turn>"):
            tid = tok.token_id(name)
            if tid is not None:
                eog.add(tid)
        for name in ("<|bos|>", "<s>", "<bos>", "<|begin_of_text|>"):
            tid = tok.token_id(name)
            if bos is None and tid is not None:
                bos = tid
    return bos, frozenset(eog)


def load_model(path: Path, threads: int) -> LoadedModel:
    """Check the artifact, extract the TFLite model and tokenizer, build the interpreter."""
    meta = LlmMetadata()
    container_json: str | None = None
    if path.suffix.lower() == ".litertlm":
        container = read_container(path)
        model_bytes: bytes | None = container.tflite_model()
        container_json = container.hf_tokenizer_json()
        meta = container.llm_metadata()
    else:
        check_tflite(path)
        model_bytes = None
    tok = _find_tokenizer(path, container_json)
    try:
        if model_bytes is not None:
            it = Interpreter(model_content=model_bytes, num_threads=threads)
        else:
            it = Interpreter(model_path=str(path), num_threads=threads)
        sigs = it.get_signature_list()
    except (ValueError, RuntimeError) as exc:
        raise BundleError(f"ai-edge-litert cannot load {path}: {exc}") from None
    prefill = {}
    for name in sigs:
        if name.startswith("prefill_") and name[8:].isdigit():
            prefill[int(name[8:])] = it.get_signature_runner(name)
    if not prefill or "decode" not in sigs:
        raise BundleError(f"{path} has no prefill_<N>/decode signatures (found: "
                          f"{', '.join(sorted(sigs)) or 'none'}); export it with litert-torch's "
                          "generative exporter")
    decode = it.get_signature_runner("decode")
    inputs = decode.get_input_details()
    need = {"tokens", "input_pos", "mask"}
    if not need <= set(inputs) or "logits" not in decode.get_output_details():
        raise BundleError(f"{path}: the decode signature lacks {sorted(need)} inputs or a "
                          "logits output; this backend serves litert-torch exports")
    cache_specs = {k: (tuple(int(d) for d in v["shape"]), v["dtype"])
                   for k, v in inputs.items() if k.startswith("kv_cache_")}
    cache_len = int(inputs["mask"]["shape"][-1])
    vocab = int(decode.get_output_details()["logits"]["shape"][-1])
    if tok.vocab_size > vocab:
        raise BundleError(f"{path}: the tokenizer has {tok.vocab_size} ids but the model's "
                          f"logits have {vocab}; the tokenizer belongs to another model")
    bos, eog = _special_ids(tok, meta)
    keys = np.arange(cache_len)
    masks = np.where(keys[None, :] <= keys[:, None], 0.0,
                     np.finfo(np.float32).min).astype(np.float32)
    return LoadedModel(path=path, interpreter=it, prefill=prefill, decode=decode,
                       cache_specs=cache_specs, cache_len=cache_len, vocab_size=vocab,
                       tokenizer=tok, bos=bos, eog=eog, chat_template=meta.jinja_prompt_template,
                       masks=masks)


def _default_threads() -> int:
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:  # macOS, Windows
        return os.cpu_count() or 1


def open_session(context: InferenceContext, config: StreamConfig, options: LiteRTOptions,
                 path: Path, rung: Rung) -> LiteRTSession:
    """Load (or reuse) the interpreter on ``context`` and open a session on it."""
    threads = config.threads or _default_threads()
    key = ("litert-lm", "interpreter", str(path), threads)
    model = context.shared(key, lambda: load_model(path, threads))
    return LiteRTSession(model, config, context, rung)


class LiteRTSession(Session):
    """A token-exact generation on the interpreter: numpy KV cache, numpy sampler."""

    backend_name = "litert-lm"

    def __init__(self, model: LoadedModel, config: StreamConfig,
                 context: InferenceContext | None, rung: Rung) -> None:
        self._model = model
        self.accelerator = "cpu"  # the interpreter runs on XNNPACK (CPU) whatever the rung
        self.ladder_rung = rung.name
        self._n_ctx = min(config.context_size, model.cache_len)
        self._cache = self._empty_cache()
        self._sampler = Sampler(config)
        self._logits: Any = None
        self._n_kv = 0  # positions held in the KV cache: history[:n_kv]
        self._pending: list[int] = []  # history tokens not yet in the KV cache
        lengths = sorted(model.prefill)
        self._lengths = [n for n in lengths if n <= config.batch_size] or lengths[:1]
        super().__init__(config, context)

    def _empty_cache(self) -> dict[str, Any]:
        return {k: np.zeros(shape, dtype=dt) for k, (shape, dt) in
                self._model.cache_specs.items()}

    # ------------------------------------------------------------------ facts

    @property
    def vocab_size(self) -> int:
        return self._model.vocab_size

    @property
    def context_size(self) -> int:
        return self._n_ctx

    @property
    def eog_token_ids(self) -> frozenset[int]:
        return self._model.eog

    @property
    def bos_token_id(self) -> int | None:
        return self._model.bos

    @property
    def chat_template(self) -> str | None:
        """The container's Jinja prompt template, if it has one."""
        return self._model.chat_template

    @property
    def capabilities(self) -> Capabilities:
        return Capabilities(token_input=True, prefix_reuse=True, slots=True,
                            cancel_prefill=False, sampling=True)

    # ------------------------------------------------------------------ model calls

    def _run_prefill(self, tokens: list[int]) -> None:
        """Put ``tokens`` at positions n_kv.. into the cache (no logits)."""
        m = self._model
        start = self._n_kv
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
            with m.lock:
                out = m.prefill[size](tokens=ids, input_pos=positions,
                                      mask=m.masks[pos:pos + size][None, None], **self._cache)
            self._cache = out
            i += len(chunk)
            self._n_kv = start + i

    def _run_decode(self, token: int) -> None:
        """Feed one token at position n_kv; keeps its logits."""
        m = self._model
        pos = self._n_kv
        with m.lock:
            out = m.decode(tokens=np.array([[token]], dtype=np.int32),
                           input_pos=np.array([pos], dtype=np.int32),
                           mask=m.masks[pos][None, None, None], **self._cache)
        self._logits = out.pop("logits")[0, -1]
        self._cache = out
        self._n_kv = pos + 1

    # ------------------------------------------------------------------ hooks

    def _prefill(self, token_ids: list[int]) -> None:
        tokens = self._pending + token_ids
        start = self._n_kv
        try:
            if len(tokens) > 1:
                self._run_prefill(tokens[:-1])
            self._raise_if_cancelled()
            self._run_decode(tokens[-1])
        except BaseException:
            self._n_kv = start  # the slots past start are garbage the mask hides
            self._logits = None
            raise
        self._pending = []

    def _decode(self, max_tokens: int) -> Decoded:
        out: list[int] = []
        eog = self._model.eog
        stop_at_eog = not self.config.ignore_eos
        sampler = self._sampler
        history = self._history
        penalize = self.config.repeat_penalty != 1.0
        cancel = self._cancel
        for _ in range(max_tokens):
            if self._pending:
                if cancel.is_set():
                    self._raise_if_cancelled()
                self._run_decode(self._pending[0])
                self._pending = []
            if penalize:
                tok = sampler.sample(self._logits, history + out)
            elif sampler.greedy:
                tok = int(self._logits.argmax())
            else:
                tok = sampler.sample(self._logits)
            out.append(tok)
            self._pending = [tok]
            if stop_at_eog and tok in eog:
                break
        return Decoded(out)

    def _reset(self) -> None:
        self._n_kv = 0
        self._pending = []
        self._logits = None
        self._sampler.reset()

    def _truncate(self, n_keep: int) -> bool:
        if n_keep <= self._n_kv:
            self._n_kv = n_keep  # slots >= n_keep are overwritten before anything reads them
            self._pending = []
        else:
            self._pending = list(self._history[self._n_kv:n_keep])
        self._logits = None
        self._sampler.reset()
        return True

    def _token_bytes(self, token_id: int) -> bytes:
        return self._model.tokenizer.piece(token_id)

    def _tokenize(self, text: str, add_special: bool) -> list[int]:
        ids = self._model.tokenizer.encode(text, add_special=False)
        if add_special and self._model.bos is not None:
            ids = [self._model.bos, *ids]
        return ids

    # ------------------------------------------------------------------ slots

    def _slot_identity(self) -> tuple[str, str]:
        return self._model.fingerprint, RUNTIME

    def _save_state(self) -> bytes:
        names = sorted(self._cache)
        head = json.dumps({"n_kv": self._n_kv, "arrays": [
            [n, list(self._cache[n].shape), str(self._cache[n].dtype)] for n in names]}).encode()
        parts = [_SLOT_MAGIC, struct.pack("<I", len(head)), head]
        parts += [np.ascontiguousarray(self._cache[n]).tobytes() for n in names]
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
        self._cache = cache
        self._sampler.reset()
        self._n_kv = n_kv
        self._pending = list(tokens[n_kv:])
        self._logits = None
        if not self._pending:  # the logits are not saved: recompute them from the last token
            self._n_kv = n_kv - 1
            self._pending = [tokens[-1]]
        # leave nothing for _decode's pending check to skip: run the pending tokens now
        pend, self._pending = self._pending, []
        if len(pend) > 1:
            self._run_prefill(pend[:-1])
        try:
            self._run_decode(pend[-1])
        except Exception as exc:
            raise BackendRuntimeError(f"LiteRT decode failed restoring a slot: {exc}") from None

    def _close(self) -> None:
        self._cache = {}
        self._logits = None


__all__ = ["LiteRTSession", "LoadedModel", "load_model", "open_session"]
