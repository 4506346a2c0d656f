"""GGUF tensors and facts <-> a Hugging Face checkpoint folder, name for name, both ways.

The folder is what transformers, ``mlx_lm convert`` and litert-torch read: ``config.json``
(every field written explicitly, legacy ``rope_theta`` keys included so that no reader falls
back to a default), ``generation_config.json``, ``model.safetensors`` (float32) and the
tokenizer files (:mod:`.tokenizer_build`).

What differs between families (the layer tensors' names, the layout differences llama.cpp's
own HF converter applies, the family's config fields) is each family's (:mod:`.families`);
here are the shared parts: the name mapping given a family's layer table, llama.cpp's rotary
permutation, the shared config fields.
"""

from __future__ import annotations

import json
import re
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from ..errors import BundleError
from .facts import ModelFacts

_TOP = {"token_embd": "model.embed_tokens", "output_norm": "model.norm", "output": "lm_head"}
_TOP_HF = {hf: gguf for gguf, hf in _TOP.items()}
_BLOCK = re.compile(r"^blk\.(\d+)\.(\w+)\.weight$")
_HF_LAYER = re.compile(r"^model\.layers\.(\d+)\.([\w.]+)\.weight$")


def hf_name(table: Mapping[str, str], architecture: str, gguf_name: str) -> str:
    """The Hugging Face state-dict key of a GGUF tensor, ``table`` mapping the GGUF layer
    parts to HF layer modules (:class:`BundleError` if unknown)."""
    if m := _BLOCK.match(gguf_name):
        part = table.get(m.group(2))
        if part is not None:
            return f"model.layers.{m.group(1)}.{part}.weight"
    elif gguf_name.endswith(".weight") and gguf_name[:-7] in _TOP:
        return f"{_TOP[gguf_name[:-7]]}.weight"
    raise BundleError(f"GGUF tensor {gguf_name!r} has no Hugging Face counterpart for "
                      f"architecture {architecture}")


def gguf_name(table: Mapping[str, str], architecture: str, hf_key: str) -> str:
    """The GGUF tensor name of a Hugging Face state-dict key (:class:`BundleError` if
    unknown): the inverse of :func:`hf_name`."""
    if m := _HF_LAYER.match(hf_key):
        part = next((g for g, h in table.items() if h == m.group(2)), None)
        if part is not None:
            return f"blk.{m.group(1)}.{part}.weight"
    elif hf_key.endswith(".weight") and (top := _TOP_HF.get(hf_key[:-7])) is not None:
        return f"{top}.weight"
    raise BundleError(f"Hugging Face tensor {hf_key!r} has no GGUF counterpart for "
                      f"architecture {architecture}")


def unpermute_rotary(w: Any, n_head: int) -> Any:
    """Inverse of llama.cpp's rotary permutation of q/k rows."""
    rows = w.shape[0]
    return (w.reshape(n_head, rows // n_head // 2, 2, *w.shape[1:])
            .swapaxes(1, 2).reshape(w.shape))


def permute_rotary(w: Any, n_head: int) -> Any:
    """llama.cpp's rotary permutation of q/k rows (as ``convert_hf_to_gguf.py`` applies it)."""
    rows = w.shape[0]
    return (w.reshape(n_head, 2, rows // n_head // 2, *w.shape[1:])
            .swapaxes(1, 2).reshape(w.shape))


def config_dict(facts: ModelFacts, family_fields: dict[str, Any]) -> dict[str, Any]:
    """``config.json`` with every field the readers (transformers, mlx-lm, litert-torch) use:
    the shared ones, then ``family_fields`` (the family's, :mod:`.families`)."""
    tok = facts.tokenizer
    eos: int | list[int] | None = list(tok.eog_ids) if len(tok.eog_ids) > 1 else tok.eos_id
    cfg: dict[str, Any] = {
        "vocab_size": facts.vocab_size, "hidden_size": facts.hidden_size,
        "intermediate_size": facts.intermediate_size, "num_hidden_layers": facts.num_layers,
        "num_attention_heads": facts.num_heads, "num_key_value_heads": facts.num_kv_heads,
        "head_dim": facts.head_dim, "rms_norm_eps": facts.rms_norm_eps,
        "max_position_embeddings": facts.max_position_embeddings,
        "tie_word_embeddings": facts.tie_word_embeddings, "attention_bias": False,
        "attention_dropout": 0.0, "bos_token_id": tok.bos_id, "eos_token_id": eos,
        "pad_token_id": tok.pad_id, "rope_theta": facts.rope_theta, "rope_scaling": None,
        "dtype": "float32", "torch_dtype": "float32", "use_cache": True,
    }
    cfg.update(family_fields)
    return cfg


def generation_config_dict(facts: ModelFacts) -> dict[str, Any]:
    """``generation_config.json``: BOS, every end-of-generation id, pad."""
    tok = facts.tokenizer
    return {"bos_token_id": tok.bos_id, "eos_token_id": list(tok.eog_ids),
            "pad_token_id": tok.pad_id}


def write_json(path: Path, data: Any) -> None:
    """Pretty JSON with a final newline, UTF-8, non-ASCII kept."""
    path.write_text(json.dumps(data, indent=2, ensure_ascii=False) + "\n", encoding="utf-8")


__all__ = ["config_dict", "generation_config_dict", "gguf_name", "hf_name", "permute_rotary",
           "unpermute_rotary", "write_json"]
