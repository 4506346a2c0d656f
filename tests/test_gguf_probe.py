"""The llama.cpp plugin's metadata probe (``gguf_header.gguf_metadata``), which ``serve`` and
``explain()`` run before any load: it skips the vocabulary's string arrays a chunk at a time
(issue 42: the string-by-string walk cost 30 ms on SmolLM2 and 0.1-0.3 s on Gemma 3 at every
``serve`` start) and must read every value as llama.cpp's own reader does."""

from __future__ import annotations

import struct
from pathlib import Path

import pytest
from conftest import TINY_BUNDLE

gguf_header = pytest.importorskip("eliza_llamacpp.gguf_header")


def _string(text: bytes) -> bytes:
    return struct.pack("<Q", len(text)) + text


def _gguf(vocab: list[bytes]) -> bytes:
    """A GGUF header: a string array (the vocabulary), then a u32 and a string after it."""
    kvs = [_string(b"tokenizer.ggml.tokens") + struct.pack("<IIQ", 9, 8, len(vocab))
           + b"".join(_string(t) for t in vocab),
           _string(b"llama.pooling_type") + struct.pack("<II", 4, 1),
           _string(b"general.name") + struct.pack("<I", 8) + _string(b"after the vocabulary")]
    return b"GGUF" + struct.pack("<IQQ", 3, 0, len(kvs)) + b"".join(kvs)


KEYS = frozenset({"llama.pooling_type", "general.name", "tokenizer.ggml.tokens"})
WANT = {"llama.pooling_type": 1, "general.name": "after the vocabulary",
        "tokenizer.ggml.tokens": None}


@pytest.mark.parametrize("chunk", [1 << 20, 64, 9])
def test_values_after_a_vocabulary_are_read_whatever_the_chunk(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, chunk: int) -> None:
    """Strings that straddle a chunk's end, and strings longer than a chunk (``chunk`` 9 and
    64 force both), are skipped exactly."""
    vocab = [b"", b"a", b"\xe2\x96\x81the", b"x" * 100, *(bytes([65 + i % 26]) * (i % 17)
                                                         for i in range(500))]
    path = tmp_path / "v.gguf"
    path.write_bytes(_gguf(vocab))
    monkeypatch.setattr(gguf_header, "_CHUNK", chunk)
    assert gguf_header.gguf_metadata(path, KEYS) == WANT


def test_a_cut_vocabulary_reads_what_precedes_it_and_no_more(tmp_path: Path) -> None:
    data = _gguf([b"token%d" % i for i in range(1000)])
    path = tmp_path / "cut.gguf"
    path.write_bytes(data[: len(data) // 2])
    assert gguf_header.gguf_metadata(path, KEYS) == {}
    path.write_bytes(_gguf([b"x" * ((1 << 20) + 1)]))  # a string over the 1 MiB bound
    assert gguf_header.gguf_metadata(path, KEYS) == {}


def test_the_tiny_models_values_match_llama_cpps_reader() -> None:
    llama_cpp = pytest.importorskip("llama_cpp")
    gguf = next((TINY_BUNDLE / "text").glob("*.gguf"))
    llm = llama_cpp.Llama(str(gguf), n_ctx=64, verbose=False, vocab_only=True)
    scalars = {k: v for k, v in llm.metadata.items() if not k.startswith("tokenizer.ggml.")}
    got = gguf_header.gguf_metadata(gguf, frozenset(scalars))
    shown = {k: f"{v:f}" if isinstance(v, float) else str(v) for k, v in got.items()}
    assert shown == scalars  # llama.cpp shows its floats as printf's %f
