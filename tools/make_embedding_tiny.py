#!/usr/bin/env python
"""Make the tiny embedding bundle (examples/bundles/embedding-tiny): a seeded, untrained
EmbeddingGemma-architecture model (``Gemma3TextModel`` with bidirectional attention, mean
pooling, the two Dense layers and the normalisation of sentence-transformers), converted by
llama.cpp's own ``convert_hf_to_gguf.py`` (``--sentence-transformers-dense-modules``).

Usage:
    PY=.venv-convert/bin/python   # torch, transformers, sentencepiece, llama.cpp's converter
    $PY tools/make_embedding_tiny.py OUT

What it writes (deterministic: fixed seeds, one torch thread, one SentencePiece thread; two
runs give byte-identical files):
    OUT/text/embedding-tiny-f32.gguf   the GGUF (arch gemma-embedding, mean pooling, dense_2/3)
    OUT/source/                        the float32 sentence-transformers folder it came from
    OUT/embedding.json                 the Matryoshka dimensions the model may be truncated to
    OUT/reference.json                 float32 torch vectors of the reference inputs, on the
                                       token ids llama.cpp's tokenizer gives them (see
                                       tests/test_embedding_tiny.py; llama-server's vectors are
                                       added by tools/embedding_server_reference.py)
    OUT/manifest.json
"""

from __future__ import annotations

import argparse
import json
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
CORPUS = ROOT / "tools" / "tiny_corpus"
SEED = 20261203
VOCAB_SIZE = 512
HIDDEN, DENSE = 64, 128
#: The dimensions a vector may be truncated to (then re-normalised), as EmbeddingGemma's
#: Matryoshka training allows 512/256/128 of its 768.
MATRYOSHKA = (32, 16)
#: The texts whose vectors the bundle ships (reference.json); tests compare every runtime's.
REFERENCE_TEXTS = (
    "Four score and seven years ago",
    "We hold these truths to be self-evident,",
    "In summer the garden is",
    "Ships that passed in the dark",
    "a",
    "The baker rose before the sun and lit the ovens; the bread was ready by six.",
)


def log(msg: str) -> None:
    print(f"[make_embedding_tiny] {msg}", file=sys.stderr, flush=True)


def train_tokenizer(out: Path) -> None:
    """A SentencePiece BPE of ``VOCAB_SIZE`` pieces over the tiny corpus, Gemma's special ids
    (pad 0, eos 1, bos 2, unk 3), byte fallback: ``out/tokenizer.model``."""
    import sentencepiece as spm

    lines = [line.strip() for p in sorted(CORPUS.glob("*.txt")) if p.name != "SOURCES.md"
             for line in p.read_text(encoding="utf-8").splitlines() if line.strip()]
    model = __import__("io").BytesIO()
    spm.SentencePieceTrainer.train(
        sentence_iterator=iter(lines), model_writer=model, model_type="bpe",
        vocab_size=VOCAB_SIZE, byte_fallback=True, character_coverage=1.0, num_threads=1,
        pad_id=0, eos_id=1, bos_id=2, unk_id=3, pad_piece="<pad>", eos_piece="<eos>",
        bos_piece="<bos>", unk_piece="<unk>", add_dummy_prefix=False,
        normalization_rule_name="identity", remove_extra_whitespaces=False,
        split_by_whitespace=True, shuffle_input_sentence=False, minloglevel=2)
    (out / "tokenizer.model").write_bytes(model.getvalue())
    (out / "tokenizer_config.json").write_text(json.dumps({
        "tokenizer_class": "GemmaTokenizer", "add_bos_token": True, "add_eos_token": True,
        "bos_token": "<bos>", "eos_token": "<eos>", "pad_token": "<pad>", "unk_token": "<unk>",
        "model_max_length": 512}, indent=2) + "\n")


def model_config() -> Any:
    from transformers import Gemma3TextConfig

    return Gemma3TextConfig(
        vocab_size=VOCAB_SIZE, hidden_size=HIDDEN, intermediate_size=128, num_hidden_layers=6,
        num_attention_heads=2, num_key_value_heads=1, head_dim=32, query_pre_attn_scalar=32,
        max_position_embeddings=512, sliding_window=512,
        # llama.cpp's gemma-embedding graph has EmbeddingGemma's pattern built in (five
        # sliding-window layers, then a global one): six layers, so both masks are used
        layer_types=["sliding_attention"] * 5 + ["full_attention"],
        use_bidirectional_attention=True,
        rms_norm_eps=1e-6, initializer_range=0.2, architectures=["Gemma3TextModel"],
        pad_token_id=0, eos_token_id=1, bos_token_id=2)


