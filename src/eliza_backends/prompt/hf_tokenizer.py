"""A Hugging Face ``tokenizer.json`` as a :class:`~eliza_backends.prompt.tokenizer.Tokenizer`:
:class:`HFTokenizer` (ids <-> text, the bytes of each token, special ids). Finding a bundle's
tokenizer and reading its facts is :mod:`eliza_backends.prompt.tokenizer`'s job, one way for every
tokenizer format.

Needs the ``tokenizers`` package, imported when a tokenizer is loaded (the backends that use
this module depend on it; the core does not).
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

from ..errors import BundleError
from ..runtime.text import byte_level_pieces
from .tokenizer import Tokenizer


class HFTokenizer(Tokenizer):
    """One ``tokenizer.json``: :meth:`encode`, :meth:`piece` (bytes per id), special ids."""

    def __init__(self, spec: str) -> None:
        from tokenizers import Tokenizer as RustTokenizer

        try:
            data: dict[str, Any] = json.loads(spec)
            self._tok = RustTokenizer.from_str(spec)
            # the same tokenizer with special tokens read as plain text (parse_special=False)
            self._plain = RustTokenizer.from_str(spec)
            self._plain.encode_special_tokens = True
        except Exception as exc:
            raise BundleError(f"tokenizer.json is not a valid Hugging Face tokenizer: {exc}") \
                from None
        self._pieces = byte_level_pieces(data)
        self.vocab_size = max(self._tok.get_vocab_size(with_added_tokens=True),
                                   len(self._pieces))
        added = data.get("added_tokens", [])
        self.special_ids = frozenset(int(t["id"]) for t in added if t.get("special"))
        #: Texts of the special tokens: what ``encode(..., parse_special=False)`` reads as text.
        self.control_texts = frozenset(
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

    def encode(self, text: str, *, add_special: bool = True,
               parse_special: bool = True) -> list[int]:
        """Token ids of ``text``; ``add_special`` applies the post-processor (e.g. BOS);
        ``parse_special=False`` reads special-token texts as plain text."""
        tok = self._tok if parse_special else self._plain
        return list(tok.encode(text, add_special_tokens=add_special).ids)

    def piece(self, token_id: int) -> bytes:
        """The bytes ``token_id`` contributes to output text (special tokens: none)."""
        return self._pieces[token_id] if 0 <= token_id < len(self._pieces) else b""


__all__ = ["HFTokenizer"]
