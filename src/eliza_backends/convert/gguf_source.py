"""Reading a source GGUF: its metadata as :class:`ModelFacts`, its tensors dequantized.

Everything here uses the ``gguf`` package (pure Python + numpy) and nothing heavier. The facts
are what every output format needs to be told explicitly (architecture numbers, rope bases,
the sliding window, BOS/EOS/end-of-turn ids, the chat template); the tensors come out as float32
numpy arrays in the source's own (llama.cpp) layout, one at a time.
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from ..errors import BundleError
from . import families
from .facts import ModelFacts, TokenizerFacts, f32_value

#: Architectures the converter maps to Hugging Face / MLX / LiteRT (GGUF ``general.architecture``).
SUPPORTED_ARCHITECTURES = families.gguf_architectures()


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
        common.update(families.for_architecture(arch).gguf_facts(need, head_dim))
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
