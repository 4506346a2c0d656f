"""The MLX session's slot payload: mlx-lm's prompt cache and the last token's logits, as bytes.

Layout: a 20-byte head (magic ``b"ELZMLX01"``, u32 cached tokens, u64 length of the cache
file), mlx-lm's prompt-cache safetensors file (:func:`mlx_lm.models.cache.save_prompt_cache`),
then a safetensors file holding ``logits`` (shape ``(1, vocab)``). The core's slot file
(:mod:`eliza_backends.runtime.slots`) wraps the payload with the model's fingerprint; this
module only packs and unpacks it, and checks that it is well formed. Runs on the mlx thread.
"""

from __future__ import annotations

import os
import struct
import tempfile
from pathlib import Path
from typing import Any

import mlx.core as mx  # type: ignore[import-not-found,unused-ignore]
from mlx_lm.models.cache import (  # type: ignore[import-not-found,unused-ignore]
    load_prompt_cache,
    save_prompt_cache,
)

from eliza_backends import SlotError

_SLOT_MAGIC = b"ELZMLX01"
_SLOT_HEAD = struct.Struct("<8sIQ")  # magic, cached tokens, prompt-cache file length


def pack_slot(cache: list[Any], n_kv: int, logits: Any) -> bytes:
    """The payload of a prompt cache holding ``n_kv`` tokens and the logits of the last."""
    with tempfile.TemporaryDirectory(prefix="eliza-mlx-slot-") as tmp:
        cache_file = os.path.join(tmp, "cache.safetensors")
        logits_file = os.path.join(tmp, "logits.safetensors")
        save_prompt_cache(cache_file, cache, {"eliza_n_kv": str(n_kv)})
        mx.save_safetensors(logits_file, {"logits": logits})
        cache_bytes = Path(cache_file).read_bytes()
        logits_bytes = Path(logits_file).read_bytes()
    return _SLOT_HEAD.pack(_SLOT_MAGIC, n_kv, len(cache_bytes)) + cache_bytes + logits_bytes


def unpack_slot(payload: bytes, n_tokens: int) -> tuple[list[Any], Any, int]:
    """``(cache, logits, n_kv)`` of a payload saved for a history of ``n_tokens`` tokens,
    evaluated; :class:`SlotError` for anything malformed (the caller checks that the cache
    fits its model)."""
    if len(payload) < _SLOT_HEAD.size:
        raise SlotError("slot payload is too short for an MLX state")
    magic, n_kv, cache_len = _SLOT_HEAD.unpack_from(payload)
    body = payload[_SLOT_HEAD.size:]
    if magic != _SLOT_MAGIC or cache_len > len(body):
        raise SlotError("slot payload is not an MLX prompt-cache state")
    if n_kv != n_tokens:
        raise SlotError(f"slot says {n_kv} cached tokens for a history of {n_tokens}")
    with tempfile.TemporaryDirectory(prefix="eliza-mlx-slot-") as tmp:
        cache_file = os.path.join(tmp, "cache.safetensors")
        logits_file = os.path.join(tmp, "logits.safetensors")
        Path(cache_file).write_bytes(body[:cache_len])
        Path(logits_file).write_bytes(body[cache_len:])
        try:
            cache = load_prompt_cache(cache_file)  # type: ignore[no-untyped-call,unused-ignore]
            loaded = mx.load(logits_file)
            if not isinstance(loaded, dict) or "logits" not in loaded:
                raise ValueError("no logits in the saved state")
            logits: Any = loaded["logits"]
            mx.eval(logits, [c.state for c in cache])
        except Exception as exc:
            raise SlotError(f"mlx-lm could not read the saved prompt cache: {exc}") from None
    return list(cache), logits, n_kv


__all__ = ["pack_slot", "unpack_slot"]
