"""The Gemma 3 text family (``Gemma3ForCausalLM``, ``model_type`` ``gemma3_text``, GGUF
``gemma3``): written by the converter itself, from a GGUF or a Hugging Face folder.

What sets it apart from llama: sliding-window layers (one full-attention layer in every
``sliding_window_pattern``) with their own rope base, q/k norms and sandwich norms, tanh-GELU,
embeddings scaled by sqrt(hidden), every RMSNorm weight stored by llama.cpp as ``1 + w``, and
SentencePiece vocabularies without the dummy space prefix."""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Any, ClassVar

from ...errors import BundleError
from ..facts import ModelFacts, f32_value
from ..hf_folder import HFFolder
from .base import ModelFamily, Need
from .llama import LAYER_NAMES as LLAMA_LAYER_NAMES

#: GGUF layer part -> Hugging Face layer module
LAYER_NAMES = {
    **LLAMA_LAYER_NAMES,
    "post_attention_norm": "post_attention_layernorm", "ffn_norm": "pre_feedforward_layernorm",
    "post_ffw_norm": "post_feedforward_layernorm", "attn_q_norm": "self_attn.q_norm",
    "attn_k_norm": "self_attn.k_norm",
}


class Gemma3(ModelFamily):
    """``gemma3``: see the module docstring."""

    architecture = "gemma3"
    model_types = ("gemma3_text",)
    refused_model_types: ClassVar[Mapping[str, str]] = {
        "gemma3": "(a multimodal Gemma 3: convert its text model)"}
    reads_gguf = True
    code_modules: ClassVar[tuple[str, ...]] = ("families/gemma3",)
    layer_names = LAYER_NAMES
    gguf_rope_dimension_count = False
    sentencepiece_space_prefix = False
    default_rope_theta = 1e6

    def full_attention_rope(self, rope: dict[str, Any]) -> dict[str, Any]:
        full: dict[str, Any] = rope.get("full_attention", rope)
        return full

    def config_facts(self, source: HFFolder, need: Need, rope: dict[str, Any],
                     head_dim: int) -> dict[str, Any]:
        c = source.config
        for key in ("final_logit_softcapping", "attn_logit_softcapping"):
            if c.get(key) is not None:
                raise BundleError(f"{source.path}: {key} is not converted yet")
        local = c.get("rope_local_base_freq") or \
            (rope.get("sliding_attention") or {}).get("rope_theta") or 10000.0
        pattern = c.get("sliding_window_pattern") or c.get("_sliding_window_pattern") or 6
        return dict(rope_local_theta=f32_value(float(local)),
                    sliding_window=int(need("sliding_window")),
                    sliding_window_pattern=int(pattern),
                    query_pre_attn_scalar=int(c.get("query_pre_attn_scalar") or head_dim))

    def check_facts(self, source: HFFolder, facts: ModelFacts) -> None:
        types = source.config.get("layer_types")
        if types is not None and list(types) != facts.layer_types():
            raise BundleError(f"{source.path}: layer_types is not one full-attention layer in "
                              f"every {facts.sliding_window_pattern} (the only pattern mapped)")

    def gguf_facts(self, need: Need, head_dim: int) -> dict[str, Any]:
        # llama.cpp's gemma3: local layers use rope base 10000, every 6th layer is global,
        # queries scaled by 1/sqrt(head_dim) (the 27B model alone uses hidden/heads)
        return dict(rope_local_theta=10000.0,
                    sliding_window=int(need("attention.sliding_window")),
                    sliding_window_pattern=6, query_pre_attn_scalar=head_dim)

    def hf_layout(self, facts: ModelFacts, hf_key: str, array: Any) -> Any:
        return array - 1.0 if "norm" in hf_key else array

    def gguf_layout(self, facts: ModelFacts, hf_key: str, array: Any) -> Any:
        return array + 1.0 if "norm" in hf_key else array

    def hf_config_fields(self, facts: ModelFacts) -> dict[str, Any]:
        assert facts.rope_local_theta is not None
        return dict(
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

    def mlx_expected(self, facts: ModelFacts, hf_dir: Path) -> dict[str, Any]:
        out = super().mlx_expected(facts, hf_dir)
        for key in ("layer_types", "tie_word_embeddings", "attention_bias"):
            out.pop(key, None)
        return out

    def coreml_module(self, hf_model: Any, facts: ModelFacts, max_len: int,
                      cache_dtype: str) -> Any:
        from ..coreml_out import plain_module

        return plain_module(hf_model, facts, max_len, cache_dtype, gemma=True)


FAMILY = Gemma3()

__all__ = ["FAMILY", "LAYER_NAMES", "Gemma3"]
