"""The token-exact LiteRT session: the model's own ``prefill_<N>`` / ``decode`` signatures on
ai-edge-litert's Interpreter, with the KV cache held in numpy by the session (or, with the
``runtime="compiled"`` option, on ai-edge-litert's CompiledModel with the KV cache in the
session's TensorBuffers, each passed as both input and output so it is updated in place).

The litert-torch export takes ``tokens``, ``input_pos``, an additive float ``mask`` and per-layer
``kv_cache_k_i`` / ``kv_cache_v_i``, and returns the updated caches (``decode`` also ``logits``).
Prefill returns no logits, so the last token of each prompt goes through ``decode``.

Prefill chunks are padded to an exported length; the padding writes cache slots past the real
tokens, which the causal mask hides until real tokens overwrite them. For the same reason
``reset_keep(n)`` is O(1): positions >= n are simply overwritten later.

Decoding is lazy by one token, like the llama.cpp session: the sampled token is fed to
``decode`` at the start of the next step, so the first token after a prefill is sampled from the
prefill's logits.

Speculative decoding (``drafter="ngram"``, greedy only) drafts with the core's
:class:`~eliza_backends.speculative.NgramDrafter` and verifies through ``decode`` one position
at a time, stopping at the first disagreement (:func:`~eliza_backends.speculative.accept_greedy`
asks for the target's token after ``[last, d1..di]`` only once ``d1..d(i-1)`` agreed, so only
accepted drafts are ever written into the KV cache and a rejection needs no rollback). The
litert-torch export's ``prefill_<N>`` signatures return no logits and its ``decode`` takes one
token, so there is no batched verification here: the output is identical and the per-step
drafted/accepted counts are real, but a round costs one ``decode`` per produced token, exactly
like decoding without a drafter (see the plugin README for the numbers).

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
    BundleError,
    Capabilities,
    Decoded,
    InferenceContext,
    Session,
    SlotError,
    StreamConfig,
    UnsupportedOperationError,
)
from eliza_backends.hf_tokenizer import HFTokenizer
from eliza_backends.sampling import Sampler
from eliza_backends.slots import fingerprint_artifact
from eliza_backends.speculative import Drafter, NgramDrafter, accept_greedy

from . import LiteRTOptions
from .container import LlmMetadata, check_tflite, read_container
from .ladder import Rung

RUNTIME = f"ai-edge-litert {importlib.metadata.version('ai-edge-litert')}"
_SLOT_MAGIC = b"ELZLTKV1"


@dataclass
class LoadedModel:
    """One interpreter and what the session needs to know about the model, shared by sessions."""

    path: Path
    runtime: str  # "interpreter" | "compiled"
    interpreter: Any  # ai-edge-litert Interpreter, or CompiledModel for runtime "compiled"
    prefill: dict[int, Any]  # exported prefill length -> signature runner (or signature name)
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


def _load_runtime(path: Path, model_bytes: bytes | None, runtime: str, threads: int,
                  accelerator: str) -> tuple[Any, dict[int, Any], Any, dict[str, Any],
                                             dict[str, Any]]:
    """(runtime object, prefill per length, decode, decode inputs, decode outputs); the
    input/output details map names to ``{"shape": ..., "dtype": ...}``."""
    if runtime == "compiled":
        from ai_edge_litert.compiled_model import CompiledModel  # type: ignore[import-untyped]
        from ai_edge_litert.hardware_accelerator import (  # type: ignore[import-untyped]
            HardwareAccelerator,
        )
        from ai_edge_litert.options import CpuOptions, Options  # type: ignore[import-untyped]

        accel = HardwareAccelerator.CPU
        if accelerator == "gpu":
            accel = HardwareAccelerator.GPU | HardwareAccelerator.CPU
        elif accelerator == "npu":
            accel = HardwareAccelerator.NPU | HardwareAccelerator.CPU
        opts = Options(hardware_accelerators=accel, cpu_options=CpuOptions(num_threads=threads))
        data = model_bytes if model_bytes is not None else path.read_bytes()
        cm = CompiledModel.from_buffer(data, options=opts)
        sigs = list(cm.get_signature_list())
        prefill = {int(n[8:]): n for n in sigs if n.startswith("prefill_") and n[8:].isdigit()}
        if not prefill or "decode" not in sigs:
            return cm, prefill, None, {}, {}
        return (cm, prefill, "decode", cm.get_input_tensor_details("decode"),
                cm.get_output_tensor_details("decode"))
    if model_bytes is not None:
        it = Interpreter(model_content=model_bytes, num_threads=threads)
    else:
        it = Interpreter(model_path=str(path), num_threads=threads)
    sigs = list(it.get_signature_list())
    prefill = {int(n[8:]): it.get_signature_runner(n) for n in sigs
               if n.startswith("prefill_") and n[8:].isdigit()}
    if not prefill or "decode" not in sigs:
        return it, prefill, None, {}, {}
    decode = it.get_signature_runner("decode")
    return it, prefill, decode, decode.get_input_details(), decode.get_output_details()


def load_model(path: Path, threads: int, runtime: str = "interpreter",
               accelerator: str = "cpu") -> LoadedModel:
    """Check the artifact, extract the TFLite model and tokenizer, build the interpreter (or
    the compiled model)."""
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
    try:
        tok = _find_tokenizer(path, container_json)
    except BundleError:
        if path.suffix.lower() == ".litertlm" and container.find("SP_Tokenizer") is not None:
            raise BundleError(f"{path} carries a SentencePiece tokenizer; this backend reads "
                              "HF tokenizer.json (HF_Tokenizer_Zlib) only: put a tokenizer.json "
                              "beside it or rebuild the container with the HF tokenizer") \
                from None
        raise
    try:
        it, prefill, decode, inputs, outputs = _load_runtime(path, model_bytes, runtime,
                                                             threads, accelerator)
    except (ValueError, RuntimeError) as exc:
        raise BundleError(f"ai-edge-litert cannot load {path}: {exc}") from None
    if not prefill or decode is None:
        raise BundleError(f"{path} has no prefill_<N>/decode signatures; export it with "
                          "litert-torch's generative exporter")
    need = {"tokens", "input_pos", "mask"}
    if not need <= set(inputs) or "logits" not in outputs:
        raise BundleError(f"{path}: the decode signature lacks {sorted(need)} inputs or a "
                          "logits output; this backend serves litert-torch exports")
    cache_specs = {k: (tuple(int(d) for d in v["shape"]), np.dtype(v["dtype"]))
                   for k, v in inputs.items() if k.startswith("kv_cache_")}
    cache_len = int(inputs["mask"]["shape"][-1])
    vocab = int(outputs["logits"]["shape"][-1])
    if tok.vocab_size > vocab:
        raise BundleError(f"{path}: the tokenizer has {tok.vocab_size} ids but the model's "
                          f"logits have {vocab}; the tokenizer belongs to another model")
    bos, eog = _special_ids(tok, meta)
    keys = np.arange(cache_len)
    masks = np.where(keys[None, :] <= keys[:, None], 0.0,
                     np.finfo(np.float32).min).astype(np.float32)
    return LoadedModel(path=path, runtime=runtime, interpreter=it, prefill=prefill,
                       decode=decode, cache_specs=cache_specs, cache_len=cache_len,
                       vocab_size=vocab, tokenizer=tok, bos=bos, eog=eog,
                       chat_template=meta.jinja_prompt_template, masks=masks)


class _NumpyKV:
    """The KV cache as numpy arrays passed into and out of each Interpreter call."""

    def __init__(self, model: LoadedModel) -> None:
        self.model = model
        self.cache = {k: np.zeros(shape, dtype=dt) for k, (shape, dt) in
                      model.cache_specs.items()}

    def prefill(self, size: int, tokens: Any, positions: Any, mask: Any) -> None:
        with self.model.lock:
            self.cache = self.model.prefill[size](tokens=tokens, input_pos=positions, mask=mask,
                                                  **self.cache)

    def decode(self, tokens: Any, positions: Any, mask: Any) -> Any:
        with self.model.lock:
            out = self.model.decode(tokens=tokens, input_pos=positions, mask=mask, **self.cache)
        logits = out.pop("logits")[0, -1]
        self.cache = out
        return logits

    def arrays(self) -> dict[str, Any]:
        return self.cache

    def load(self, arrays: dict[str, Any]) -> None:
        self.cache = arrays

    def close(self) -> None:
        self.cache = {}


class _BufferKV:
    """The KV cache in LiteRT TensorBuffers owned by the session, updated in place by the
    CompiledModel (each buffer is both input and output): no copy of the cache per call."""

    def __init__(self, model: LoadedModel) -> None:
        self.model = model
        cm = model.interpreter
        self.kv = {}
        for name, (shape, dt) in model.cache_specs.items():
            buf = cm.create_input_buffer_by_name("decode", name)
            buf.write(np.zeros(shape, dtype=dt))  # fresh memory may hold NaNs the mask can't hide
            self.kv[name] = buf
        self.small: dict[tuple[str, str], Any] = {}
        self.logits = cm.create_output_buffer_by_name("decode", "logits")

    def _inputs(self, sig: str, tokens: Any, positions: Any, mask: Any) -> dict[str, Any]:
        cm = self.model.interpreter
        ins = {}
        for name, value in (("tokens", tokens), ("input_pos", positions), ("mask", mask)):
            buf = self.small.get((sig, name))
            if buf is None:
                buf = self.small[(sig, name)] = cm.create_input_buffer_by_name(sig, name)
            buf.write(np.ascontiguousarray(value))
            ins[name] = buf
        return {**ins, **self.kv}

    def prefill(self, size: int, tokens: Any, positions: Any, mask: Any) -> None:
        sig = self.model.prefill[size]
        with self.model.lock:
            self.model.interpreter.run_by_name(sig, self._inputs(sig, tokens, positions, mask),
                                               dict(self.kv))

    def decode(self, tokens: Any, positions: Any, mask: Any) -> Any:
        with self.model.lock:
            self.model.interpreter.run_by_name(
                "decode", self._inputs("decode", tokens, positions, mask),
                {"logits": self.logits, **self.kv})
            return self.logits.read(self.model.vocab_size, np.float32)

    def arrays(self) -> dict[str, Any]:
        out = {}
        for name, (shape, dt) in self.model.cache_specs.items():
            out[name] = self.kv[name].read(int(np.prod(shape)), dt).reshape(shape)
        return out

    def load(self, arrays: dict[str, Any]) -> None:
        for name, value in arrays.items():
            self.kv[name].write(np.ascontiguousarray(value))

    def close(self) -> None:
        self.kv, self.small = {}, {}


def _default_threads() -> int:
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:  # macOS, Windows
        return os.cpu_count() or 1


def open_session(context: InferenceContext, config: StreamConfig, options: LiteRTOptions,
                 path: Path, rung: Rung) -> LiteRTSession:
    """Load (or reuse) the interpreter on ``context`` and open a session on it."""
    if config.drafter == "model":
        raise UnsupportedOperationError(
            "the LiteRT token-exact session has no draft-model drafter (capabilities.drafters "
            "is none, ngram): use drafter='ngram', or backend llama.cpp / mlx for a draft model")
    if config.drafter != "none" and (not config.greedy or config.repeat_penalty != 1.0):
        raise UnsupportedOperationError(
            "LiteRT speculative decoding is greedy-only here: use temperature=0 and "
            "repeat_penalty=1 with a drafter, or drafter='none' to sample")
    threads = config.threads or _default_threads()
    runtime = options.runtime
    accel = rung.engine_backend if runtime == "compiled" else "cpu"
    key = ("litert-lm", runtime, str(path), threads, accel)
    model = context.shared(key, lambda: load_model(path, threads, runtime, accel))
    drafter = NgramDrafter(max_n=config.ngram_size) if config.drafter == "ngram" else None
    return LiteRTSession(model, config, context, rung, drafter)


class LiteRTSession(Session):
    """A token-exact generation on the Interpreter (or CompiledModel): the session's own KV
    cache, the core's numpy sampler."""

    backend_name = "litert-lm"

    def __init__(self, model: LoadedModel, config: StreamConfig,
                 context: InferenceContext | None, rung: Rung,
                 drafter: Drafter | None = None) -> None:
        self._model = model
        self._drafter = drafter
        # the Interpreter runs on XNNPACK (CPU) whatever the rung; the compiled model on the rung
        self.accelerator = "cpu" if model.runtime == "interpreter" else rung.engine_backend
        self.ladder_rung = rung.name
        self._n_ctx = min(config.context_size, model.cache_len)
        self._kv: _NumpyKV | _BufferKV = (_BufferKV(model) if model.runtime == "compiled"
                                          else _NumpyKV(model))
        self._sampler = Sampler(config)
        self._logits: Any = None
        self._n_kv = 0  # positions held in the KV cache: history[:n_kv]
        self._pending: list[int] = []  # history tokens not yet in the KV cache
        lengths = sorted(model.prefill)
        self._lengths = [n for n in lengths if n <= config.batch_size] or lengths[:1]
        super().__init__(config, context)

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
    def template_tokens(self) -> dict[str, str]:
        return self._model.tokenizer.template_tokens(self._model.bos, self._model.eog)

    @property
    def capabilities(self) -> Capabilities:
        return Capabilities(token_input=True, prefix_reuse=True, slots=True,
                            cancel_prefill=False, sampling=True,
                            drafters=frozenset({"none", "ngram"}))

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
            self._kv.prefill(size, ids, positions, m.masks[pos:pos + size][None, None])
            i += len(chunk)
            self._n_kv = start + i

    def _run_decode(self, token: int) -> None:
        """Feed one token at position n_kv; keeps its logits."""
        m = self._model
        pos = self._n_kv
        self._logits = self._kv.decode(np.array([[token]], dtype=np.int32),
                                       np.array([pos], dtype=np.int32),
                                       m.masks[pos][None, None, None])
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
        if self._drafter is not None:
            return self._decode_speculative(max_tokens)
        out: list[int] = []
        eog = self._model.eog
        stop_at_eog = not self.config.ignore_eos
        sampler = self._sampler
        history = self._history
        penalize = self.config.repeat_penalty != 1.0
        window = self.config.repeat_last_n
        cancel = self._cancel
        for _ in range(max_tokens):
            if self._pending:
                if cancel.is_set():
                    self._raise_if_cancelled()
                pending = self._pending
                if len(pending) > 1:  # after restore_slot: history the cache does not hold
                    self._run_prefill(pending[:-1])
                self._run_decode(pending[-1])
                self._pending = []
            if penalize:
                tok = sampler.sample(self._logits, (history[-window:] if window else []) + out)
            elif sampler.greedy:
                tok = int(self._logits.argmax())
            else:
                tok = sampler.sample(self._logits)
            out.append(tok)
            self._pending = [tok]
            if stop_at_eog and tok in eog:
                break
        return Decoded(out)

    def _flush_pending(self) -> None:
        """Feed the history tokens the KV cache does not hold yet; leaves their logits."""
        pending = self._pending
        if len(pending) > 1:  # after restore_slot / reset_keep beyond the cache
            self._run_prefill(pending[:-1])
        self._run_decode(pending[-1])
        self._pending = []

    def _decode_speculative(self, max_tokens: int) -> Decoded:
        """Rounds of: draft k tokens from the sequence (n-gram lookup), verify them through
        ``decode`` one position at a time, keep the agreeing prefix plus the target's own next
        token. Greedy, so the output equals decoding without a drafter token for token."""
        assert self._drafter is not None
        drafter = self._drafter
        eog = self._model.eog
        stop_at_eog = not self.config.ignore_eos
        seq = list(self._history)
        out: list[int] = []
        drafted = accepted = 0

        def target(i: int) -> int:
            # the token after [last, d1..di]; called only when d1..d(i-1) were accepted, so
            # feeding d_i here writes an accepted token at the next position: no rollback
            if i > 0:
                self._raise_if_cancelled()
                self._run_decode(drafts[i - 1])
            return int(self._logits.argmax())

        def is_end(tok: int) -> bool:
            return stop_at_eog and tok in eog

        while len(out) < max_tokens:
            self._raise_if_cancelled()
            if self._pending:
                self._flush_pending()
            k = min(self.config.draft_length, max_tokens - len(out) - 1)
            drafts = drafter.propose(seq, k) if k > 0 else []
            produced, n_ok = accept_greedy(drafts, target, is_end)
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
        self._n_kv = 0
        self._pending = []
        self._logits = None
        self._sampler.reset()

    def _truncate(self, n_keep: int) -> bool:
        if self._drafter is not None:
            self._drafter.truncate(n_keep)
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
        cache = self._kv.arrays()
        names = sorted(cache)
        head = json.dumps({"n_kv": self._n_kv, "arrays": [
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
        if self._drafter is not None:
            self._drafter.truncate(0)
        self._n_kv = n_kv
        self._pending = list(tokens[n_kv:])
        self._logits = None
        if not self._pending:  # the logits are not saved: recompute them from the last token
            self._n_kv = n_kv - 1
            self._pending = [tokens[-1]]
        # the first next() feeds the pending tokens (cheap restore; no cancel check here)

    def _close(self) -> None:
        if self._drafter is not None:
            self._drafter.close()
            self._drafter = None
        self._kv.close()
        self._logits = None


__all__ = ["LiteRTSession", "LoadedModel", "load_model", "open_session"]
