"""Write a llama-architecture GGUF with random weights, for benchmarks and stress tests.

    python tools/make_random_gguf.py OUT.gguf --preset 0.85b --type q4_0

Presets: ``0.85b`` (hidden 2048, 16 layers, 16 heads / 4 KV heads, FFN 5632, vocab 32000: the
benchmark model) and ``small`` (hidden 256, 4 layers, vocab 32000: fast tests that need a long
context or a big vocabulary). The vocabulary is SentencePiece-style: ``<unk> <s> </s>``, the
256 byte tokens, then synthetic pieces, so any text tokenizes. Weights are random normal with a
fixed seed; the output is gibberish but the compute is exactly that of a real model of the shape.
F16 is written with the ``gguf`` package, Q8_0 / Q4_0 by ``llama_model_quantize`` from the F16.

Needs ``gguf`` and ``numpy`` (the ``dev`` dependency group) and llama-cpp-python for quantized
types.
"""

from __future__ import annotations

import argparse
import sys
import tempfile
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from eliza_backends.convert.gguf_writer import (
    LAYER_TENSORS,
    GGUFHParams,
    GGUFVocab,
    write_gguf,
)

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
    """Write the F16 GGUF for ``shape`` with random weights (the project's GGUF writer)."""
    rng = np.random.default_rng(seed)
    head_dim = shape.hidden // shape.heads

    def w(*dims: int) -> np.ndarray:
        return (rng.standard_normal(dims, dtype=np.float32) * 0.02).astype(np.float16)

    def ones() -> np.ndarray:
        return np.ones(shape.hidden, dtype=np.float32)

    kv = shape.kv_heads * head_dim
    dims = {"attn_q": (shape.hidden, shape.hidden), "attn_k": (kv, shape.hidden),
            "attn_v": (kv, shape.hidden), "attn_output": (shape.hidden, shape.hidden),
            "ffn_gate": (shape.ffn, shape.hidden), "ffn_up": (shape.ffn, shape.hidden),
            "ffn_down": (shape.hidden, shape.ffn)}

    def tensors() -> Iterator[tuple[str, np.ndarray]]:
        yield "token_embd.weight", w(shape.vocab, shape.hidden)
        yield "output_norm.weight", ones()
        yield "output.weight", w(shape.vocab, shape.hidden)
        for i in range(shape.layers):
            for part in LAYER_TENSORS:
                yield f"blk.{i}.{part}.weight", ones() if part.endswith("norm") else \
                    w(*dims[part])

    tokens, scores, types = _vocab(shape.vocab)
    hp = GGUFHParams(name=f"random-llama-{shape.n_params / 1e9:.2f}b", context_length=4096,
                      hidden=shape.hidden, layers=shape.layers, ffn=shape.ffn,
                      heads=shape.heads, kv_heads=shape.kv_heads, head_dim=head_dim,
                      rms_eps=1e-5, vocab_size=shape.vocab)
    vocab = GGUFVocab(model="llama", pre="default", tokens=tokens, types=types, scores=scores,
                      bos=1, eos=2, unk=0, add_bos=True)
    write_gguf(path, hp, vocab, tensors())


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
