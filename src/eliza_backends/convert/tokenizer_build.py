"""Tokenizer files rebuilt from a GGUF vocabulary.

* :func:`hf_tokenizer_json` — a Hugging Face ``tokenizer.json``: byte-level BPE (GGUF tokenizer
  model ``gpt2``, merges as stored, the pre-tokenizer llama.cpp applies for the GGUF's ``pre``
  name) or SentencePiece-style BPE with byte fallback (GGUF model ``llama``: merges derived from
  the piece scores, as SentencePiece's BPE merges the adjacent pair whose piece scores highest);
* :func:`tokenizer_config` — ``tokenizer_config.json`` (class, special tokens, chat template);
* :func:`sentencepiece_model` — a SentencePiece ``ModelProto`` (serialized) for ``llama``
  vocabularies: the pieces, scores and types as stored, the one ``<unk>`` typed UNKNOWN.

Control tokens (GGUF type 3) become special added tokens; user-defined ones (type 4) added
tokens matched atomically, as llama.cpp and SentencePiece treat them.
"""

from __future__ import annotations

from typing import Any

from ..errors import BundleError
from .facts import TokenizerFacts

NORMAL, UNKNOWN, CONTROL, USER_DEFINED, UNUSED, BYTE = 1, 2, 3, 4, 5, 6

#: llama.cpp pre-tokenizer names (``tokenizer.ggml.pre``) -> the HF pre-tokenizer that splits
#: text the same way. ``smollm``: every digit alone, then GPT-2's regex.
_BYTE_LEVEL = {"type": "ByteLevel", "add_prefix_space": False, "trim_offsets": True,
               "use_regex": True}
_PRE_TOKENIZERS: dict[str, Any] = {
    "gpt-2": _BYTE_LEVEL,
    "default": _BYTE_LEVEL,
    "smollm": {"type": "Sequence", "pretokenizers": [
        {"type": "Digits", "individual_digits": True}, _BYTE_LEVEL]},
}


def _added_tokens(tok: TokenizerFacts) -> list[dict[str, Any]]:
    out = []
    for i, (text, kind) in enumerate(zip(tok.tokens, tok.token_types, strict=True)):
        if kind in (CONTROL, USER_DEFINED) or i == tok.unk_id:
            out.append({"id": i, "content": text, "single_word": False, "lstrip": False,
                        "rstrip": False, "normalized": False,
                        "special": kind == CONTROL or i == tok.unk_id})
    return out


def _post_processor(tok: TokenizerFacts) -> dict[str, Any] | None:
    bos = tok.text(tok.bos_id)
    if not tok.add_bos or bos is None:
        return None
    return {"type": "TemplateProcessing",
            "single": [{"SpecialToken": {"id": bos, "type_id": 0}},
                       {"Sequence": {"id": "A", "type_id": 0}}],
            "pair": [{"SpecialToken": {"id": bos, "type_id": 0}},
                     {"Sequence": {"id": "A", "type_id": 0}},
                     {"SpecialToken": {"id": bos, "type_id": 1}},
                     {"Sequence": {"id": "B", "type_id": 1}}],
            "special_tokens": {bos: {"id": bos, "ids": [tok.bos_id], "tokens": [bos]}}}


def spm_merges(tok: TokenizerFacts) -> list[list[str]]:
    """BPE merges equivalent to SentencePiece's score-ordered merging: every split of a normal
    piece into two pieces of the vocabulary, highest-scoring result first (ties: lower id)."""
    assert tok.scores is not None
    ids = {t: i for i, t in enumerate(tok.tokens) if tok.token_types[i] in (NORMAL, BYTE)}
    found: list[tuple[float, int, str, str]] = []
    for piece, pid in ids.items():
        if tok.token_types[pid] != NORMAL or len(piece) < 2:
            continue
        score = tok.scores[pid]
        for k in range(1, len(piece)):
            left, right = piece[:k], piece[k:]
            if left in ids and right in ids:
                found.append((-score, pid, left, right))
    found.sort()
    return [[left, right] for _s, _p, left, right in found]


