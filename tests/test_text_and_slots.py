"""Text assembly (UTF-8 across steps, stop strings) and slot files."""

from __future__ import annotations

import json
import struct
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from eliza_backends import SlotError
from eliza_backends.runtime.slots import read_slot, write_slot
from eliza_backends.runtime.text import TextAssembler, byte_level_pieces


def _feed(assembler: TextAssembler, pieces: list[bytes]) -> str:
    out = "".join(assembler.push(p) for p in pieces)
    return out + assembler.flush()


def test_multibyte_characters_split_across_tokens() -> None:
    data = "héllo ✓ 🙂".encode()
    a = TextAssembler()
    outs = [a.push(bytes([b])) for b in data]
    assert "".join(outs) + a.flush() == "héllo ✓ 🙂"
    assert all("\ufffd" not in o for o in outs)


@given(st.text(max_size=40), st.lists(st.integers(1, 5), max_size=20))
def test_any_split_gives_back_the_text(text: str, cuts: list[int]) -> None:
    data = text.encode("utf-8", "surrogatepass") if text.isprintable() else text.encode(
        "utf-8", "replace")
    pieces, i = [], 0
    for c in cuts:
        pieces.append(data[i:i + c])
        i += c
    pieces.append(data[i:])
    assert _feed(TextAssembler(), pieces) == data.decode("utf-8", "replace")


@given(st.text(alphabet="abc", max_size=30), st.text(alphabet="abc", min_size=1, max_size=4))
def test_stop_string_never_emitted(text: str, stop: str) -> None:
    a = TextAssembler([stop])
    out = "".join(a.push(ch.encode()) for ch in text)
    if stop in text:
        assert a.stopped and out == text[: text.index(stop)]
    else:
        assert out + a.flush() == text
        assert not a.stopped


def test_byte_level_pieces_gpt2_and_sentencepiece() -> None:
    gpt2 = {"pre_tokenizer": {"type": "ByteLevel"},
            "model": {"vocab": {"Ġhi": 0, "Ã©": 1, "a": 2}},
            "added_tokens": [{"id": 3, "content": "<|end|>", "special": True},
                             {"id": 4, "content": "<x>", "special": False}]}
    assert byte_level_pieces(gpt2) == [b" hi", "é".encode(), b"a", b"", b"<x>"]
    spm = {"model": {"vocab": {"▁the": 0, "<0x0A>": 1}}}
    assert byte_level_pieces(spm) == [b" the", b"\n"]


def _write(path: Path) -> None:
    write_slot(path, {"backend": "b", "model_fingerprint": "f", "runtime": "r",
                      "tokens": [1, 2, 3]}, b"payload")


def test_slot_round_trip(tmp_path: Path) -> None:
    _write(tmp_path / "s")
    header, payload = read_slot(tmp_path / "s", backend="b", model_fingerprint="f", runtime="r")
    assert header.tokens == (1, 2, 3) and payload == b"payload"


@pytest.mark.parametrize("kw, needle", [
    ({"backend": "x"}, "saved by backend"),
    ({"model_fingerprint": "g"}, "different model"),
    ({"runtime": "r2"}, "runtime"),
])
def test_slot_identity_mismatch(tmp_path: Path, kw: dict, needle: str) -> None:
    _write(tmp_path / "s")
    args = {"backend": "b", "model_fingerprint": "f", "runtime": "r", **kw}
    with pytest.raises(SlotError, match=needle):
        read_slot(tmp_path / "s", **args)


@settings(deadline=None)  # correctness, not speed: a loaded machine must not fail it
@given(st.binary(max_size=300))
def test_slot_reader_never_crashes_on_garbage(tmp_path_factory: pytest.TempPathFactory,
                                             blob: bytes) -> None:
    path = tmp_path_factory.mktemp("g") / "s"
    path.write_bytes(blob)
    with pytest.raises(SlotError):
        read_slot(path, backend="b", model_fingerprint="f", runtime="r")


def test_slot_reader_on_mutations_of_a_good_file(tmp_path: Path) -> None:
    _write(tmp_path / "s")
    good = (tmp_path / "s").read_bytes()
    head_len = struct.unpack_from("<I", good, 8)[0]
    start = 8 + 4 + 32
    header = json.loads(good[start:start + head_len])
    variants = [good[:n] for n in range(0, len(good) - 1, 7)]
    variants.append(good[:8] + struct.pack("<I", 1 << 30) + good[12:])
    header["tokens"] = ["x"]
    text = json.dumps(header).encode()
    variants.append(good[:8] + struct.pack("<I", len(text)) + good[12:start] + text + b"payload")
    variants += [good[:i] + bytes([good[i] ^ 1]) + good[i + 1:] for i in range(len(good))]
    for blob in variants:
        (tmp_path / "v").write_bytes(blob)
        with pytest.raises(SlotError):
            read_slot(tmp_path / "v", backend="b", model_fingerprint="f", runtime="r")


def test_slot_write_to_missing_directory(tmp_path: Path) -> None:
    with pytest.raises(SlotError, match="does not exist"):
        _write(tmp_path / "missing" / "s")
