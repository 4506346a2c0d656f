"""Turning token bytes into text: UTF-8 safe across steps, stop strings never emitted.

Both llama.cpp and the HF-tokenizer backends hand out *bytes* per token; a multi-byte character
may span tokens, and a stop string may span steps. :class:`TextAssembler` is the one place that
deals with both, so every backend streams text the same way.

:func:`byte_level_pieces` maps a Hugging Face ``tokenizer.json`` vocabulary to the bytes of
each token (byte-level BPE and SentencePiece byte-fallback vocabularies), for backends whose
runtime has no per-token byte API.
"""

from __future__ import annotations

import codecs
import re
from collections.abc import Iterable, Mapping
from typing import Any

#: What :meth:`TextAssembler.state` returns: the UTF-8 decoder's state, held text, stopped.
AssemblerState = tuple[tuple[bytes, int], str, bool]


class TextAssembler:
    """Accumulates token bytes and releases text that is safe to show.

    ``push(piece)`` returns the text that can be emitted now: complete UTF-8 characters, minus
    any tail that might be the start of a stop string. When a stop string completes, ``stopped``
    becomes True and the text before it is returned; nothing after it is ever released.
    ``flush()`` releases what is held back once the stream ends for another reason (invalid
    trailing bytes become U+FFFD).
    """

    __slots__ = ("_decoder", "_held", "_max_stop", "_stops", "stopped")

    def __init__(self, stop: Iterable[str] = ()) -> None:
        self._decoder = codecs.getincrementaldecoder("utf-8")(errors="replace")
        self._stops = tuple(s for s in stop if s)
        self._max_stop = max((len(s) for s in self._stops), default=0)
        self._held = ""
        self.stopped = False

    def push(self, piece: bytes) -> str:
        """Add one token's bytes; return the text that may be emitted now."""
        if self.stopped:
            return ""
        text = self._decoder.decode(piece)
        if not self._stops:
            return text
        buf = self._held + text
        cut = -1
        for stop in self._stops:
            idx = buf.find(stop)
            if idx != -1 and (cut == -1 or idx < cut):
                cut = idx
        if cut != -1:
            self.stopped = True
            self._held = ""
            return buf[:cut]
        keep = self._partial_stop_len(buf)
        self._held = buf[len(buf) - keep:] if keep else ""
        return buf[: len(buf) - keep]

    def state(self) -> AssemblerState:
        """A snapshot for :meth:`restore` (the session undoes a failed step with it)."""
        return (self._decoder.getstate(), self._held, self.stopped)

    def restore(self, state: AssemblerState) -> None:
        """Go back to a :meth:`state` snapshot."""
        decoder_state, self._held, self.stopped = state
        self._decoder.setstate(decoder_state)

    def _partial_stop_len(self, buf: str) -> int:
        """Length of the longest suffix of ``buf`` that is a proper prefix of a stop string."""
        for n in range(min(self._max_stop - 1, len(buf)), 0, -1):
            tail = buf[-n:]
            if any(s.startswith(tail) for s in self._stops):
                return n
        return 0

    def flush(self) -> str:
        """Release everything held back (the stream ended without a stop string)."""
        if self.stopped:
            return ""
        out = self._held + self._decoder.decode(b"", final=True)
        self._held = ""
        return out


_BYTE_FALLBACK = re.compile(r"^<0x([0-9A-Fa-f]{2})>$")


def _gpt2_byte_decoder() -> dict[str, int]:
    """The GPT-2 byte-to-unicode table, inverted: printable stand-in char -> byte value."""
    printable = (
        list(range(ord("!"), ord("~") + 1))
        + list(range(ord("¡"), ord("¬") + 1))
        + list(range(ord("®"), ord("ÿ") + 1))
    )
    chars = printable[:]
    n = 0
    for b in range(256):
        if b not in printable:
            printable.append(b)
            chars.append(256 + n)
            n += 1
    return {chr(c): b for b, c in zip(printable, chars, strict=False)}


#: Special tokens whose text is output all the same: Gemma 4's thought-channel, tool-call and
#: string markers, which llama.cpp's converter marks user-defined "so that the chat parser can
#: read them" (its ``gemma.py``); a reply's tool calls are read from that text
#: (:mod:`eliza_backends.openai.gemma4_reader`).
RENDERED_SPECIAL = frozenset({"<|channel>", "<channel|>", "<|tool_call>", "<tool_call|>",
                              "<|tool_response>", "<tool_response|>", '<|"|>'})


def byte_level_pieces(tokenizer_json: Mapping[str, Any]) -> list[bytes]:
    """Bytes of every token id of a Hugging Face ``tokenizer.json`` (index = token id).

    Byte-level BPE vocabularies (GPT-2 style) are decoded through the GPT-2 byte table;
    SentencePiece-style vocabularies map ``▁`` to a space and ``<0xNN>`` to that byte. Added
    tokens map to their UTF-8 text, except special (control) tokens, which add no text, as in
    llama.cpp's rendering (and, as there, the ones in :data:`RENDERED_SPECIAL` keep their
    text). Ids without a token map to ``b""``.
    """
    model = tokenizer_json.get("model", {})
    vocab: Mapping[str, int] = model.get("vocab", {})
    if isinstance(vocab, list):  # Unigram: [[piece, score], ...]
        vocab = {piece: i for i, (piece, _score) in enumerate(vocab)}
    added = {t["id"]: "" if t.get("special") and t["content"] not in RENDERED_SPECIAL
             else t["content"] for t in tokenizer_json.get("added_tokens", [])}
    size = max([*vocab.values(), *added.keys(), -1]) + 1
    pieces = [b""] * size
    byte_level = "ByteLevel" in repr(tokenizer_json.get("pre_tokenizer")) or "ByteLevel" in repr(
        tokenizer_json.get("decoder")
    )
    table = _gpt2_byte_decoder()
    for token, idx in vocab.items():
        if byte_level and all(c in table for c in token):
            pieces[idx] = bytes(table[c] for c in token)
        elif m := _BYTE_FALLBACK.match(token):
            pieces[idx] = bytes([int(m.group(1), 16)])
        else:
            pieces[idx] = token.replace("▁", " ").encode("utf-8")
    for idx, content in added.items():
        pieces[idx] = content.encode("utf-8")
    return pieces


__all__ = ["RENDERED_SPECIAL", "AssemblerState", "TextAssembler", "byte_level_pieces"]
