"""Hugging Face ``tokenizer.json`` support for backends whose runtime has no tokenizer API
(LiteRT's interpreter, the MLX session): ids <-> text and the bytes of each token.

Needs the ``tokenizers`` package, imported when a tokenizer is loaded (the backends that use
this module depend on it; the core does not).
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

from .errors import BundleError
from .text import byte_level_pieces


class HFTokenizer:
    """One ``tokenizer.json``: :meth:`encode`, :meth:`piece` (bytes per id), special ids."""

    def __init__(self, spec: str) -> None:
        from tokenizers import Tokenizer

        try:
            data: dict[str, Any] = json.loads(spec)
            self._tok = Tokenizer.from_str(spec)
        except Exception as exc:
            raise BundleError(f"tokenizer.json is not a valid Hugging Face tokenizer: {exc}") \
                from None
        self._pieces = byte_level_pieces(data)
        self.vocab_size: int = max(self._tok.get_vocab_size(with_added_tokens=True),
                                   len(self._pieces))
        self.special_ids: frozenset[int] = frozenset(
            t["id"] for t in data.get("added_tokens", []) if t.get("special"))
        self._by_content = {t["content"]: t["id"] for t in data.get("added_tokens", [])}

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

    def encode(self, text: str, *, add_special: bool = True) -> list[int]:
        """Token ids of ``text``; ``add_special`` applies the post-processor (e.g. BOS)."""
        return list(self._tok.encode(text, add_special_tokens=add_special).ids)

    def piece(self, token_id: int) -> bytes:
        """The bytes ``token_id`` contributes to output text (special tokens: none)."""
        return self._pieces[token_id] if 0 <= token_id < len(self._pieces) else b""

    def decode(self, ids: list[int]) -> str:
        """Text of ``ids`` from the token bytes (invalid UTF-8 becomes U+FFFD)."""
        return b"".join(self.piece(t) for t in ids).decode("utf-8", "replace")


__all__ = ["HFTokenizer"]
