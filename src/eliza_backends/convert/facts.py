"""What the converter knows about a model, whatever its source: :class:`ModelFacts` (the
architecture numbers every output format is told explicitly) and :class:`TokenizerFacts` (the
vocabulary as GGUF stores it). Read from a GGUF by :mod:`.gguf_source`, from a Hugging Face
folder by the model's family (:mod:`.families`)."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any


@dataclass(frozen=True)
class TokenizerFacts:
    """The vocabulary as GGUF stores it, and the special-token behaviour llama.cpp derives."""

    model: str  # "gpt2" (byte-level BPE) or "llama" (SentencePiece-style)
    pre: str | None  # GGUF pre-tokenizer name (BPE only), e.g. "smollm", "gpt-2"
    tokens: list[str]
    token_types: list[int]  # GGUF / SentencePiece piece types: 1 normal .. 6 byte
    scores: list[float] | None  # SentencePiece scores (llama model only)
    merges: list[str] | None  # BPE merges "a b" (gpt2 model only)
    bos_id: int | None
    eos_id: int | None
    unk_id: int | None
    pad_id: int | None
    add_bos: bool
    add_space_prefix: bool
    eog_ids: tuple[int, ...]  # every end-of-generation id, eos first
    chat_template: str | None

    @property
    def vocab_size(self) -> int:
        """Number of token ids."""
        return len(self.tokens)

    def text(self, token_id: int | None) -> str | None:
        """The vocabulary text of ``token_id`` (None for None / out of range)."""
        if token_id is None or not 0 <= token_id < len(self.tokens):
            return None
        return self.tokens[token_id]


@dataclass(frozen=True)
class ModelFacts:
    """Architecture numbers of a decoder-only model, named as Hugging Face configs name them."""

    architecture: str
    name: str
    vocab_size: int
    hidden_size: int
    intermediate_size: int
    num_layers: int
    num_heads: int
    num_kv_heads: int
    head_dim: int
    rms_norm_eps: float
    rope_theta: float
    max_position_embeddings: int
    tie_word_embeddings: bool
    tokenizer: TokenizerFacts
    #: gemma3 only: local (sliding-window) rope base, window, full-attention period
    rope_local_theta: float | None = None
    sliding_window: int | None = None
    sliding_window_pattern: int | None = None
    query_pre_attn_scalar: int | None = None
    extra: dict[str, Any] = field(default_factory=dict)

    def layer_types(self) -> list[str] | None:
        """Per-layer attention kind for sliding-window models (None otherwise)."""
        if self.sliding_window_pattern is None:
            return None
        p = self.sliding_window_pattern
        return ["full_attention" if (i + 1) % p == 0 else "sliding_attention"
                for i in range(self.num_layers)]


def f32_value(value: float) -> float:
    """A float32 metadata value as the shortest decimal that round-trips (1e-05, not 9.99e-06)."""
    import numpy as np

    return float(repr(np.float32(value)).removeprefix("np.float32(").removesuffix(")"))


__all__ = ["ModelFacts", "TokenizerFacts", "f32_value"]