def hf_tokenizer_json(tok: TokenizerFacts) -> dict[str, Any]:
    """The ``tokenizer.json`` document for ``tok``."""
    vocab = {t: i for i, t in enumerate(tok.tokens)}
    if len(vocab) != len(tok.tokens):
        raise BundleError("the GGUF vocabulary has duplicate tokens; it cannot be a "
                          "Hugging Face BPE vocabulary")
    base: dict[str, Any] = {"version": "1.0", "truncation": None, "padding": None,
                            "added_tokens": _added_tokens(tok)}
    if tok.model == "gpt2":
        pre = _PRE_TOKENIZERS.get(tok.pre or "default")
        if pre is None:
            raise BundleError(f"GGUF pre-tokenizer {tok.pre!r} has no Hugging Face equivalent "
                              f"here (known: {', '.join(sorted(_PRE_TOKENIZERS))})")
        merges = [m.split(" ", 1) for m in tok.merges or []]
        return {**base, "normalizer": None, "pre_tokenizer": pre,
                "post_processor": _post_processor(tok) or {
                    "type": "ByteLevel", "add_prefix_space": False, "trim_offsets": False,
                    "use_regex": False},
                "decoder": {"type": "ByteLevel", "add_prefix_space": True,
                            "trim_offsets": True, "use_regex": True},
                "model": {"type": "BPE", "dropout": None, "unk_token": None,
                          "continuing_subword_prefix": None, "end_of_word_suffix": None,
                          "fuse_unk": False, "byte_fallback": False, "ignore_merges": False,
                          "vocab": vocab, "merges": merges}}
    normalizers: list[dict[str, Any]] = []
    if tok.add_space_prefix:
        normalizers.append({"type": "Prepend", "prepend": "\u2581"})
    normalizers.append({"type": "Replace", "pattern": {"String": " "}, "content": "\u2581"})
    return {**base,
            "normalizer": {"type": "Sequence", "normalizers": normalizers},
            "pre_tokenizer": None,
            "post_processor": _post_processor(tok),
            "decoder": {"type": "Sequence", "decoders": [
                {"type": "Replace", "pattern": {"String": "\u2581"}, "content": " "},
                {"type": "ByteFallback"}, {"type": "Fuse"}]},
            "model": {"type": "BPE", "dropout": None, "unk_token": tok.text(tok.unk_id),
                      "continuing_subword_prefix": None, "end_of_word_suffix": None,
                      "fuse_unk": True, "byte_fallback": True, "ignore_merges": False,
                      "vocab": vocab, "merges": spm_merges(tok)}}


def tokenizer_config(tok: TokenizerFacts, model_max_length: int) -> dict[str, Any]:
    """``tokenizer_config.json``: the fast-tokenizer class, special tokens, chat template."""
    cfg: dict[str, Any] = {
        "tokenizer_class": "PreTrainedTokenizerFast",
        "add_bos_token": tok.add_bos, "add_eos_token": False,
        "clean_up_tokenization_spaces": False, "model_max_length": model_max_length,
        "bos_token": tok.text(tok.bos_id), "eos_token": tok.text(tok.eos_id),
        "unk_token": tok.text(tok.unk_id), "pad_token": tok.text(tok.pad_id),
    }
    if tok.chat_template:
        cfg["chat_template"] = tok.chat_template
    return {k: v for k, v in cfg.items() if v is not None}


def sentencepiece_model(tok: TokenizerFacts) -> bytes:
    """A serialized SentencePiece BPE ``ModelProto`` for a GGUF ``llama`` vocabulary."""
    if tok.model != "llama" or tok.scores is None:
        raise BundleError("only SentencePiece-style (GGUF 'llama') vocabularies have a "
                          "SentencePiece model")
    from sentencepiece import sentencepiece_model_pb2 as pb

    m = pb.ModelProto()
    for i, (text, kind) in enumerate(zip(tok.tokens, tok.token_types, strict=True)):
        p = m.pieces.add()
        # SentencePiece matches user-defined pieces in the normalized text, where spaces are
        # already U+2581; llama.cpp matches them in the raw text
        p.piece = text.replace(" ", "\u2581") if kind == USER_DEFINED else text
        p.score = tok.scores[i]
        p.type = UNKNOWN if i == tok.unk_id else (kind if kind in (1, 3, 4, 5, 6) else NORMAL)
    t = m.trainer_spec
    t.model_type = pb.TrainerSpec.BPE
    t.vocab_size = len(tok.tokens)
    t.byte_fallback = True
    t.unk_id = tok.unk_id if tok.unk_id is not None else -1
    t.bos_id = tok.bos_id if tok.bos_id is not None else -1
    t.eos_id = tok.eos_id if tok.eos_id is not None else -1
    t.pad_id = tok.pad_id if tok.pad_id is not None else -1
    for key, tid in (("unk_piece", tok.unk_id), ("bos_piece", tok.bos_id),
                     ("eos_piece", tok.eos_id), ("pad_piece", tok.pad_id)):
        if tid is not None:
            setattr(t, key, tok.tokens[tid])
    n = m.normalizer_spec
    n.name = "identity"
    n.add_dummy_prefix = tok.add_space_prefix
    n.remove_extra_whitespaces = False
    n.escape_whitespaces = True
    return bytes(m.SerializeToString())


__all__ = ["hf_tokenizer_json", "sentencepiece_model", "spm_merges", "tokenizer_config"]
