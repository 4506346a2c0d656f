"""Write a llama-architecture GGUF with random weights, for benchmarks and stress tests.

    python tools/make_random_gguf.py OUT.gguf --preset 0.85b --type q4_0

Presets: ``0.85b`` (hidden 2048, 16 layers, 16 heads / 4 KV heads, FFN 5632, vocab 32000: the
benchmark model) and ``small`` (hidden 256, 4 layers, vocab 32000: fast tests that need a long
context or a big vocabulary). The vocabulary is SentencePiece-style: ``<unk> <s> </s>``, the
256 byte tokens, then synthetic pieces, so any text tokenizes. Weights are random normal with a
fixed seed; the output is gibberish but the compute is exactly that of a real model of the shape.
F16 is written with the ``gguf`` package, Q8_0 / Q4_0 by ``llama_model_quantize`` from the F16.

Needs ``gguf`` and ``numpy`` (the ``[dev]`` extra) and llama-cpp-python for quantized types.
"""

from __future__ import annotations

import argparse
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

import numpy as np

PRESETS = {
    "0.85b": dict(hidden=2048, layers=16, heads=16, kv_heads=4, ffn=5632, vocab=32000),
    "small": dict(hidden=256, layers=4, heads=4, kv_heads=2, ffn=688, vocab=32000),
}
QUANT_TYPES = {"f16": 1, "q8_0": 7, "q4_0": 2}  # llama_ftype values


@dataclass(frozen=True)
class Shape:
    """A llama model's dimensions."""

    hidden: int
    layers: int
    heads: int
    kv_heads: int
    ffn: int
    vocab: int

    @property
    def n_params(self) -> int:
        """Parameter count (embeddings and output counted separately)."""
        head_dim = self.hidden // self.heads
        attn = self.hidden * (self.hidden + 2 * self.kv_heads * head_dim + self.hidden)
        mlp = 3 * self.hidden * self.ffn
        return self.layers * (attn + mlp + 2 * self.hidden) + 2 * self.vocab * self.hidden


def _vocab(n: int) -> tuple[list[bytes], list[float], list[int]]:
    tokens: list[bytes] = [b"<unk>", b"<s>", b"</s>"]
    types = [2, 3, 3]  # UNKNOWN, CONTROL, CONTROL
    tokens += [f"<0x{b:02X}>".encode() for b in range(256)]
    types += [6] * 256  # BYTE
    letters = "abcdefghijklmnopqrstuvwxyz"
    i = 0
    while len(tokens) < n:
        a, b, c = letters[i % 26], letters[(i // 26) % 26], letters[(i // 676) % 26]
        piece = ("\u2581" if i % 2 == 0 else "") + (a + b + c)[: 1 + (i // 26 // 26 // 26) % 3 + 1]
        tokens.append(f"{piece}{i}".encode())
        types.append(1)  # NORMAL
        i += 1
    scores = [0.0] * 259 + [-float(k) for k in range(n - 259)]
    return tokens, scores, types


def write_f16(path: Path, shape: Shape, seed: int = 0) -> None:
    """Write the F16 GGUF for ``shape`` with random weights."""
    import gguf

    rng = np.random.default_rng(seed)
    head_dim = shape.hidden // shape.heads

    def w(*dims: int) -> np.ndarray:
        return (rng.standard_normal(dims, dtype=np.float32) * 0.02).astype(np.float16)

    writer = gguf.GGUFWriter(str(path), "llama")
    writer.add_name(f"random-llama-{shape.n_params / 1e9:.2f}b")
    writer.add_context_length(4096)
    writer.add_embedding_length(shape.hidden)
    writer.add_block_count(shape.layers)
    writer.add_feed_forward_length(shape.ffn)
    writer.add_head_count(shape.heads)
    writer.add_head_count_kv(shape.kv_heads)
    writer.add_rope_dimension_count(head_dim)
    writer.add_layer_norm_rms_eps(1e-5)
    writer.add_file_type(1)
    tokens, scores, types = _vocab(shape.vocab)
    writer.add_tokenizer_model("llama")
    writer.add_tokenizer_pre("default")
    writer.add_token_list(tokens)
    writer.add_token_scores(scores)
    writer.add_token_types(types)
    writer.add_bos_token_id(1)
    writer.add_eos_token_id(2)
    writer.add_unk_token_id(0)
    writer.add_add_bos_token(True)
    writer.add_tensor("token_embd.weight", w(shape.vocab, shape.hidden))
    writer.add_tensor("output_norm.weight", np.ones(shape.hidden, dtype=np.float32))
    writer.add_tensor("output.weight", w(shape.vocab, shape.hidden))
    kv = shape.kv_heads * head_dim
    for i in range(shape.layers):
        p = f"blk.{i}."
        writer.add_tensor(p + "attn_norm.weight", np.ones(shape.hidden, dtype=np.float32))
        writer.add_tensor(p + "attn_q.weight", w(shape.hidden, shape.hidden))
        writer.add_tensor(p + "attn_k.weight", w(kv, shape.hidden))
        writer.add_tensor(p + "attn_v.weight", w(kv, shape.hidden))
        writer.add_tensor(p + "attn_output.weight", w(shape.hidden, shape.hidden))
        writer.add_tensor(p + "ffn_norm.weight", np.ones(shape.hidden, dtype=np.float32))
        writer.add_tensor(p + "ffn_gate.weight", w(shape.ffn, shape.hidden))
        writer.add_tensor(p + "ffn_up.weight", w(shape.ffn, shape.hidden))
        writer.add_tensor(p + "ffn_down.weight", w(shape.hidden, shape.ffn))
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()


def quantize(src: Path, dst: Path, qtype: str, threads: int = 2) -> None:
    """Quantize a GGUF with llama.cpp's own quantizer."""
    import ctypes

    import llama_cpp as lc

    quiet = lc.llama_log_callback(lambda *a: None)  # referenced until quantization returns
    lc.llama_log_set(quiet, ctypes.c_void_p(0))
    params = lc.llama_model_quantize_default_params()
    params.ftype = QUANT_TYPES[qtype]
    params.nthread = threads
    rc = lc.llama_model_quantize(str(src).encode(), str(dst).encode(), params)
    if rc != 0:
        raise RuntimeError(f"llama_model_quantize failed ({rc})")


def make(out: Path, preset: str = "0.85b", qtype: str = "f16", seed: int = 0) -> Path:
    """Make ``out`` unless it exists already (a cache); returns it."""
    if out.exists():
        return out
    shape = Shape(**PRESETS[preset])
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = out.with_suffix(".partial")
    if qtype == "f16":
        write_f16(tmp, shape, seed)
    else:
        with tempfile.TemporaryDirectory(dir=out.parent) as d:
            f16 = Path(d) / "f16.gguf"
            write_f16(f16, shape, seed)
            quantize(f16, tmp, qtype)
    tmp.rename(out)
    return out


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("out", type=Path)
    ap.add_argument("--preset", choices=sorted(PRESETS), default="0.85b")
    ap.add_argument("--type", dest="qtype", choices=sorted(QUANT_TYPES), default="f16")
    ap.add_argument("--seed", type=int, default=0)
    args = ap.parse_args(argv)
    t0 = time.perf_counter()
    make(args.out, args.preset, args.qtype, args.seed)
    shape = Shape(**PRESETS[args.preset])
    print(f"{args.out}: {shape.n_params / 1e9:.3f} B params, {args.qtype}, "
          f"{args.out.stat().st_size / 1e6:.1f} MB, {time.perf_counter() - t0:.1f} s",
          file=sys.stderr)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
