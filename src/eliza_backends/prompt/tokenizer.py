"""Tokenizers for backends whose runtime has no tokenizer API (LiteRT's interpreter, the ids <->
text mapping of the LiteRT-LM engine session, MLX, Core ML): one interface, two file formats,
found and described one way for every backend.

* :class:`Tokenizer`: ids <-> text, the bytes of each token, special ids. Two implementations:
  :class:`~eliza_backends.prompt.hf_tokenizer.HFTokenizer` (a Hugging Face ``tokenizer.json``) and
  :class:`~eliza_backends.prompt.sp_tokenizer.SPTokenizer` (a SentencePiece ``tokenizer.model``, the
  format of Google's Gemma files and of ``.litertlm`` SP_Tokenizer sections);
* :func:`~eliza_backends.prompt.tokenizers.find_tokenizer` and
  :func:`~eliza_backends.prompt.tokenizers.load_tokenizer` (in :mod:`.tokenizers`, which knows
  the implementations; this base knows none): where a bundle's tokenizer file is, and the file
  as a :class:`Tokenizer`;
* :func:`tokenizer_facts`: BOS, end-of-generation ids, chat template and template tokens from
  the Hugging Face files beside the tokenizer (``config.json``, ``generation_config.json``,
  ``tokenizer_config.json``, ``chat_template.jinja``), else from well-known token names, so
  the same bundle stops at the same tokens on every backend.

The ``tokenizers`` / ``sentencepiece`` packages are imported when a tokenizer is loaded (the
backends that use this module depend on them; the core does not).
"""

from __future__ import annotations

import json
from abc import ABC, abstractmethod
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

#: End-of-generation token names, used when the tokenizer's folder names no end token.
END_TOKEN_NAMES = ("<|eos|>", "<|end|>", "</s>", "<eos>", "<|endoftext|>", "<end_of_turn>",
                   "<|eot_id|>", "<|end_of_text|>", "<|im_end|>")
#: Start-of-sequence token names, used when the tokenizer's folder names no BOS.
START_TOKEN_NAMES = ("<|bos|>", "<s>", "<bos>", "<|begin_of_text|>")


class Tokenizer(ABC):
    """ids <-> text for one vocabulary. Immutable after construction; safe to share between
    threads. ``vocab_size``: ids are ``0..vocab_size-1``. ``special_ids``: control tokens.
    ``control_texts``: the texts :meth:`encode` turns into control tokens when
    ``parse_special`` is on (and reads as plain text when it is off)."""

    vocab_size: int
    special_ids: frozenset[int]
    control_texts: frozenset[str]

    @abstractmethod
    def token_id(self, content: str) -> int | None:
        """Id of a token by its vocabulary text (e.g. ``"<|end|>"``), if present."""

    @abstractmethod
    def token_text(self, token_id: int) -> str | None:
        """The vocabulary text of ``token_id`` (e.g. ``"<|bos|>"``), None if out of range."""

    @abstractmethod
    def encode(self, text: str, *, add_special: bool = True,
               parse_special: bool = True) -> list[int]:
        """Token ids of ``text``; ``add_special`` adds the model's BOS where it has one;
        ``parse_special=False`` reads control-token texts as plain text."""

    @abstractmethod
    def piece(self, token_id: int) -> bytes:
        """The bytes ``token_id`` contributes to output text (control tokens: none)."""

    def decode(self, ids: list[int]) -> str:
        """Text of ``ids`` from the token bytes (invalid UTF-8 becomes U+FFFD)."""
        return b"".join(self.piece(t) for t in ids).decode("utf-8", "replace")

    def template_tokens(self, bos: int | None, eog: frozenset[int]) -> dict[str, str]:
        """``bos_token`` / ``eos_token`` texts for chat templates (eos: the lowest end id)."""
        out = {}
        for key, tok in (("bos_token", bos), ("eos_token", min(eog) if eog else None)):
            text = self.token_text(tok) if tok is not None else None
            if text is not None:
                out[key] = text
        return out