def save_sentence_transformer(out: Path) -> None:
    """The sentence-transformers folder: the transformer (config.json, model.safetensors),
    1_Pooling (mean), 2_Dense (HIDDEN -> DENSE), 3_Dense (DENSE -> HIDDEN), 4_Normalize."""
    import torch
    from safetensors.torch import save_file
    from transformers import Gemma3TextModel

    torch.manual_seed(SEED)
    model = Gemma3TextModel(model_config()).eval()
    with torch.no_grad():  # norms away from 1 (Gemma's weight is a delta), so they matter
        for name, p in model.named_parameters():
            if name.endswith("norm.weight"):
                p.copy_(torch.randn_like(p) * 0.1)
    state = {k: v.contiguous() for k, v in model.state_dict().items()}
    save_file(state, str(out / "model.safetensors"), metadata={"format": "pt"})
    config = model.config.to_dict()
    config.pop("transformers_version", None)
    (out / "config.json").write_text(json.dumps(config, indent=2, sort_keys=True) + "\n")
    modules = [("", "Transformer"), ("1_Pooling", "Pooling"), ("2_Dense", "Dense"),
               ("3_Dense", "Dense"), ("4_Normalize", "Normalize")]
    (out / "modules.json").write_text(json.dumps(
        [{"idx": i, "name": str(i), "path": p, "type": f"sentence_transformers.models.{t}"}
         for i, (p, t) in enumerate(modules)], indent=2) + "\n")
    pooling = out / "1_Pooling"
    pooling.mkdir()
    (pooling / "config.json").write_text(json.dumps({
        "word_embedding_dimension": HIDDEN, "pooling_mode_cls_token": False,
        "pooling_mode_mean_tokens": True, "pooling_mode_max_tokens": False,
        "pooling_mode_lasttoken": False, "include_prompt": True}, indent=2) + "\n")
    for path, (n_in, n_out) in (("2_Dense", (HIDDEN, DENSE)), ("3_Dense", (DENSE, HIDDEN))):
        folder = out / path
        folder.mkdir()
        weight = (torch.randn(n_out, n_in) / n_in ** 0.5).contiguous()
        save_file({"linear.weight": weight}, str(folder / "model.safetensors"),
                  metadata={"format": "pt"})
        (folder / "config.json").write_text(json.dumps({
            "in_features": n_in, "out_features": n_out, "bias": False,
            "activation_function": "torch.nn.modules.linear.Identity"}, indent=2) + "\n")
    (out / "4_Normalize").mkdir()


def torch_embed(source: Path, batch: list[list[int]]) -> list[list[float]]:
    """The sentence-transformers forward in float32 torch, one input at a time (no padding):
    the transformer, the mean over every position, 2_Dense, 3_Dense, L2 normalisation."""
    import torch
    from safetensors.torch import load_file
    from transformers import Gemma3TextModel

    model = Gemma3TextModel.from_pretrained(str(source), dtype=torch.float32).eval()
    dense = [load_file(str(source / d / "model.safetensors"))["linear.weight"]
             for d in ("2_Dense", "3_Dense")]
    out = []
    with torch.no_grad():
        for ids in batch:
            hidden = model(input_ids=torch.tensor([ids])).last_hidden_state[0]
            vec = hidden.mean(dim=0)
            for w in dense:
                vec = w @ vec
            out.append(torch.nn.functional.normalize(vec, dim=0).tolist())
    return out


def convert(source: Path, gguf: Path) -> None:
    """llama.cpp's converter (the vendored one bundle convert uses), float32, with the Dense
    modules."""
    from eliza_backends.convert.toolchain import llama_cpp_converter

    script = llama_cpp_converter()
    if script is None:
        raise SystemExit("no llama.cpp convert_hf_to_gguf.py: run scripts/install-convert.sh")
    subprocess.run([sys.executable, str(script), str(source), "--outfile", str(gguf),
                    "--outtype", "f32", "--sentence-transformers-dense-modules"], check=True,
                   stdout=subprocess.DEVNULL)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("out", type=Path)
    args = ap.parse_args(argv)
    import torch

    torch.set_num_threads(1)
    torch.use_deterministic_algorithms(True)
    out: Path = args.out
    for stale in (out / "text", out / "source"):
        if stale.exists():
            shutil.rmtree(stale)
    source = out / "source"
    source.mkdir(parents=True)
    (out / "text").mkdir()
    log("tokenizer (SentencePiece BPE over tools/tiny_corpus)")
    train_tokenizer(source)
    log("model (seeded Gemma3TextModel + Dense layers)")
    save_sentence_transformer(source)
    gguf = out / "text" / "embedding-tiny-f32.gguf"
    log("GGUF by llama.cpp's convert_hf_to_gguf.py")
    convert(source, gguf)
    (out / "embedding.json").write_text(json.dumps(
        {"matryoshka_dimensions": list(MATRYOSHKA)}, indent=2) + "\n")
    from sentencepiece import SentencePieceProcessor

    sp = SentencePieceProcessor(model_file=str(source / "tokenizer.model"))
    ids = [[2, *sp.encode(t), 1] for t in REFERENCE_TEXTS]
    log("reference vectors (float32 torch)")
    ref = {"texts": list(REFERENCE_TEXTS), "token_ids": ids,
           "torch": [[round(x, 7) for x in v] for v in torch_embed(source, ids)]}
    (out / "reference.json").write_text(json.dumps(ref, indent=1) + "\n")
    from eliza_backends.manifest import write_manifest

    write_manifest(out)
    log(f"done: {out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
