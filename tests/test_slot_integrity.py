"""Slots (issue 15, item 9): the header is inside the integrity check, and the model
fingerprint covers every byte of the model (cached, so it is cheap after the first time)."""

from __future__ import annotations

import re
import struct
from pathlib import Path

import pytest
from conftest import TINY_BUNDLE

from eliza_backends import SlotError, open_stream
from eliza_backends.hashing import fingerprint_artifact

pytest.importorskip("llama_cpp")

PROMPT = "Four score and seven years ago"


def _save(bundle: Path, slot: Path) -> list[int]:
    with open_stream(bundle, backend="llama.cpp", threads=1, max_tokens=8,
                     ignore_eos=True) as stream:
        stream.prefill(PROMPT)
        stream.session.save_slot(slot)
        return [t for step in stream for t in step.tokens]


def test_an_edited_token_id_in_the_header_is_refused(tmp_path: Path) -> None:
    """One digit of a token id changed in the JSON header, same length: on 98aaa27 this was
    accepted and changed the continuation."""
    slot = tmp_path / "s.slot"
    _save(TINY_BUNDLE, slot)
    data = bytearray(slot.read_bytes())
    match = re.search(rb'"tokens":\[(\d+)', bytes(data))
    assert match is not None
    at = match.start(1)
    data[at] = ord(str((int(chr(data[at])) + 1) % 10))
    slot.write_bytes(bytes(data))
    with open_stream(TINY_BUNDLE, backend="llama.cpp", threads=1) as stream:
        with pytest.raises(SlotError, match="sha256"):
            stream.session.restore_slot(slot)
        assert stream.session.n_past == 0


def _spread_out(gguf: bytes, alignment: int = 1 << 20) -> bytes:
    """The same model with every tensor on its own MiB boundary: a 22 MB file whose middle
    tensors lie far from its first and last MiB."""
    from gguf_fuzz import KV, parse, serialize

    g = parse(gguf)
    order = sorted(range(len(g.tensors)), key=lambda i: g.tensors[i].offset)
    bounds = [g.tensors[i].offset for i in order] + [len(g.data)]
    data = bytearray()
    for k, i in enumerate(order):
        chunk = g.data[bounds[k]:bounds[k + 1]]
        g.tensors[i].offset = len(data)
        data += chunk + bytes(-(len(data) + len(chunk)) % alignment)
    g.data = bytes(data)
    g.kvs = [kv for kv in g.kvs if kv.key != b"general.alignment"]
    g.kvs.append(KV(b"general.alignment", 4, alignment))
    g.alignment = alignment
    return serialize(g)


def test_a_model_whose_middle_weights_differ_has_another_fingerprint(tmp_path: Path) -> None:
    pytest.importorskip("gguf_fuzz")
    spread = _spread_out((TINY_BUNDLE / "text" / "tiny-f16.gguf").read_bytes())
    original, edited = tmp_path / "original", tmp_path / "edited"
    for bundle in (original, edited):
        (bundle / "text").mkdir(parents=True)
        (bundle / "text" / "m.gguf").write_bytes(spread)
    middle = next(i for i in range(len(spread) // 2, len(spread)) if spread[i])  # a weight
    assert middle > 2 << 20 and len(spread) - middle > 2 << 20
    data = bytearray(spread)
    data[middle] ^= 0x40
    (edited / "text" / "m.gguf").write_bytes(bytes(data))
    assert fingerprint_artifact(edited / "text" / "m.gguf") != \
        fingerprint_artifact(original / "text" / "m.gguf")

    slot = tmp_path / "s.slot"
    _save(original, slot)
    with open_stream(edited, backend="llama.cpp", threads=1) as stream, \
            pytest.raises(SlotError, match="different model"):
        stream.session.restore_slot(slot)


def test_the_fingerprint_follows_the_file_and_its_cache_is_not_stale(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("ELIZA_CACHE_DIR", str(tmp_path / "cache"))
    f = tmp_path / "m.bin"
    f.write_bytes(b"a" * 100_000)
    first = fingerprint_artifact(f)
    assert fingerprint_artifact(f) == first and any((tmp_path / "cache").rglob("*"))
    with open(f, "r+b") as fh:  # an in-place edit of the same size
        fh.seek(50_000)
        fh.write(b"b")
    assert fingerprint_artifact(f) != first


def test_slots_restore_and_continue_exactly(tmp_path: Path) -> None:
    slot = tmp_path / "s.slot"
    expected = _save(TINY_BUNDLE, slot)
    with open_stream(TINY_BUNDLE, backend="llama.cpp", threads=1, max_tokens=8,
                     ignore_eos=True) as stream:
        stream.session.restore_slot(slot)
        assert [t for step in stream for t in step.tokens] == expected


@pytest.mark.parametrize("stream", [0, 1, 2])
def test_a_batched_sequences_state_converts_in_place_to_one_stream(stream: int) -> None:
    """llama.cpp's state of sequence ``stream`` in a 3-stream cache is [head, 3, 0 * stream,
    count, cells, 0 * (2 - stream)]; its one-stream form [head, 1, count, cells] is a view
    of the same buffer (the head moved up: for stream 1 it overlaps where it was), and back
    to 3 streams the cells are in stream 0."""
    from eliza_llamacpp.kv_streams import to_one_stream, to_streams

    u32 = struct.Struct("<I").pack
    head, cells = b"MAGC" + u32(7), u32(5) + bytes(range(40))
    state = bytearray(head + u32(3) + u32(0) * stream + cells + u32(0) * (2 - stream))
    one = to_one_stream(memoryview(state), 3, stream)
    assert bytes(one) == head + u32(1) + cells
    assert one.obj is state  # no copy
    assert bytes(to_streams(bytes(one), 3)) == head + u32(3) + cells + u32(0) * 2
    other = bytearray(head + u32(2) + cells)  # another layout: left as it is
    assert to_one_stream(memoryview(other), 3, stream) == head + u32(2) + cells