@dataclass(frozen=True)
class TokenizerFacts:
    """What :func:`tokenizer_facts` found. ``bos``: the start token, if the model has one;
    ``add_bos``: ``encode(..., add_special=True)`` prepends it. ``eog``: end-of-generation ids.
    ``chat_template`` / ``template_tokens``: for :func:`eliza_backends.render_chat`."""

    bos: int | None
    add_bos: bool
    eog: frozenset[int]
    chat_template: str | None = None
    template_tokens: dict[str, str] = field(default_factory=dict)


def _json_or_empty(path: Path) -> dict[str, Any]:
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError, UnicodeDecodeError):
        return {}
    return data if isinstance(data, dict) else {}


def _ids(value: Any) -> set[int]:
    if isinstance(value, bool):
        return set()
    if isinstance(value, int):
        return {value}
    if isinstance(value, list):
        return {v for v in value if isinstance(v, int) and not isinstance(v, bool)}
    return set()


def _token_content(value: Any) -> str | None:
    if isinstance(value, str):
        return value
    if isinstance(value, dict) and isinstance(value.get("content"), str):
        return str(value["content"])
    return None


def tokenizer_facts(tok: Tokenizer, folder: Path | None, vocab_size: int) -> TokenizerFacts:
    """BOS, end ids, chat template and template tokens for ``tok``, read from the Hugging Face
    files in ``folder`` (where its tokenizer file lives; None for an embedded one): end ids
    from ``config.json`` / ``generation_config.json`` ``eos_token_id`` and the
    ``tokenizer_config.json`` ``eos_token``; BOS from ``bos_token_id`` or ``bos_token``; the
    template from ``chat_template.jinja`` or ``tokenizer_config.json``. Where the folder names
    no end (or start) token, the well-known names (:data:`END_TOKEN_NAMES`,
    :data:`START_TOKEN_NAMES`) found in the vocabulary are used. Ids outside ``vocab_size``
    are dropped."""
    config = _json_or_empty(folder / "config.json") if folder else {}
    gen_config = _json_or_empty(folder / "generation_config.json") if folder else {}
    tok_config = _json_or_empty(folder / "tokenizer_config.json") if folder else {}
    eog = _ids(config.get("eos_token_id")) | _ids(gen_config.get("eos_token_id"))
    eos_text = _token_content(tok_config.get("eos_token"))
    if eos_text is not None and (eos_id := tok.token_id(eos_text)) is not None:
        eog.add(eos_id)
    if not eog:
        eog = {i for name in END_TOKEN_NAMES if (i := tok.token_id(name)) is not None}
    bos_ids = _ids(config.get("bos_token_id")) or _ids(gen_config.get("bos_token_id"))
    bos_text = _token_content(tok_config.get("bos_token"))
    bos = min(bos_ids) if bos_ids else (tok.token_id(bos_text) if bos_text else None)
    if bos is None:
        bos = next((i for name in START_TOKEN_NAMES if (i := tok.token_id(name)) is not None),
                   None)
    probe = tok.encode("a", add_special=True)
    add_bos = bos is not None and bool(probe) and probe[0] == bos and \
        tok.encode("a", add_special=False)[:1] != [bos]
    template: str | None = None
    template_file = folder / "chat_template.jinja" if folder else None
    if template_file is not None and template_file.is_file():
        template = template_file.read_text(encoding="utf-8")
    elif isinstance(tok_config.get("chat_template"), str):
        template = tok_config["chat_template"]
    template_tokens = {k: v for k, v in (("bos_token", bos_text), ("eos_token", eos_text)) if v}
    return TokenizerFacts(bos=bos, add_bos=add_bos,
                          eog=frozenset(t for t in eog if 0 <= t < vocab_size),
                          chat_template=template, template_tokens=template_tokens)


__all__ = ["END_TOKEN_NAMES", "START_TOKEN_NAMES", "Tokenizer", "TokenizerFacts", "tokenizer_facts"]
