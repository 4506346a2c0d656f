"""The LiteRT token-exact model: a litert-torch export loaded once per inference context.

:func:`load_model` checks the artifact (``.litertlm`` container or bare ``.tflite``), finds its
tokenizer, reads the signatures (``prefill_<N>`` / ``decode``) and the KV cache layout, and
builds ai-edge-litert's Interpreter (or CompiledModel) on a mapped file
(:mod:`eliza_litert.model_files`: the weights are never copied into Python memory). The
facts about the model become a :class:`~eliza_backends.ModelInfo`. The interpreter is not
thread-safe: every invoke holds :attr:`LoadedModel.lock`.
"""

from __future__ import annotations

import logging
import os
import threading
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
from ai_edge_litert.interpreter import Interpreter  # type: ignore[import-untyped]

from eliza_backends import BundleError, InferenceContext, ModelInfo
from eliza_backends.backend import (
    Tokenizer,
    distribution_version,
    find_tokenizer,
    load_tokenizer,
    tokenizer_facts,
)

from .container import Container, LlmMetadata, check_tflite, container_tokenizer, read_container
from .model_files import ModelFiles, model_files

RUNTIME = f"ai-edge-litert {distribution_version('ai-edge-litert') or 'unknown'}"


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
    tokenizer: Tokenizer
    info: ModelInfo
    masks: Any  # [cache_len, cache_len] float32 causal rows
    files: ModelFiles  # the mapped model file and XNNPACK's weight cache (owned)
    lock: threading.Lock = field(default_factory=threading.Lock)


def _find_tokenizer(path: Path, container: Container | None) -> tuple[Tokenizer, Path | None]:
    """The tokenizer and the folder of its Hugging Face files (None when embedded): the
    container's own HF or SentencePiece section, else (for a bare ``.tflite``) the sibling
    ``.litertlm``'s, else the bundle's tokenizer file
    (:func:`~eliza_backends.backend.find_tokenizer`)."""
    if container is not None and (tok := container_tokenizer(container)) is not None:
        return tok, None
    sibling = path.parent / f"{path.stem}.litertlm"
    if path.suffix == ".tflite" and sibling.is_file():
        found = container_tokenizer(read_container(sibling))
        if found is not None:
            return found, None
    file = find_tokenizer(path)
    if file is not None:
        return load_tokenizer(file), file.parent
    raise BundleError(f"no tokenizer for {path}: it has no HF_Tokenizer_Zlib or SP_Tokenizer "
                      f"section and neither {path.stem}.litertlm nor a tokenizer file "
                      f"({path.stem}.tokenizer.json, tokenizer.json, {path.stem}.tokenizer."
                      "model, tokenizer.model, or a folder with one) is beside it in text/")


def _model_info(path: Path, tok: Tokenizer, folder: Path | None, meta: LlmMetadata,
                vocab: int) -> ModelInfo:
    """The container's start/stop tokens and template win; a bare .tflite takes the
    tokenizer's own facts (:func:`~eliza_backends.prompt.tokenizer.tokenizer_facts`)."""
    facts = tokenizer_facts(tok, folder, vocab)
    bos: int | None = meta.start_token_ids[0] if meta.start_token_ids else None
    if bos is None and meta.start_token_str:
        bos = tok.token_id(meta.start_token_str)
    eog = {ids[0] for ids in meta.stop_token_ids if len(ids) == 1}
    eog |= {tid for text in meta.stop_token_strs if (tid := tok.token_id(text)) is not None}
    if not meta.stop_token_ids and not meta.stop_token_strs:  # a bare .tflite
        eog |= facts.eog
        bos = facts.bos if bos is None else bos
    return ModelInfo(
        vocab_size=vocab, eog_token_ids=frozenset(eog), bos_token_id=bos,
        chat_template=meta.jinja_prompt_template or facts.chat_template,
        template_tokens=facts.template_tokens or tok.template_tokens(bos, frozenset(eog)),
        artifact=path, runtime=RUNTIME, control_tokens=tok.control_texts)


