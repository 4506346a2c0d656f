"""GGUF tensors and facts <-> a Hugging Face checkpoint folder, name for name, both ways.

The folder is what transformers, ``mlx_lm convert`` and litert-torch read: ``config.json``
(every field written explicitly, legacy ``rope_theta`` keys included so that no reader falls
back to a default), ``generation_config.json``, ``model.safetensors`` (float32) and the
tokenizer files (:mod:`.tokenizer_build`).

Layout differences, as llama.cpp's own HF converter applies them (undone by
:func:`to_hf_tensor`, applied by :func:`to_gguf_tensor`):

* llama: q/k projection rows are permuted to llama.cpp's rotary layout;
* gemma3: every RMSNorm weight is stored as ``1 + w``.
"""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

from ..errors import BundleError
from .gguf_source import ModelFacts

_LLAMA_LAYER = {
    "attn_norm": "input_layernorm", "ffn_norm": "post_attention_layernorm",
    "attn_q": "self_attn.q_proj", "attn_k": "self_attn.k_proj", "attn_v": "self_attn.v_proj",
    "attn_output": "self_attn.o_proj", "ffn_gate": "mlp.gate_proj", "ffn_up": "mlp.up_proj",
    "ffn_down": "mlp.down_proj",
}
_GEMMA3_LAYER = {
    **_LLAMA_LAYER,
    "post_attention_norm": "post_attention_layernorm", "ffn_norm": "pre_feedforward_layernorm",
    "post_ffw_norm": "post_feedforward_layernorm", "attn_q_norm": "self_attn.q_norm",
    "attn_k_norm": "self_attn.k_norm",
}
_TOP = {"token_embd": "model.embed_tokens", "output_norm": "model.norm", "output": "lm_head"}
_TOP_HF = {hf: gguf for gguf, hf in _TOP.items()}
_BLOCK = re.compile(r"^blk\.(\d+)\.(\w+)\.weight$")
_HF_LAYER = re.compile(r"^model\.layers\.(\d+)\.([\w.]+)\.weight$")


def hf_name(facts: ModelFacts, gguf_name: str) -> str:
    """The Hugging Face state-dict key of a GGUF tensor (:class:`BundleError` if unknown)."""
    if m := _BLOCK.match(gguf_name):
        table = _GEMMA3_LAYER if facts.architecture == "gemma3" else _LLAMA_LAYER
        part = table.get(m.group(2))
        if part is not None:
            return f"model.layers.{m.group(1)}.{part}.weight"
    elif gguf_name.endswith(".weight") and gguf_name[:-7] in _TOP:
        return f"{_TOP[gguf_name[:-7]]}.weight"
    raise BundleError(f"GGUF tensor {gguf_name!r} has no Hugging Face counterpart for "
                      f"architecture {facts.architecture}")


def gguf_name(facts: ModelFacts, hf_key: str) -> str:
    """The GGUF tensor name of a Hugging Face state-dict key (:class:`BundleError` if
    unknown): the inverse of :func:`hf_name`."""
    if m := _HF_LAYER.match(hf_key):
        table = _GEMMA3_LAYER if facts.architecture == "gemma3" else _LLAMA_LAYER
        part = next((g for g, h in table.items() if h == m.group(2)), None)
        if part is not None:
            return f"blk.{m.group(1)}.{part}.weight"
    elif hf_key.endswith(".weight") and (top := _TOP_HF.get(hf_key[:-7])) is not None:
        return f"{top}.weight"
    raise BundleError(f"Hugging Face tensor {hf_key!r} has no GGUF counterpart for "
                      f"architecture {facts.architecture}")


def _unpermute(w: Any, n_head: int) -> Any:
    """Inverse of llama.cpp's rotary permutation of q/k rows."""
    rows = w.shape[0]
    return (w.reshape(n_head, rows // n_head // 2, 2, *w.shape[1:])
            .swapaxes(1, 2).reshape(w.shape))


def permute_rotary(w: Any, n_head: int) -> Any:
    """llama.cpp's rotary permutation of q/k rows (as ``convert_hf_to_gguf.py`` applies it)."""
    rows = w.shape[0]
    return (w.reshape(n_head, 2, rows // n_head // 2, *w.shape[1:])
            .swapaxes(1, 2).reshape(w.shape))


def to_hf_tensor(facts: ModelFacts, gguf_name: str, array: Any) -> tuple[str, Any]:
    """(HF key, HF-layout float32 array) for one dequantized GGUF tensor."""
    key = hf_name(facts, gguf_name)
    if facts.architecture == "llama":
        if key.endswith("q_proj.weight"):
            array = _unpermute(array, facts.num_heads)
        elif key.endswith("k_proj.weight"):
            array = _unpermute(array, facts.num_kv_heads)
    elif facts.architecture == "gemma3" and "norm" in key:
        array = array - 1.0
    return key, array


def to_gguf_tensor(facts: ModelFacts, hf_key: str, array: Any) -> tuple[str, Any]:
    """(GGUF name, llama.cpp-layout float32 array) for one Hugging Face tensor: the inverse of
    :func:`to_hf_tensor`."""
    name = gguf_name(facts, hf_key)
    if facts.architecture == "llama":
        if hf_key.endswith("q_proj.weight"):
            array = permute_rotary(array, facts.num_heads)
        elif hf_key.endswith("k_proj.weight"):
            array = permute_rotary(array, facts.num_kv_heads)
    elif facts.architecture == "gemma3" and "norm" in hf_key:
        array = array + 1.0
    return name, array


def config_dict(facts: ModelFacts) -> dict[str, Any]:
    """``config.json`` with every field the readers (transformers, mlx-lm, litert-torch) use."""
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
    if facts.architecture == "llama":
        cfg.update(architectures=["LlamaForCausalLM"], model_type="llama", hidden_act="silu",
                   mlp_bias=False, pretraining_tp=1,
                   rope_parameters={"rope_type": "default", "rope_theta": facts.rope_theta})
    else:
        assert facts.rope_local_theta is not None
        cfg.update(
            architectures=["Gemma3ForCausalLM"], model_type="gemma3_text",
            hidden_activation="gelu_pytorch_tanh",
            query_pre_attn_scalar=facts.query_pre_attn_scalar,
            sliding_window=facts.sliding_window,
            sliding_window_pattern=facts.sliding_window_pattern,
            _sliding_window_pattern=facts.sliding_window_pattern, layer_types=facts.layer_types(),
            rope_local_base_freq=facts.rope_local_theta, final_logit_softcapping=None,
            attn_logit_softcapping=None, use_bidirectional_attention=False,
            rope_parameters={
                "full_attention": {"rope_type": "default", "rope_theta": facts.rope_theta},
                "sliding_attention": {"rope_type": "default",
                                      "rope_theta": facts.rope_local_theta}})
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
           "to_gguf_tensor", "to_hf_tensor", "write_json"]
