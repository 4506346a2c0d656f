"""GGUF artifacts at other precisions, made by llama.cpp's own quantizer
(``llama_model_quantize``) from the float32 GGUF, so they share its weights and metadata."""

from __future__ import annotations

from pathlib import Path

from ..errors import BundleError

#: precision -> llama_ftype constant name in llama_cpp
FTYPES = {"f16": "LLAMA_FTYPE_MOSTLY_F16", "bf16": "LLAMA_FTYPE_MOSTLY_BF16",
          "q8_0": "LLAMA_FTYPE_MOSTLY_Q8_0", "q4_0": "LLAMA_FTYPE_MOSTLY_Q4_0",
          "q4_k": "LLAMA_FTYPE_MOSTLY_Q4_K_M"}


def quantize(f32_gguf: Path, out: Path, precision: str, threads: int | None = None) -> None:
    """Write ``out`` at ``precision`` from ``f32_gguf`` with llama.cpp's quantizer."""
    import llama_cpp as lc

    params = lc.llama_model_quantize_default_params()
    params.ftype = getattr(lc, FTYPES[precision])
    params.nthread = threads or 0
    status = lc.llama_model_quantize(str(f32_gguf).encode(), str(out).encode(),
                                     params)
    if status != 0 or not out.is_file():
        raise BundleError(f"llama.cpp could not quantize {f32_gguf} to {precision} "
                          f"(status {status})")


__all__ = ["FTYPES", "quantize"]