def _load_runtime(files: ModelFiles, runtime: str, threads: int,
                  accelerator: str) -> tuple[Any, dict[int, Any], Any, dict[str, Any],
                                             dict[str, Any]]:
    """(runtime object, prefill per length, decode, decode inputs, decode outputs); the
    input/output details map names to ``{"shape": ..., "dtype": ...}``. Both runtimes map
    ``files.model``; the compiled one packs its weights into ``files.weight_cache``."""
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
        cpu = CpuOptions(num_threads=threads, xnnpack_weight_cache_path=str(files.weight_cache))
        opts = Options(hardware_accelerators=accel, cpu_options=cpu)
        cm = CompiledModel.from_file(str(files.model), options=opts)
        sigs = list(cm.get_signature_list())
        prefill = {int(n[8:]): n for n in sigs if n.startswith("prefill_") and n[8:].isdigit()}
        if not prefill or "decode" not in sigs:
            return cm, prefill, None, {}, {}
        return (cm, prefill, "decode", cm.get_input_tensor_details("decode"),
                cm.get_output_tensor_details("decode"))
    it = Interpreter(model_path=str(files.model), num_threads=threads)
    sigs = list(it.get_signature_list())
    prefill = {int(n[8:]): it.get_signature_runner(n) for n in sigs
               if n.startswith("prefill_") and n[8:].isdigit()}
    if not prefill or "decode" not in sigs:
        return it, prefill, None, {}, {}
    decode = it.get_signature_runner("decode")
    return it, prefill, decode, decode.get_input_details(), decode.get_output_details()


def _physical_memory() -> int:
    """Bytes of RAM on this host (a large number where the OS does not say)."""
    try:
        return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    except (ValueError, OSError, AttributeError):
        return 1 << 50


def load_model(path: Path, threads: int, runtime: str = "interpreter",
               accelerator: str = "cpu", cache_dir: str | None = None) -> LoadedModel:
    """Check the artifact, find the TFLite model and tokenizer, build the interpreter (or
    the compiled model) on the mapped model. ``cache_dir``: where the ``.litertlm``'s model
    copy and the weight cache go (:func:`~eliza_litert.model_files.model_files`); the
    returned model owns what it makes there when it is None (:func:`close_model` frees it)."""
    meta = LlmMetadata()
    container: Container | None = None
    if path.suffix.lower() == ".litertlm":
        container = read_container(path)
        container.check_tflite_section()
        meta = container.llm_metadata()
    else:
        check_tflite(path)
    tok, folder = _find_tokenizer(path, container)
    files = model_files(path, container, cache_dir)
    try:
        return _build(path, files, tok, folder, meta, runtime, threads, accelerator)
    except BaseException:
        files.remove()
        raise


def _build(path: Path, files: ModelFiles, tok: Tokenizer, folder: Path | None,
           meta: LlmMetadata, runtime: str, threads: int, accelerator: str) -> LoadedModel:
    """The runtime on ``files`` and the facts the session needs (the rest of load_model)."""
    try:
        it, prefill, decode, inputs, outputs = _load_runtime(files, runtime, threads,
                                                             accelerator)
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
    kv_bytes = sum(int(np.prod(shape)) * dt.itemsize for shape, dt in cache_specs.values())
    if kv_bytes > _physical_memory():
        raise BundleError(f"{path}: its KV cache takes {kv_bytes / 2**30:.1f} GiB, more than this "
                          "host's memory; export it with a shorter cache_length")
    cache_len = int(inputs["mask"]["shape"][-1])
    vocab = int(outputs["logits"]["shape"][-1])
    if tok.vocab_size > vocab:
        raise BundleError(f"{path}: the tokenizer has {tok.vocab_size} ids but the model's "
                          f"logits have {vocab}; the tokenizer belongs to another model")
    keys = np.arange(cache_len)
    masks = np.where(keys[None, :] <= keys[:, None], 0.0,
                     np.finfo(np.float32).min).astype(np.float32)
    return LoadedModel(path=path, runtime=runtime, interpreter=it, prefill=prefill,
                       decode=decode, cache_specs=cache_specs, cache_len=cache_len,
                       tokenizer=tok, info=_model_info(path, tok, folder, meta, vocab),
                       masks=masks, files=files)


def close_model(model: LoadedModel) -> None:
    """Drop the runtime and remove the temporary files the model owns. The runtime is freed
    here (a collection finds its reference cycles), its log lines routed into logging."""
    import gc

    from eliza_backends.backend import native_stderr_to_logging

    with native_stderr_to_logging(logging.getLogger("eliza_litert.native")):
        model.interpreter = model.decode = None
        model.prefill = {}
        gc.collect()
    model.files.remove()


def shared_model(context: InferenceContext, path: Path, threads: int, runtime: str,
                 accelerator: str, cache_dir: str | None = None) -> LoadedModel:
    """The model of ``path`` on ``context``: loaded on first use, then shared; closed with the
    context."""
    key = ("litert-lm", runtime, str(path), threads, accelerator, cache_dir)
    return context.shared(key, lambda: load_model(path, threads, runtime, accelerator,
                                                  cache_dir), close_model)


__all__ = ["RUNTIME", "LoadedModel", "close_model", "load_model",
           "shared_model"]
