"""A SentencePiece model (a ``tokenizer.model`` file or a ``.litertlm`` SP_Tokenizer section)
as a :class:`~eliza_backends.prompt.tokenizer.Tokenizer`: :class:`SPTokenizer`.

SentencePiece itself never produces control pieces (``<start_of_turn>``, ``<eos>``...) from
text; like llama.cpp with special-token parsing, :meth:`SPTokenizer.encode` first splits the
text at control-piece strings (and the unknown piece's) and encodes the text between them;
with ``parse_special=False`` those strings are plain text.

Needs the ``sentencepiece`` package, imported when a tokenizer is loaded (the backends that use
this module depend on it; the core does not).
"""

from __future__ import annotations

import os
import re
from pathlib import Path

from ..errors import BundleError
from .tokenizer import Tokenizer

_BYTE = re.compile(r"^<0x([0-9A-Fa-f]{2})>$")


class SPTokenizer(Tokenizer):
    """One SentencePiece model: :meth:`encode`, :meth:`piece` (bytes per id), special ids."""

    def __init__(self, model_proto: bytes) -> None:
        import sentencepiece

        try:
            self._sp = sentencepiece.SentencePieceProcessor(model_proto=model_proto)
        except Exception as exc:
            raise BundleError(f"not a valid SentencePiece model: {exc}") from None
        sp = self._sp
        n = sp.get_piece_size()
        self.vocab_size = n
        special = [i for i in range(n) if sp.is_control(i) or sp.is_unknown(i)]
        self.special_ids = frozenset(special)
        self._pieces: list[bytes] = []
        self._by_text: dict[str, int] = {}
        for i in range(n):
            text = sp.id_to_piece(i)
            self._by_text.setdefault(text, i)
            if i in self.special_ids:
                self._pieces.append(b"")
            elif sp.is_byte(i) and (m := _BYTE.match(text)):
                self._pieces.append(bytes([int(m.group(1), 16)]))
            else:
                self._pieces.append(text.replace("\u2581", " ").encode("utf-8"))
        self.control_texts = frozenset(t for i in special if (t := sp.id_to_piece(i)))
        controls = sorted(self.control_texts, key=len, reverse=True)
        self._control = re.compile("|".join(map(re.escape, controls))) if controls else None
        bos = sp.bos_id()
        self._bos: int | None = bos if bos >= 0 else None

    @classmethod
    def from_file(cls, path: str | os.PathLike[str]) -> SPTokenizer:
        """Load a ``tokenizer.model`` from disk (:class:`BundleError` if unreadable)."""
        try:
            return cls(Path(path).read_bytes())
        except OSError as exc:
            raise BundleError(f"cannot read tokenizer {path}: {exc.strerror}") from None

    def token_id(self, content: str) -> int | None:
        """Id of a piece by its text (e.g. ``"<end_of_turn>"``), if present."""
        return self._by_text.get(content)

    def token_text(self, token_id: int) -> str | None:
        """The piece text of ``token_id``, None if out of range."""
        if not 0 <= token_id < self.vocab_size:
            return None
        text: str = self._sp.id_to_piece(token_id)
        return text

    def encode(self, text: str, *, add_special: bool = True,
               parse_special: bool = True) -> list[int]:
        """Token ids of ``text`` (control-piece strings become their ids unless
        ``parse_special`` is off); ``add_special`` prepends BOS."""
        ids: list[int] = [self._bos] if add_special and self._bos is not None else []
        pos = 0
        splits = self._control.finditer(text) if self._control and parse_special else ()
        for m in splits:
            if m.start() > pos:
                ids += self._sp.encode(text[pos:m.start()])
            ids.append(self._by_text[m.group(0)])
            pos = m.end()
        if pos < len(text):
            ids += self._sp.encode(text[pos:])
        return ids

    def piece(self, token_id: int) -> bytes:
        """The bytes ``token_id`` contributes to output text (control pieces: none)."""
        return self._pieces[token_id] if 0 <= token_id < len(self._pieces) else b""


__all__ = ["SPTokenizer"]
