"""Hugging Face ``tokenizer.json`` support for backends whose runtime has no tokenizer API
(LiteRT's interpreter, the MLX and Core ML sessions): ids <-> text, the bytes of each token, and
the facts a session needs about it, found the same way for every backend.

* :func:`find_hf_tokenizer`: where a bundle's ``tokenizer.json`` for an artifact is, in one
  search order, so the same bundle is tokenized the same way whichever backend serves it;
* :func:`tokenizer_facts`: BOS, end-of-generation ids, chat template and template tokens from
  the Hugging Face files beside the tokenizer (``config.json``, ``generation_config.json``,
  ``tokenizer_config.json``, ``chat_template.jinja``), else from well-known token names, so
  the same bundle stops at the same tokens on every backend.

Needs the ``tokenizers`` package, imported when a tokenizer is loaded (the backends that use
this module depend on it; the core does not).
"""

from __future__ import annotations

import contextlib
import json
import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from .bundle import DRAFT_DIR
from .errors import BundleError
from .text import byte_level_pieces

#: End-of-generation token names, used when the tokenizer's folder names no end token.
END_TOKEN_NAMES = ("<|eos|>", "<|end|>", "</s>", "<eos>", "<|endoftext|>", "<end_of_turn>",
                   "<|eot_id|>", "<|end_of_text|>", "<|im_end|>")
#: Start-of-sequence token names, used when the tokenizer's folder names no BOS.
START_TOKEN_NAMES = ("<|bos|>", "<s>", "<bos>", "<|begin_of_text|>")


class HFTokenizer:
    """One ``tokenizer.json``: :meth:`encode`, :meth:`piece` (bytes per id), special ids."""

    def __init__(self, spec: str) -> None:
        from tokenizers import Tokenizer

        try:
            data: dict[str, Any] = json.loads(spec)
            self._tok = Tokenizer.from_str(spec)
            # the same tokenizer with special tokens read as plain text (parse_special=False)
            self._plain = Tokenizer.from_str(spec)
            self._plain.encode_special_tokens = True
        except Exception as exc:
            raise BundleError(f"tokenizer.json is not a valid Hugging Face tokenizer: {exc}") \
                from None
        self._pieces = byte_level_pieces(data)
        self.vocab_size: int = max(self._tok.get_vocab_size(with_added_tokens=True),
                                   len(self._pieces))
        added = data.get("added_tokens", [])
        self.special_ids: frozenset[int] = frozenset(t["id"] for t in added if t.get("special"))
        #: Texts of the special tokens: what ``encode(..., parse_special=False)`` reads as text.
        self.control_texts: frozenset[str] = frozenset(
            str(t["content"]) for t in added if t.get("special"))
        self._by_content = {t["content"]: t["id"] for t in added}

    @classmethod
    def from_file(cls, path: str | os.PathLike[str]) -> HFTokenizer:
        """Load ``tokenizer.json`` from disk (:class:`BundleError` if unreadable)."""
        try:
            return cls(Path(path).read_text(encoding="utf-8"))
        except OSError as exc:
            raise BundleError(f"cannot read tokenizer {path}: {exc.strerror}") from None
        except UnicodeDecodeError:
            raise BundleError(f"tokenizer {path} is not UTF-8 text") from None

    def token_id(self, content: str) -> int | None:
        """Id of an added/special token by its text (e.g. ``"<|end|>"``), if present."""
        found = self._by_content.get(content)
        return found if found is not None else self._tok.token_to_id(content)

    def token_text(self, token_id: int) -> str | None:
        """The vocabulary text of ``token_id`` (e.g. ``"<|bos|>"``), None if out of range."""
        text: str | None = self._tok.id_to_token(token_id)
        return text

    def template_tokens(self, bos: int | None, eog: frozenset[int]) -> dict[str, str]:
        """``bos_token`` / ``eos_token`` texts for chat templates (eos: the lowest end id)."""
        out = {}
        for key, tok in (("bos_token", bos), ("eos_token", min(eog) if eog else None)):
            text = self.token_text(tok) if tok is not None else None
            if text is not None:
                out[key] = text
        return out

    def encode(self, text: str, *, add_special: bool = True,
               parse_special: bool = True) -> list[int]:
        """Token ids of ``text``; ``add_special`` applies the post-processor (e.g. BOS);
        ``parse_special=False`` reads special-token texts as plain text."""
        tok = self._tok if parse_special else self._plain
        return list(tok.encode(text, add_special_tokens=add_special).ids)

    def piece(self, token_id: int) -> bytes:
        """The bytes ``token_id`` contributes to output text (special tokens: none)."""
        return self._pieces[token_id] if 0 <= token_id < len(self._pieces) else b""

    def decode(self, ids: list[int]) -> str:
        """Text of ``ids`` from the token bytes (invalid UTF-8 becomes U+FFFD)."""
        return b"".join(self.piece(t) for t in ids).decode("utf-8", "replace")


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


def find_hf_tokenizer(artifact: Path) -> Path | None:
    """The ``tokenizer.json`` of an artifact under ``text/`` (or ``text/draft/``), searched in
    one order for every backend: inside the artifact (a folder), ``<stem>.tokenizer.json`` and
    ``tokenizer.json`` beside it, then the first folder beside it that holds one (a bundle
    ships one tokenizer for its formats; a ``draft/`` folder is never used). None if absent."""
    here = artifact.parent
    candidates = [artifact / "tokenizer.json", here / f"{artifact.stem}.tokenizer.json",
                  here / "tokenizer.json"]
    with contextlib.suppress(OSError):
        candidates += sorted(p / "tokenizer.json" for p in here.iterdir()
                             if p.is_dir() and p.name != DRAFT_DIR and p != artifact)
    return next((c for c in candidates if c.is_file()), None)


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


def tokenizer_facts(tok: HFTokenizer, folder: Path | None, vocab_size: int) -> TokenizerFacts:
    """BOS, end ids, chat template and template tokens for ``tok``, read from the Hugging Face
    files in ``folder`` (where its ``tokenizer.json`` lives; None for an embedded one): end ids
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


__all__ = ["END_TOKEN_NAMES", "START_TOKEN_NAMES", "HFTokenizer", "TokenizerFacts",
           "find_hf_tokenizer", "tokenizer_facts"]
