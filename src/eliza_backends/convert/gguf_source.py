"""Reading a source GGUF: its metadata as :class:`ModelFacts`, its tensors dequantized.

Everything here uses the ``gguf`` package (pure Python + numpy) and nothing heavier. The facts
are what every output format needs to be told explicitly (architecture numbers, rope bases,
the sliding window, BOS/EOS/end-of-turn ids, the chat template); the tensors come out as float32
numpy arrays in the source's own (llama.cpp) layout, one at a time.
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from ..errors import BundleError

#: Architectures the converter maps to Hugging Face / MLX / LiteRT (GGUF ``general.architecture``).
SUPPORTED_ARCHITECTURES = ("llama", "gemma3")


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


class GGUFSource:
    """A source GGUF file opened with ``gguf.GGUFReader`` (memory-mapped, read lazily)."""

    def __init__(self, path: str | os.PathLike[str]) -> None:
        import gguf

        self.path = Path(path)
        try:
            self._reader = gguf.GGUFReader(str(self.path))
        except Exception as exc:
            raise BundleError(f"{self.path} is not a readable GGUF file: {exc}") from None
        self._fields = self._reader.fields

    # ------------------------------------------------------------------ metadata

    def get(self, key: str, default: Any = None) -> Any:
        """One metadata value (str, number, bool or list), or ``default``."""
        f = self._fields.get(key)
        return default if f is None else f.contents()

    def metadata(self) -> dict[str, tuple[Any, Any, Any]]:
        """Every key -> (value, GGUFValueType, array element type or None), GGUF.* excluded."""
        import gguf

        out = {}
        for key, f in self._fields.items():
            if key.startswith("GGUF."):
                continue
            vtype = f.types[0]
            sub = f.types[-1] if vtype == gguf.GGUFValueType.ARRAY else None
            out[key] = (f.contents(), vtype, sub)
        return out

    def tensor_names(self) -> list[str]:
        """Tensor names in file order."""
        return [t.name for t in self._reader.tensors]

    def facts(self, eog_ids: tuple[int, ...] | None = None) -> ModelFacts:
        """The model's :class:`ModelFacts`. ``eog_ids`` (from llama.cpp's vocabulary, which
        also recognises end-of-turn tokens by their text) overrides the GGUF's eos/eot keys."""
        arch = self.get("general.architecture")
        if arch not in SUPPORTED_ARCHITECTURES:
            raise BundleError(f"{self.path}: architecture {arch!r} is not one the converter "
                              f"maps yet ({', '.join(SUPPORTED_ARCHITECTURES)})")

        def need(key: str) -> Any:
            value = self.get(f"{arch}.{key}")
            if value is None:
                raise BundleError(f"{self.path} lacks the metadata key {arch}.{key}")
            return value

        tokens = self.get("tokenizer.ggml.tokens") or []
        hidden = int(need("embedding_length"))
        heads = int(need("attention.head_count"))
        head_dim = int(self.get(f"{arch}.attention.key_length") or hidden // heads)
        tok = self._tokenizer_facts(eog_ids)
        names = set(self.tensor_names())
        common: dict[str, Any] = dict(
            architecture=arch, name=str(self.get("general.name") or self.path.stem),
            vocab_size=int(self.get(f"{arch}.vocab_size") or len(tokens)),
            hidden_size=hidden, intermediate_size=int(need("feed_forward_length")),
            num_layers=int(need("block_count")), num_heads=heads,
            num_kv_heads=int(self.get(f"{arch}.attention.head_count_kv") or heads),
            head_dim=head_dim,
            rms_norm_eps=f32_value(need("attention.layer_norm_rms_epsilon")),
            rope_theta=f32_value(self.get(f"{arch}.rope.freq_base") or 10000.0),
            max_position_embeddings=int(need("context_length")),
            tie_word_embeddings="output.weight" not in names, tokenizer=tok)
        if arch == "gemma3":
            # llama.cpp's gemma3: local layers use rope base 10000, every 6th layer is global,
            # queries scaled by 1/sqrt(head_dim) (the 27B model alone uses hidden/heads)
            common.update(rope_local_theta=10000.0,
                          sliding_window=int(need("attention.sliding_window")),
                          sliding_window_pattern=6, query_pre_attn_scalar=head_dim)
        return ModelFacts(**common)

    def _tokenizer_facts(self, eog_ids: tuple[int, ...] | None) -> TokenizerFacts:
        model = self.get("tokenizer.ggml.model")
        if model not in ("gpt2", "llama"):
            raise BundleError(f"{self.path}: tokenizer model {model!r} is not supported "
                              "(gpt2 byte-level BPE and llama SentencePiece are)")

        def opt_int(key: str) -> int | None:
            v = self.get(f"tokenizer.ggml.{key}")
            return None if v is None else int(v)

        eos = opt_int("eos_token_id")
        if eog_ids is None:
            eog = [i for i in (eos, opt_int("eot_token_id"), opt_int("eom_token_id"))
                   if i is not None]
            eog_ids = tuple(dict.fromkeys(eog))
        add_bos = self.get("tokenizer.ggml.add_bos_token")
        return TokenizerFacts(
            model=model, pre=self.get("tokenizer.ggml.pre"),
            tokens=list(self.get("tokenizer.ggml.tokens") or []),
            token_types=[int(t) for t in self.get("tokenizer.ggml.token_type") or []],
            scores=[float(s) for s in self.get("tokenizer.ggml.scores")]
            if self.get("tokenizer.ggml.scores") is not None else None,
            merges=list(self.get("tokenizer.ggml.merges")) if model == "gpt2" else None,
            bos_id=opt_int("bos_token_id"), eos_id=eos, unk_id=opt_int("unknown_token_id"),
            pad_id=opt_int("padding_token_id"),
            add_bos=bool(add_bos) if add_bos is not None else model == "llama",
            add_space_prefix=bool(self.get("tokenizer.ggml.add_space_prefix", False)),
            eog_ids=eog_ids, chat_template=self.get("tokenizer.chat_template"))

    # ------------------------------------------------------------------ tensors

    def tensors(self) -> Iterator[tuple[str, Any]]:
        """(name, float32 array in numpy order, i.e. GGML's shape reversed), one at a time."""
        import numpy as np
        from gguf.quants import dequantize

        for t in self._reader.tensors:
            data = dequantize(t.data, t.tensor_type)
            shape = tuple(int(d) for d in reversed(t.shape))
            yield t.name, np.ascontiguousarray(data.reshape(shape), dtype=np.float32)


__all__ = ["SUPPORTED_ARCHITECTURES", "GGUFSource", "ModelFacts", "TokenizerFacts", "f32_value"]
