"""Greedy decoding straight on each runtime, with no eliza_backends code in between.

These helpers are the reference path for parity checks (tests, benchmarks, backend
tests): each one loads a model artifact with its runtime's own Python API and
decodes greedily from token ids (or, for LiteRT-LM, from text, the only input its
Python API takes). Runtime imports happen inside the functions, so importing this
module needs none of them.

Loaded models are cached per path (they are tiny and loading is the slow part of
a test); :func:`clear_caches` drops them.
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from functools import lru_cache
from pathlib import Path
from typing import Any

__all__ = [
    "clear_caches",
    "direct_llama",
    "litertlm_generate_text",
    "litertlm_tokenize",
    "llamacpp_greedy",
    "llamacpp_mtp_greedy",
    "llamacpp_tokenize",
    "mlx_greedy",
    "tflite_greedy",
]


# --------------------------------------------------------------------------- llama.cpp


def direct_llama(**kwargs: Any) -> Any:
    """``llama_cpp.Llama(**kwargs)`` with the plugin's extra-buffer choice for this host (on AMX
    CPUs llama-cpp-python 0.3.36's AMX matmul segfaults on Q4 weights; ``Llama`` has no switch,
    so its default model parameters are patched while it loads)."""
    import llama_cpp
    import llama_cpp.llama_cpp as low
    from eliza_llamacpp.model import host_has_amx

    original = low.llama_model_default_params

    def params() -> Any:
        p = original()
        p.use_extra_bufts = not host_has_amx()
        return p

    low.llama_model_default_params = params
    try:
        return llama_cpp.Llama(**kwargs)
    finally:
        low.llama_model_default_params = original


@lru_cache(maxsize=4)
def _llama(gguf_path: str, n_ctx: int, kv_type: int | None = None, flash_attn: bool = True):
    import llama_cpp

    kv = {} if kv_type is None else {"type_k": kv_type, "type_v": kv_type}
    return llama_cpp.Llama(
        model_path=gguf_path,
        n_ctx=n_ctx,
        n_batch=n_ctx,
        n_threads=1,
        n_threads_batch=1,
        logits_all=False,
        flash_attn=flash_attn,
        verbose=False,
        **kv,
    )


def llamacpp_greedy(
    gguf_path: str | os.PathLike[str], prompt_ids: Sequence[int], n: int, *, n_ctx: int = 512,
    kv_type: int | None = None, flash_attn: bool = True,
) -> list[int]:
    """``n`` greedy token ids after ``prompt_ids`` (which already hold BOS), via llama-cpp-python
    (``kv_type``: the KV cache's ggml type, default llama.cpp's f16; ``flash_attn``: on by
    default, as the plugin's ``flash_attention="auto"`` is on a CPU).

    Argmax over the float logits of each step; no stop on EOS/EOG.
    """
    import numpy as np

    llm = _llama(os.fspath(gguf_path), n_ctx, kv_type, flash_attn)
    if len(prompt_ids) + n > n_ctx:
        raise ValueError(f"{len(prompt_ids)} prompt + {n} new tokens exceed n_ctx={n_ctx}")
    import llama_cpp

    llm.reset()
    llm.eval(list(prompt_ids))
    n_vocab = llm.n_vocab()
    out: list[int] = []
    for i in range(n):
        # Llama.eval keeps no logits when logits_all=False: read the last row directly
        logits = np.ctypeslib.as_array(
            llama_cpp.llama_get_logits_ith(llm.ctx, -1), shape=(n_vocab,)
        )
        nxt = int(np.argmax(logits))
        out.append(nxt)
        if i + 1 < n:
            llm.eval([nxt])
    return out


def llamacpp_tokenize(
    gguf_path: str | os.PathLike[str], text: str, *, add_bos: bool = True
) -> list[int]:
    """llama.cpp's own tokenization of ``text`` (special-token strings parsed as tokens)."""
    llm = _llama(os.fspath(gguf_path), 512)
    return list(llm.tokenize(text.encode("utf-8"), add_bos=add_bos, special=True))


@lru_cache(maxsize=2)
def _mtp_pair(target_path: str, assistant_path: str, n_ctx: int = 1024):
    """A target context made with ``load_mtp`` that emits its post-norm hidden rows, and an MTP
    context of the assistant over it (``ctx_type = MTP``, ``ctx_other = target``)."""
    import llama_cpp as L
    import llama_cpp.llama_cpp_ext as X

    L.llama_backend_init()
    mp = L.llama_model_default_params()
    mp.load_mtp = True
    tm = L.llama_model_load_from_file(target_path.encode(), mp)
    am = L.llama_model_load_from_file(assistant_path.encode(), L.llama_model_default_params())
    if not tm or not am:
        raise ValueError(f"cannot load {target_path} / {assistant_path}")

    def params(mtp_over=None):
        cp = L.llama_context_default_params()
        cp.n_ctx = cp.n_batch = cp.n_ubatch = n_ctx
        cp.n_threads = cp.n_threads_batch = 1
        if mtp_over is not None:
            cp.ctx_type = L.LLAMA_CONTEXT_TYPE_MTP
            cp.ctx_other = mtp_over
            cp.n_outputs_max = 1
        return cp

    tctx = L.llama_init_from_model(tm, params())
    actx = L.llama_init_from_model(am, params(tctx))
    if not tctx or not actx:
        raise ValueError("cannot create the target / MTP contexts")
    X.llama_set_embeddings_nextn(tctx, True, False)
    X.llama_set_embeddings_nextn(actx, True, False)
    return tm, am, tctx, actx


def _mtp_io(target_path: str, assistant_path: str, capacity: int) -> dict[str, Any]:
    """The calls one MTP round needs, over :func:`_mtp_pair`'s contexts: ``decode_target(ids,
    pos0)`` (logits and hidden rows for every token), ``draft(token, pos, h)`` -> (argmax,
    assistant hidden row), ``top(i)`` / ``hidden(i)`` of the target's last batch, ``trim(p)``
    (drop the target's KV from position p on), ``clear()`` and ``free()``."""
    import ctypes

    import llama_cpp as L
    import llama_cpp.llama_cpp_ext as X
    import numpy as np

    tm, _am, tctx, actx = _mtp_pair(target_path, assistant_path)
    n_vocab = L.llama_vocab_n_tokens(L.llama_model_get_vocab(tm))
    n_embd = L.llama_model_n_embd(tm)
    mem = L.llama_get_memory(tctx)
    tok_batch = L.llama_batch_init(capacity, 0, 1)
    emb_batch = L.llama_batch_init(1, n_embd, 1)
    emb_tokens = (L.llama_token * 1)()
    emb_batch.token = ctypes.cast(emb_tokens, ctypes.POINTER(L.llama_token))

    def fill(batch: Any, i: int, pos: int) -> None:
        batch.pos[i] = pos
        batch.n_seq_id[i] = 1
        batch.seq_id[i][0] = 0
        batch.logits[i] = 1

    def decode_target(tokens: list[int], pos0: int) -> None:
        tok_batch.n_tokens = len(tokens)
        for i, t in enumerate(tokens):
            tok_batch.token[i] = t
            fill(tok_batch, i, pos0 + i)
        if L.llama_decode(tctx, tok_batch) != 0:
            raise RuntimeError("target decode failed")

    def hidden_of(ctx: Any, i: int) -> Any:
        return np.ctypeslib.as_array(X.llama_get_embeddings_nextn_ith(ctx, i),
                                     shape=(n_embd,)).copy()

    def top_of(ctx: Any, i: int) -> int:
        return int(np.argmax(np.ctypeslib.as_array(L.llama_get_logits_ith(ctx, i),
                                                   shape=(n_vocab,))))

    def draft(token: int, pos: int, h: Any) -> tuple[int, Any]:
        emb_batch.n_tokens = 1
        emb_tokens[0] = token
        ctypes.memmove(emb_batch.embd, h.ctypes.data, n_embd * 4)
        fill(emb_batch, 0, pos)
        if L.llama_decode(actx, emb_batch) != 0:
            raise RuntimeError("assistant decode failed")
        return top_of(actx, 0), hidden_of(actx, 0)

    def free() -> None:
        L.llama_batch_free(tok_batch)
        emb_batch.token = None  # (owned by Python, not by llama_batch_free)
        L.llama_batch_free(emb_batch)

    return {"decode_target": decode_target, "draft": draft,
            "top": lambda i: top_of(tctx, i), "hidden": lambda i: hidden_of(tctx, i),
            "trim": lambda p: L.llama_memory_seq_rm(mem, 0, p, -1),
            "clear": lambda: L.llama_memory_clear(mem, True), "free": free}


def llamacpp_mtp_greedy(
    target_path: str | os.PathLike[str], assistant_path: str | os.PathLike[str],
    prompt_ids: Sequence[int], n: int, k: int = 4,
) -> tuple[list[int], int, int]:
    """``n`` greedy ids after ``prompt_ids`` with Gemma 4's MTP assistant drafting up to ``k``
    tokens a round, straight on llama-cpp-python's low-level API; returns (ids, drafted,
    accepted).

    As llama.cpp's ``common_speculative_impl_draft_mtp`` runs a shared-KV assistant: a round
    drafts at one position p, first from the target's sampled token with the target's hidden
    row at p-1, then from each drafted token with the assistant's own output row; the target
    verifies the drafts in one batch (greedy) and its KV is trimmed after the first mismatch.
    """
    ids = list(prompt_ids)
    io = _mtp_io(os.fspath(target_path), os.fspath(assistant_path), len(ids) + k + 1)
    try:
        io["clear"]()
        io["decode_target"](ids, 0)
        t, h = io["top"](len(ids) - 1), io["hidden"](len(ids) - 1)
        out, pos = [t], len(ids)  # pos: position of t, not yet in the target's KV
        drafted = accepted = 0
        while len(out) < n:
            drafts: list[int] = []
            tok, hid = t, h
            for _ in range(min(k, n - len(out))):
                tok, hid = io["draft"](tok, pos, hid)
                drafts.append(tok)
            drafted += len(drafts)
            io["decode_target"]([t, *drafts], pos)
            verified = [io["top"](i) for i in range(len(drafts) + 1)]
            m = 0
            while m < len(drafts) and drafts[m] == verified[m]:
                m += 1
            accepted += m
            h = io["hidden"](m)
            io["trim"](pos + m + 1)
            out += [*drafts[:m], verified[m]]
            pos += m + 1
            t = out[-1]
        return out[:n], drafted, accepted
    finally:
        io["free"]()


# --------------------------------------------------------------------------- MLX


@lru_cache(maxsize=4)
def _mlx_model(model_dir: str):
    from mlx_lm.utils import load_model

    model, _config = load_model(Path(model_dir))
    return model


def mlx_greedy(model_dir: str | os.PathLike[str], prompt_ids: Sequence[int], n: int) -> list[int]:
    """``n`` greedy token ids after ``prompt_ids`` from an MLX weights folder, via mlx-lm."""
    import mlx.core as mx
    from mlx_lm.generate import generate_step

    model = _mlx_model(os.fspath(model_dir))
    out: list[int] = []
    steps = generate_step(
        mx.array(list(prompt_ids), dtype=mx.uint32),
        model,
        max_tokens=n,
        sampler=lambda logprobs: mx.argmax(logprobs, axis=-1),
    )
    for token, _logprobs in steps:
        out.append(int(token))
        if len(out) == n:
            break
    return out


# --------------------------------------------------------------------------- .tflite


@lru_cache(maxsize=4)
def _tflite(tflite_path: str):
    from ai_edge_litert.interpreter import Interpreter

    it = Interpreter(model_path=tflite_path, num_threads=1)
    prefill = {}
    for name in it.get_signature_list():
        if name.startswith("prefill_"):
            prefill[int(name.split("_")[1])] = it.get_signature_runner(name)
    if not prefill or "decode" not in it.get_signature_list():
        raise ValueError(f"{tflite_path} lacks prefill_<N>/decode signatures")
    decode = it.get_signature_runner("decode")
    cache_specs = {
        k: (tuple(v["shape"]), v["dtype"])
        for k, v in decode.get_input_details().items()
        if k.startswith("kv_cache_")
    }
    cache_len = decode.get_input_details()["mask"]["shape"][-1]
    return it, prefill, decode, cache_specs, int(cache_len)


def _mask(positions, cache_len: int):
    """Additive causal mask [1, 1, T, cache_len]: 0 where key pos <= query pos."""
    import numpy as np

    keys = np.arange(cache_len)[None, :]
    allowed = keys <= np.asarray(positions)[:, None]
    m = np.where(allowed, 0.0, np.finfo(np.float32).min).astype(np.float32)
    return m[None, None]


def tflite_greedy(
    tflite_path: str | os.PathLike[str], prompt_ids: Sequence[int], n: int
) -> list[int]:
    """``n`` greedy ids from a litert-torch ``.tflite`` (``prefill_<N>`` / ``decode`` signatures).

    The KV cache lives in numpy arrays passed in and out of each call. Prefill
    returns only the cache, so all prompt tokens but the last are prefilled (in
    chunks, padded to a signature length; padding lands in cache slots that later
    tokens overwrite before anything attends to them) and the last prompt token
    goes through ``decode`` to give the first logits.
    """
    import numpy as np

    _it, prefill, decode, cache_specs, cache_len = _tflite(os.fspath(tflite_path))
    ids = list(prompt_ids)
    if not ids:
        raise ValueError("prompt_ids must hold at least one token (BOS)")
    if len(ids) + n > cache_len:
        raise ValueError(f"{len(ids)} prompt + {n} new tokens exceed the KV cache ({cache_len})")
    cache = {k: np.zeros(shape, dtype=dt) for k, (shape, dt) in cache_specs.items()}
    lengths = sorted(prefill)

    pos = 0
    head = ids[:-1]
    while pos < len(head):
        remaining = len(head) - pos
        fitting = [L for L in lengths if pos + L <= cache_len]
        size = next((L for L in fitting if remaining <= L), fitting[-1])
        chunk = head[pos : pos + size]
        tokens = np.zeros((1, size), dtype=np.int32)
        tokens[0, : len(chunk)] = chunk
        positions = np.arange(pos, pos + size, dtype=np.int32)
        cache = prefill[size](
            tokens=tokens, input_pos=positions, mask=_mask(positions, cache_len), **cache
        )
        pos += len(chunk)

    out: list[int] = []
    cur = ids[-1]
    for _ in range(n):
        positions = np.array([pos], dtype=np.int32)
        res = decode(
            tokens=np.array([[cur]], dtype=np.int32),
            input_pos=positions,
            mask=_mask(positions, cache_len),
            **cache,
        )
        logits = res.pop("logits")
        cache = res
        cur = int(np.argmax(logits[0, -1]))
        out.append(cur)
        pos += 1
    return out


# --------------------------------------------------------------------------- LiteRT-LM


@lru_cache(maxsize=4)
def _litertlm_engine(path: str, cache_dir: str):
    import litert_lm

    os.makedirs(cache_dir, exist_ok=True)
    return litert_lm.Engine(
        path, backend=litert_lm.Backend.CPU(thread_count=1), cache_dir=cache_dir
    )


def litertlm_generate_text(
    litertlm_path: str | os.PathLike[str],
    prompt_text: str,
    n: int,
    cache_dir: str | os.PathLike[str],
) -> str:
    """Greedy text from a ``.litertlm`` via ``litert_lm.Engine`` (CPU), at most ``n`` tokens.

    ``prompt_text`` is raw model input without the BOS string: the engine prepends
    its start token itself, and no prompt template is applied (a chat prompt must
    already be rendered). Generation stops early at the bundle's stop tokens (their
    text is not returned). When generation is cut at ``n`` tokens, a trailing
    whitespace-only token is not returned yet (the engine's streaming detokenizer
    holds it back in case the next token merges with it).
    ``cache_dir`` must be a writable directory (created if missing).
    """
    import litert_lm

    engine = _litertlm_engine(os.fspath(litertlm_path), os.fspath(cache_dir))
    session = engine.create_session(
        apply_prompt_template=False,
        sampler_config=litert_lm.SamplerConfig(top_k=1, temperature=0.0, seed=0),
        max_output_tokens=n,
    )
    try:
        session.run_prefill([prompt_text])
        parts = []
        for resp in session.run_decode_async():
            parts.extend(resp.texts)
        return "".join(parts)
    finally:
        session.close()


def litertlm_tokenize(
    litertlm_path: str | os.PathLike[str], text: str, cache_dir: str | os.PathLike[str]
) -> list[int]:
    """The LiteRT-LM engine's tokenization of ``text`` (no start token added)."""
    engine = _litertlm_engine(os.fspath(litertlm_path), os.fspath(cache_dir))
    return engine.tokenize(text)


def clear_caches() -> None:
    """Forget every loaded model / engine (they are freed when no longer referenced)."""
    for f in (_llama, _mtp_pair, _mlx_model, _tflite, _litertlm_engine):
        f.cache_clear()
