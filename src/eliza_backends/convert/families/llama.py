"""The llama family (``LlamaForCausalLM``, GGUF ``llama``): the plain decoder the converter
writes itself, from a GGUF or a Hugging Face folder.

Its one layout difference: llama.cpp stores the q/k projection rows permuted to its rotary
layout (:func:`..hf_checkpoint.permute_rotary`)."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any, ClassVar

from ..facts import ModelFacts
from ..hf_checkpoint import permute_rotary, unpermute_rotary
from .base import ModelFamily

#: GGUF layer part -> Hugging Face layer module
LAYER_NAMES = {
    "attn_norm": "input_layernorm", "ffn_norm": "post_attention_layernorm",
    "attn_q": "self_attn.q_proj", "attn_k": "self_attn.k_proj", "attn_v": "self_attn.v_proj",
    "attn_output": "self_attn.o_proj", "ffn_gate": "mlp.gate_proj", "ffn_up": "mlp.up_proj",
    "ffn_down": "mlp.down_proj",
}


def _rotary_rows(facts: ModelFacts, hf_key: str, array: Any,
                 permute: Callable[[Any, int], Any]) -> Any:
    """``array`` with ``permute`` applied to its rows when it is a q or k projection."""
    if hf_key.endswith("q_proj.weight"):
        return permute(array, facts.num_heads)
    if hf_key.endswith("k_proj.weight"):
        return permute(array, facts.num_kv_heads)
    return array


class Llama(ModelFamily):
    """``llama``: see the module docstring."""

    architecture = "llama"
    model_types = ("llama",)
    reads_gguf = True
    code_modules: ClassVar[tuple[str, ...]] = ("families/llama",)
    layer_names = LAYER_NAMES

    def hf_layout(self, facts: ModelFacts, hf_key: str, array: Any) -> Any:
        return _rotary_rows(facts, hf_key, array, unpermute_rotary)

    def gguf_layout(self, facts: ModelFacts, hf_key: str, array: Any) -> Any:
        return _rotary_rows(facts, hf_key, array, permute_rotary)

    def hf_config_fields(self, facts: ModelFacts) -> dict[str, Any]:
        return dict(architectures=["LlamaForCausalLM"], model_type="llama", hidden_act="silu",
                    mlp_bias=False, pretraining_tp=1,
                    rope_parameters={"rope_type": "default", "rope_theta": facts.rope_theta})

    def mlx_expected(self, facts: ModelFacts, hf_dir: Path) -> dict[str, Any]:
        out = super().mlx_expected(facts, hf_dir)
        out["layer_types"] = ["full_attention"] * facts.num_layers
        out["sliding_window"] = None
        out["rope_traditional"] = False
        return out


FAMILY = Llama()

__all__ = ["FAMILY", "LAYER_NAMES", "Llama"]
