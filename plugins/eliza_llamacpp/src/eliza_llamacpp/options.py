"""The plugin's options model: what ``StreamConfig.options`` may say for it (no runtime import)."""

from __future__ import annotations

from typing import Literal

from eliza_backends.backend import Field, FrozenModel


class LlamaCppOptions(FrozenModel):
    """``StreamConfig.options["llama.cpp"]``."""

    artifact: str | None = Field(None, description="GGUF file name under text/ (default: first).")
    n_gpu_layers: int = Field(0, ge=-1, description="Layers to offload to a GPU build; -1 = all.")
    use_mmap: bool | None = Field(
        None, description="Map the weights (True) or read them (False); None lets llama.cpp "
        "decide for the device (its default).")
    n_ubatch: int | None = Field(None, ge=1, description="Physical batch size (default: batch).")
    flash_attention: Literal["off", "on", "auto"] = Field(
        "auto", description="llama.cpp's flash attention: auto (the default and llama.cpp's own: "
        "on where the device supports it, as on CPUs), on, or off. With it a batch's attention "
        "equals one token's bit for bit, so drafted (speculative) greedy output is the plain "
        "greedy output; without it llama.cpp's batched attention rounds differently (max 0.26 "
        "logit on SmolLM2 Q4_1 between a 2-token batch and a single token) and drafted output "
        "left plain greedy at a near-tie (benchmarks/bench_draft_policy.py). Speed: neither is "
        "reliably faster at short contexts on a 2-core x86 CPU "
        "(benchmarks/bench_flash_attention.py).")
    kv_cache_type: Literal["f16", "f32", "q8_0"] = Field(
        "f16", description="Element type of the KV cache: f16 (llama.cpp's default), f32 (twice "
        "the memory; what MLX and LiteRT keep, so an f32 GGUF's logprobs then agree with theirs "
        "to ~1e-4 instead of ~1e-2), or q8_0 (half of f16; needs flash_attention on or auto, "
        "as llama.cpp quantizes the V cache only with it).")
    image_max_tokens: int | None = Field(
        None, ge=1, description="The most embeddings an image may take (libmtmd's "
        "image_max_tokens: a larger image is scaled down to fit). Default: the model's own "
        "processor's max_soft_tokens where the bundle has one (a processor_config.json in a "
        "folder under text/: Gemma 4's, so images are sized as transformers sizes them), else "
        "llama.cpp's default for the projector.")
    kv_unified: bool = Field(
        False, description="A batched context (parallel > 1) keeps one KV cache for all its "
        "sequences (True) or one per sequence (False, the default, as llama-server's "
        "-np N). Per-sequence caches lay every sequence out as it is alone (which "
        "batch_invariant needs); a unified cache places a sequence's cells among the others', "
        "its attention sums round differently and replies drift at near-ties. A unified "
        "cache shares a copied prefix's cells; per-sequence ones copy the source's cache.")
    batch_invariant: bool | None = Field(
        None, description="A batched context (parallel > 1) gives each llama_decode one "
        "sequence's tokens (True), so with per-sequence KV caches every greedy reply equals "
        "the same request served alone, bit for bit, on any weights (the sequences take "
        "turns: no batching gain); or puts every sequence that wants tokens into one "
        "llama_decode (False: continuous batching). Default (None): True for weights whose "
        "matmul kernel changes between one row and two (llama.cpp's general.file_type f32, "
        "f16, bf16, Q8_0, Q4_0, Q5_0, IQ4_NL: llamafile's tinyBLAS from 2 rows, vec_dot for "
        "1), False for the others (Q4_1, Q5_1, K-quants, IQ-quants), whose decode rows "
        "measured bit-identical beside 1-7 other sequences (SmolLM2 Q4_1: 24 of 24 batched "
        "replies equal their solo ones; Gemma 3 Q4_K_M: 22 of 24 while steps were cut into "
        "passes of a few rows, 11-15 of 24 since a step of 8 is one pass, whose rows reach the "
        "tiled K-quant matmul, as llama-server's 11 of 24; docs/guides/openai-server.md "
        "measures both modes).")
    extra_buffers: bool | None = Field(
        None, description="llama.cpp's extra CPU buffer types (AMX / repacked weights). Default: "
        "on, except on CPUs with AMX, where llama-cpp-python 0.3.36's AMX matmul segfaults on "
        "Q4_0 weights.")


    def check(self) -> None:
        """A quantized KV cache needs flash attention."""
        if self.kv_cache_type == "q8_0" and self.flash_attention == "off":
            raise ValueError("kv_cache_type 'q8_0' needs flash_attention 'on' or 'auto' "
                             "(llama.cpp quantizes the V cache only with flash attention)")
