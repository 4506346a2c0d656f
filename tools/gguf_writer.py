"""The one GGUF writer of tools/: a llama-architecture GGUF from hyperparameters, a vocabulary and
tensors already named the GGUF way (``token_embd.weight``, ``blk.{i}.attn_q.weight`` ...).

``make_tiny_bundle.py`` (the trained tiny model: a GPT-2 BPE vocabulary with merges) and
``make_random_gguf.py`` (random weights: a SentencePiece-style vocabulary with scores) both
write through :func:`write_llama_gguf`. Needs the ``gguf`` package.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

#: The per-layer tensors of a llama block, in the order they are written.
LAYER_TENSORS = ("attn_norm", "attn_q", "attn_k", "attn_v", "attn_output", "ffn_norm",
                 "ffn_gate", "ffn_up", "ffn_down")


@dataclass(frozen=True)
class LlamaHParams:
    """The llama hyperparameters a GGUF header records."""

    name: str
    context_length: int
    hidden: int
    layers: int
    ffn: int
    heads: int
    kv_heads: int
    head_dim: int
    rms_eps: float
    vocab_size: int
    rope_theta: float | None = None  # None: llama.cpp's default


@dataclass(frozen=True)
class GGUFVocab:
    """A tokenizer as GGUF stores it: ``model`` "gpt2" (with ``merges``) or "llama" (SentencePiece,
    with ``scores``); token types are gguf.TokenType values."""

    model: str
    pre: str
    tokens: Sequence[str | bytes]
    types: Sequence[int]
    bos: int
    eos: int
    add_bos: bool
    scores: Sequence[float] | None = None
    merges: Sequence[str] | None = None
    eot: int | None = None
    unk: int | None = None
    add_eos: bool | None = None
    chat_template: str | None = None


def write_llama_gguf(path: Path, hp: LlamaHParams, vocab: GGUFVocab,
                     tensors: Iterable[tuple[str, Any]], file_type: int = 1) -> None:
    """Write ``path``: the header of ``hp`` and ``vocab``, then ``tensors`` (name, numpy array)
    in the order given. ``file_type`` 1 is MOSTLY_F16."""
    import gguf

    path.parent.mkdir(parents=True, exist_ok=True)
    w = gguf.GGUFWriter(str(path), "llama")
    w.add_name(hp.name)
    w.add_context_length(hp.context_length)
    w.add_embedding_length(hp.hidden)
    w.add_block_count(hp.layers)
    w.add_feed_forward_length(hp.ffn)
    w.add_head_count(hp.heads)
    w.add_head_count_kv(hp.kv_heads)
    w.add_key_length(hp.head_dim)
    w.add_value_length(hp.head_dim)
    w.add_rope_dimension_count(hp.head_dim)
    if hp.rope_theta is not None:
        w.add_rope_freq_base(hp.rope_theta)
    w.add_layer_norm_rms_eps(hp.rms_eps)
    w.add_vocab_size(hp.vocab_size)
    w.add_file_type(file_type)
    _add_vocab(w, vocab)
    for name, array in tensors:
        w.add_tensor(name, array)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()


def _add_vocab(w: Any, vocab: GGUFVocab) -> None:
    w.add_tokenizer_model(vocab.model)
    w.add_tokenizer_pre(vocab.pre)
    w.add_token_list(list(vocab.tokens))
    if vocab.scores is not None:
        w.add_token_scores(list(vocab.scores))
    w.add_token_types(list(vocab.types))
    if vocab.merges is not None:
        w.add_token_merges(list(vocab.merges))
    w.add_bos_token_id(vocab.bos)
    w.add_eos_token_id(vocab.eos)
    if vocab.eot is not None:
        w.add_eot_token_id(vocab.eot)
    if vocab.unk is not None:
        w.add_unk_token_id(vocab.unk)
    w.add_add_bos_token(vocab.add_bos)
    if vocab.add_eos is not None:
        w.add_add_eos_token(vocab.add_eos)
    if vocab.chat_template is not None:
        w.add_chat_template(vocab.chat_template)


__all__ = ["LAYER_TENSORS", "GGUFVocab", "LlamaHParams", "write_llama_gguf"]
