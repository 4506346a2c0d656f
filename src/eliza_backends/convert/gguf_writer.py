"""The project's one GGUF writer (the ``gguf`` package's ``GGUFWriter`` behind two doors):

* :func:`write_gguf` — a model GGUF from hyperparameters (:class:`GGUFHParams`), a vocabulary
  (:class:`GGUFVocab`) and tensors already named and laid out the GGUF way
  (``token_embd.weight``, ``blk.{i}.attn_q.weight`` ...): ``bundle convert`` from a Hugging
  Face folder, ``tools/make_tiny_bundle.py`` and ``tools/make_random_gguf.py`` write this way;
* :func:`rewrite_gguf` — a GGUF whose metadata is copied from another file, key for key, with
  new tensors (``bundle convert`` re-writes a quantized source at float32 this way).

Architectures: ``llama`` and ``gemma3`` (``gemma3`` adds the sliding window). Needs the
``gguf`` package, imported when a file is written.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

#: The per-layer tensors of a llama block, in the order they are written.
LAYER_TENSORS = ("attn_norm", "attn_q", "attn_k", "attn_v", "attn_output", "ffn_norm",
                 "ffn_gate", "ffn_up", "ffn_down")
#: The per-layer tensors of a gemma3 block, in the order they are written.
GEMMA3_LAYER_TENSORS = ("attn_norm", "attn_q", "attn_k", "attn_v", "attn_q_norm",
                        "attn_k_norm", "attn_output", "post_attention_norm", "ffn_norm",
                        "ffn_gate", "ffn_up", "ffn_down", "post_ffw_norm")


@dataclass(frozen=True)
class GGUFHParams:
    """The hyperparameters a GGUF header records (``{architecture}.*`` keys)."""

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
    architecture: str = "llama"
    sliding_window: int | None = None  # gemma3
    rope_dimension_count: bool = True  # whether ``rope.dimension_count`` (= head_dim) is written


@dataclass(frozen=True)
class GGUFVocab:
    """A tokenizer as GGUF stores it: ``model`` "gpt2" (with ``merges``) or "llama" (SentencePiece,
    with ``scores``); token types are gguf.TokenType values. Optional keys are written only when
    set."""

    model: str
    pre: str
    tokens: Sequence[str | bytes]
    types: Sequence[int]
    bos: int | None
    eos: int | None
    add_bos: bool
    scores: Sequence[float] | None = None
    merges: Sequence[str] | None = None
    eot: int | None = None
    unk: int | None = None
    pad: int | None = None
    add_eos: bool | None = None
    add_space_prefix: bool | None = None
    chat_template: str | None = None


#: metadata copied by :func:`rewrite_gguf`: key -> (value, GGUFValueType, array element type)
CopiedMetadata = Mapping[str, tuple[Any, Any, Any]]


def write_gguf(path: Path, hp: GGUFHParams, vocab: GGUFVocab,
               tensors: Iterable[tuple[str, Any]], file_type: int = 1) -> None:
    """Write ``path``: the header of ``hp`` and ``vocab``, then ``tensors`` (name, numpy array)
    in the order given. ``file_type`` is a ``gguf.LlamaFileType`` (1: MOSTLY_F16)."""

    def header(w: Any) -> None:
        w.add_name(hp.name)
        w.add_context_length(hp.context_length)
        w.add_embedding_length(hp.hidden)
        w.add_block_count(hp.layers)
        w.add_feed_forward_length(hp.ffn)
        w.add_head_count(hp.heads)
        w.add_head_count_kv(hp.kv_heads)
        w.add_key_length(hp.head_dim)
        w.add_value_length(hp.head_dim)
        if hp.rope_dimension_count:
            w.add_rope_dimension_count(hp.head_dim)
        if hp.rope_theta is not None:
            w.add_rope_freq_base(hp.rope_theta)
        w.add_layer_norm_rms_eps(hp.rms_eps)
        if hp.sliding_window is not None:
            w.add_sliding_window(hp.sliding_window)
        w.add_vocab_size(hp.vocab_size)
        w.add_file_type(file_type)
        _add_vocab(w, vocab)

    _write(path, hp.architecture, header, tensors)


def rewrite_gguf(path: Path, architecture: str, metadata: CopiedMetadata,
                 tensors: Iterable[tuple[str, Any]], file_type: int) -> None:
    """Write ``path`` with every key of ``metadata`` (as read from another GGUF; its
    ``general.architecture`` / ``general.file_type`` / ``general.quantization_version`` are
    replaced: the new tensors are ``file_type``), then ``tensors``."""
    import gguf

    own = ("general.architecture", "general.file_type", "general.quantization_version")

    def header(w: Any) -> None:
        for key, (value, vtype, sub) in metadata.items():
            if key not in own:
                w.add_key_value(key, value, vtype, sub_type=sub)
        w.add_file_type(file_type)
        w.add_quantization_version(gguf.GGML_QUANT_VERSION)

    _write(path, architecture, header, tensors)


def _write(path: Path, architecture: str, header: Callable[[Any], None],
           tensors: Iterable[tuple[str, Any]]) -> None:
    import gguf

    path.parent.mkdir(parents=True, exist_ok=True)
    w = gguf.GGUFWriter(str(path), architecture)
    header(w)
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
    for add, tid in ((w.add_bos_token_id, vocab.bos), (w.add_eos_token_id, vocab.eos),
                     (w.add_eot_token_id, vocab.eot), (w.add_unk_token_id, vocab.unk),
                     (w.add_pad_token_id, vocab.pad)):
        if tid is not None:
            add(tid)
    w.add_add_bos_token(vocab.add_bos)
    if vocab.add_eos is not None:
        w.add_add_eos_token(vocab.add_eos)
    if vocab.add_space_prefix is not None:
        w.add_add_space_prefix(vocab.add_space_prefix)
    if vocab.chat_template is not None:
        w.add_chat_template(vocab.chat_template)


__all__ = ["GEMMA3_LAYER_TENSORS", "LAYER_TENSORS", "CopiedMetadata", "GGUFHParams",
           "GGUFVocab", "rewrite_gguf", "write_gguf"]
