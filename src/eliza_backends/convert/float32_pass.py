"""The first conversion stage: one pass over the source's tensors, each made float32 once and
written twice, into a float32 GGUF (the llama.cpp artifact every other precision is quantized
from) and in Hugging Face layout into ``model.safetensors`` (the checkpoint every other format
is made from). So every format starts from the very same float32 weights.

* :func:`write_hf_and_f32_gguf` — from a GGUF: dequantized; the GGUF keeps the source's
  metadata key for key; the tokenizer files are rebuilt from the GGUF vocabulary;
* :func:`write_f32_from_hf` — from a Hugging Face folder: float16/bfloat16 widened; the GGUF
  header is written from the facts (:mod:`.gguf_writer`); the folder's own tokenizer files are
  kept (``tokenizer.json`` rebuilt only where a SentencePiece folder has none).
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

from .facts import ModelFacts
from .families import for_architecture
from .gguf_source import GGUFSource
from .gguf_writer import GGUFHParams, GGUFVocab, rewrite_gguf, write_gguf
from .hf_checkpoint import generation_config_dict, write_json
from .hf_folder import HFFolder
from .tokenizer_build import hf_tokenizer_json, sentencepiece_model, tokenizer_config

#: tokenizer files of a source folder kept as they are
KEPT_TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json", "tokenizer.model",
                        "chat_template.jinja", "special_tokens_map.json")


def write_hf_and_f32_gguf(source: GGUFSource, facts: ModelFacts, hf_dir: Path,
                          gguf_path: Path) -> None:
    """Write ``hf_dir`` (config, generation config, safetensors, tokenizer files) and the
    float32 GGUF at ``gguf_path`` (the source's metadata, key for key) from ``source``."""
    import gguf
    from safetensors.numpy import save_file

    hf_dir.mkdir(parents=True, exist_ok=True)
    state: dict[str, Any] = {}
    family = for_architecture(facts.architecture)

    def tensors() -> Iterator[tuple[str, Any]]:
        for name, array in source.tensors():
            key, hf_array = family.to_hf_tensor(facts, name, array)
            state[key] = hf_array
            yield name, array

    rewrite_gguf(gguf_path, facts.architecture, source.metadata(), tensors(),
                 gguf.LlamaFileType.ALL_F32)
    save_file(state, str(hf_dir / "model.safetensors"), metadata={"format": "pt"})
    write_hf_metadata(facts, hf_dir)


def write_f32_from_hf(source: HFFolder, facts: ModelFacts, hf_dir: Path,
                      gguf_path: Path) -> None:
    """Write the float32 ``model.safetensors`` and tokenizer files of ``hf_dir`` and the
    float32 GGUF at ``gguf_path`` from ``source`` (``config.json`` / ``generation_config.json``
    come after, from the facts llama.cpp confirms: :func:`write_hf_config`)."""
    import shutil

    import gguf
    from safetensors.numpy import save_file

    hf_dir.mkdir(parents=True, exist_ok=True)
    state: dict[str, Any] = {}
    family = for_architecture(facts.architecture)

    def tensors() -> Iterator[tuple[str, Any]]:
        for key, array in source.tensors():
            state[key] = array
            yield family.to_gguf_tensor(facts, key, array)

    write_gguf(gguf_path, gguf_hparams(facts), gguf_vocab(facts), tensors(),
               gguf.LlamaFileType.ALL_F32)
    save_file(state, str(hf_dir / "model.safetensors"), metadata={"format": "pt"})
    for name in KEPT_TOKENIZER_FILES:
        if (source.path / name).is_file():
            shutil.copy2(source.path / name, hf_dir / name)
    if not (hf_dir / "tokenizer.json").is_file():
        write_json(hf_dir / "tokenizer.json", hf_tokenizer_json(facts.tokenizer))


def gguf_hparams(facts: ModelFacts) -> GGUFHParams:
    """The GGUF header numbers of ``facts``."""
    return GGUFHParams(
        name=facts.name, context_length=facts.max_position_embeddings,
        hidden=facts.hidden_size, layers=facts.num_layers, ffn=facts.intermediate_size,
        heads=facts.num_heads, kv_heads=facts.num_kv_heads, head_dim=facts.head_dim,
        rms_eps=facts.rms_norm_eps, vocab_size=facts.vocab_size, rope_theta=facts.rope_theta,
        architecture=facts.architecture, sliding_window=facts.sliding_window,
        rope_dimension_count=for_architecture(facts.architecture).gguf_rope_dimension_count)


def gguf_vocab(facts: ModelFacts) -> GGUFVocab:
    """The GGUF vocabulary of ``facts`` (end-of-turn ids are left to llama.cpp, which knows
    them by their text)."""
    tok = facts.tokenizer
    return GGUFVocab(
        model=tok.model, pre=tok.pre or "default", tokens=tok.tokens, types=tok.token_types,
        bos=tok.bos_id, eos=tok.eos_id, add_bos=tok.add_bos, scores=tok.scores,
        merges=tok.merges, unk=tok.unk_id, pad=tok.pad_id, add_eos=False,
        add_space_prefix=tok.add_space_prefix, chat_template=tok.chat_template)


def write_hf_config(facts: ModelFacts, hf_dir: Path) -> None:
    """``config.json`` (every field explicit) and ``generation_config.json`` of ``facts``."""
    write_json(hf_dir / "config.json", for_architecture(facts.architecture).hf_config(facts))
    write_json(hf_dir / "generation_config.json", generation_config_dict(facts))


def write_hf_metadata(facts: ModelFacts, hf_dir: Path) -> None:
    """The non-weight files of the HF folder: config, generation config, tokenizer files,
    chat template, and ``tokenizer.model`` for SentencePiece vocabularies."""
    tok = facts.tokenizer
    write_hf_config(facts, hf_dir)
    write_json(hf_dir / "tokenizer.json", hf_tokenizer_json(tok))
    write_json(hf_dir / "tokenizer_config.json",
               tokenizer_config(tok, facts.max_position_embeddings))
    if tok.chat_template:
        (hf_dir / "chat_template.jinja").write_text(tok.chat_template, encoding="utf-8")
    if tok.model == "llama":
        (hf_dir / "tokenizer.model").write_bytes(sentencepiece_model(tok))


__all__ = ["KEPT_TOKENIZER_FILES", "gguf_hparams", "gguf_vocab", "write_f32_from_hf",
           "write_hf_and_f32_gguf", "write_hf_config", "write_hf_metadata"]
