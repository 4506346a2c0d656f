"""Media input (eliza_backends.media): images and audio decoded and checked once, every class of
bad media a typed MediaError (ELIZA_ERR_INVALID_ARG) before any session call; and on a real
text-only llama.cpp session: a media request is refused before any native call and the session
keeps its conversation.
"""

from __future__ import annotations

import base64
import io
import struct
import wave
import zlib
from pathlib import Path

import numpy as np
import pytest
from PIL import Image

from eliza_backends import MediaError, Status, UnsupportedOperationError, open_stream
from eliza_backends.backend.media_seq import reusable_prefix
from eliza_backends.backend.types import MediaSpan
from eliza_backends.media import (
    AUDIO_RATE,
    MediaLimits,
    audio_from_bytes,
    audio_from_pcm,
    image_from_bytes,
    image_from_rgb,
    image_from_url,
    load_media_file,
    media_from_part,
    resample,
)


def png(width: int = 48, height: int = 32, color: tuple[int, int, int] = (200, 30, 10)) -> bytes:
    out = io.BytesIO()
    Image.new("RGB", (width, height), color).save(out, "PNG")
    return out.getvalue()


def wav(seconds: float = 0.5, rate: int = AUDIO_RATE, width: int = 2, channels: int = 1,
        frames: int | None = None) -> bytes:
    n = int(seconds * rate)
    t = np.arange(n) / rate
    x = 0.5 * np.sin(2 * np.pi * 440 * t)
    ints = {1: (x * 127 + 128).astype("u1"), 2: (x * 32767).astype("<i2"),
            4: (x * 2147483647).astype("<i4")}[width]
    out = io.BytesIO()
    with wave.open(out, "wb") as w:
        w.setnchannels(channels)
        w.setsampwidth(width)
        w.setframerate(rate)
        w.writeframes(np.repeat(ints, channels).tobytes())
    data = out.getvalue()
    if frames is not None:  # a header that lies about its length
        data = data[:40] + struct.pack("<I", frames * width * channels) + data[44:]
    return data


def data_uri(data: bytes, mime: str = "image/png") -> str:
    return f"data:{mime};base64,{base64.b64encode(data).decode()}"


def bomb_png(width: int, height: int) -> bytes:
    """A valid PNG header (and a tiny IDAT) claiming width x height pixels."""
    def chunk(kind: bytes, body: bytes) -> bytes:
        return struct.pack(">I", len(body)) + kind + body + struct.pack(
            ">I", zlib.crc32(kind + body) & 0xFFFFFFFF)

    ihdr = struct.pack(">IIBBBBB", width, height, 8, 2, 0, 0, 0)
    return (b"\x89PNG\r\n\x1a\n" + chunk(b"IHDR", ihdr) + chunk(b"IDAT", zlib.compress(b"\0"))
            + chunk(b"IEND", b""))


# ------------------------------------------------------------------------------ good media

def test_png_and_jpeg_decode_to_rgb_with_a_content_digest() -> None:
    item = image_from_bytes(png())
    assert item.kind == "image" and item.data.shape == (32, 48, 3)
    assert item.data.dtype == np.uint8 and not item.data.flags.writeable
    assert tuple(item.data[0, 0]) == (200, 30, 10)
    jpeg = io.BytesIO()
    Image.new("RGB", (16, 8), (0, 0, 255)).save(jpeg, "JPEG")
    assert image_from_bytes(jpeg.getvalue()).source == "jpeg"
    # the digest is of the decoded pixels: the same pixels share it, other pixels do not
    assert image_from_bytes(png()).digest == item.digest
    assert image_from_rgb(item.data).digest == item.digest
    assert image_from_bytes(png(color=(200, 30, 11))).digest != item.digest


def test_wav_of_every_width_and_rate_becomes_16k_mono() -> None:
    for width in (1, 2, 4):
        item = audio_from_bytes(wav(width=width))
        assert item.kind == "audio" and item.data.dtype == np.float32
        assert len(item.data) == AUDIO_RATE // 2
        assert 0.45 < float(np.abs(item.data).max()) < 0.55
    stereo_44k = audio_from_bytes(wav(rate=44_100, channels=2))
    assert abs(len(stereo_44k.data) - AUDIO_RATE // 2) <= 1
    # the resampler keeps a tone's frequency: 440 Hz at 44.1 kHz is 440 Hz at 16 kHz
    spectrum = np.abs(np.fft.rfft(stereo_44k.data))
    assert abs(np.argmax(spectrum) * AUDIO_RATE / len(stereo_44k.data) - 440) < 5
    assert np.allclose(resample(np.ones(100, np.float32), AUDIO_RATE), 1.0)


MP3 = Path(__file__).parent / "fixtures" / "media" / "speech-2s.mp3"


def test_mp3_decodes_to_16k_mono_and_bad_flac_is_a_typed_error() -> None:
    item = audio_from_bytes(MP3.read_bytes())  # sniffed: no format given
    assert item.source == "mp3" and 1.8 < item.seconds < 2.0
    assert float(np.abs(item.data).max()) > 0.01  # speech, not silence
    assert audio_from_bytes(MP3.read_bytes(), "mp3").digest == item.digest
    with pytest.raises(MediaError, match="FLAC data cannot be decoded"):
        audio_from_bytes(b"fLaC" + b"\0" * 64, "flac")
    with pytest.raises(MediaError, match="s long, more than"):
        audio_from_bytes(MP3.read_bytes(), limits=MediaLimits(max_audio_seconds=1.0))


def test_openai_parts_become_items_and_text_parts_none() -> None:
    assert media_from_part({"type": "text", "text": "hi"}) is None
    image = media_from_part({"type": "image_url", "image_url": {"url": data_uri(png())}})
    assert image is not None and image.kind == "image"
    audio = media_from_part({"type": "input_audio", "input_audio": {
        "data": base64.b64encode(wav()).decode(), "format": "wav"}})
    assert audio is not None and audio.kind == "audio"


def test_local_files_only_when_allowed(tmp_path: Path) -> None:
    path = tmp_path / "pic.png"
    path.write_bytes(png())
    with pytest.raises(MediaError, match="not read unless allowed"):
        image_from_url(str(path))
    with pytest.raises(MediaError, match="not read unless allowed"):
        image_from_url(f"file://{path}")
    assert image_from_url(str(path), MediaLimits(allow_files=True)).width == 48
    assert load_media_file(path).height == 32  # the caller's own path (generate --image)


# ------------------------------------------------------------------------------ bad media

BAD_MEDIA = {
    "truncated png": lambda: image_from_bytes(png()[:60]),
    "corrupt png": lambda: image_from_bytes(png()[:16] + b"\xff" * 200),
    "not an image": lambda: image_from_bytes(b"GIF89a" + b"\0" * 64),
    "empty image": lambda: image_from_bytes(b""),
    "decompression bomb": lambda: image_from_bytes(bomb_png(60_000, 60_000)),
    "too many pixels for the budget": lambda: image_from_bytes(png(), MediaLimits(max_pixels=100)),
    "too many bytes": lambda: image_from_bytes(png(), MediaLimits(max_bytes=10)),
    "audio too long": lambda: audio_from_bytes(wav(seconds=2.0), limits=MediaLimits(
        max_audio_seconds=1.0)),
    "rate that cannot be resampled": lambda: audio_from_bytes(wav(rate=4_000)),
    "pcm at a zero rate": lambda: audio_from_pcm(np.zeros(10, np.float32), 0),
    "pcm with NaN": lambda: audio_from_pcm(np.array([0.0, np.nan], np.float32), AUDIO_RATE),
    "truncated wav": lambda: audio_from_bytes(wav(frames=AUDIO_RATE * 4)[:2000]),
    "not audio": lambda: audio_from_bytes(b"hello world, this is text"),
    "unsupported audio format": lambda: media_from_part(
        {"type": "input_audio", "input_audio": {"data": "AAAA", "format": "ogg"}}),
    "data uri not base64": lambda: image_from_url("data:image/png;base64,@@not base64@@"),
    "data uri without base64": lambda: image_from_url("data:image/png,rawbytes"),
    "data uri of another type": lambda: image_from_url(data_uri(png(), "text/plain")),
    "audio data not base64": lambda: media_from_part(
        {"type": "input_audio", "input_audio": {"data": "%%%", "format": "wav"}}),
    "remote url": lambda: image_from_url("https://example.com/cat.png"),
    "remote url even with files allowed": lambda: image_from_url(
        "http://example.com/cat.png", MediaLimits(allow_files=True)),
}


@pytest.mark.parametrize("case", sorted(BAD_MEDIA))
def test_every_class_of_bad_media_is_a_typed_error(case: str) -> None:
    with pytest.raises(MediaError) as info:
        BAD_MEDIA[case]()
    assert info.value.code == Status.ERR_INVALID_ARG
    assert len(info.value.message) > 30  # says what is wrong and what to do


def test_a_bomb_is_refused_from_its_header_before_decoding() -> None:
    """60000 x 60000 RGB would be 10.8 GB decoded: the header alone refuses it."""
    import tracemalloc

    tracemalloc.start()
    with pytest.raises(MediaError, match="was not decoded"):
        image_from_bytes(bomb_png(60_000, 60_000))
    _, peak = tracemalloc.get_traced_memory()
    tracemalloc.stop()
    assert peak < 10 << 20


# ------------------------------------------------------------------------------ prefix reuse

def test_reusable_prefix_cuts_at_the_first_differing_media_item() -> None:
    a = MediaSpan(2, 5, "image", "aaa")
    b = MediaSpan(2, 5, "image", "bbb")
    later = MediaSpan(10, 3, "audio", "ccc")
    assert reusable_prefix(12, [a], [a]) == 12  # the same image: all of it
    assert reusable_prefix(12, [a], [b]) == 2  # same placeholder ids, other pixels: cut before
    assert reusable_prefix(12, [a, later], [a]) == 10  # the history's audio is not wanted
    assert reusable_prefix(4, [a], [a]) == 2  # never inside an item
    assert reusable_prefix(12, [], [a]) == 2  # plain ids where the new prompt has an item


# ------------------------------------------------------------------------------ a text-only session

IMAGE_MESSAGE = {"role": "user", "content": [
    {"type": "image_url", "image_url": {"url": data_uri(png())}},
    {"type": "text", "text": "What is this?"}]}


def test_a_text_only_backend_refuses_media_and_keeps_the_conversation(tiny_bundle: Path) -> None:
    with open_stream(tiny_bundle, backend="llama.cpp", max_tokens=4,
                     chat_template="{% for m in messages %}{{ m['content'] }}\n{% endfor %}"
                     ) as stream:
        assert stream.session.capabilities.media == frozenset()
        history = [{"role": "user", "content": "Once upon a time"}]
        stream.prefill_messages(history)
        first = stream.text()
        kept = stream.session.history
        with pytest.raises(UnsupportedOperationError, match="takes no image input"):
            stream.prefill_messages([*history, {"role": "assistant", "content": first},
                                     IMAGE_MESSAGE])
        with pytest.raises(UnsupportedOperationError, match="does not take"):
            stream.prefill([1, 2, image_from_bytes(png()), 3])
        bad = {"role": "user", "content": [{"type": "image_url", "image_url": {
            "url": "data:image/png;base64,!!!"}}]}
        with pytest.raises((MediaError, UnsupportedOperationError)):
            stream.prefill_messages([*history, bad])
        assert stream.session.history == kept  # nothing reached the session
        stream.prefill_messages(history)  # still usable, and the same reply
        assert stream.text() == first


def test_asking_for_media_the_bundle_cannot_take_fails_before_any_load(tiny_bundle: Path
                                                                       ) -> None:
    with pytest.raises(UnsupportedOperationError, match="takes no image input on this bundle"):
        open_stream(tiny_bundle, backend="llama.cpp", media={"image"})


@pytest.mark.parametrize("backend", ["llama.cpp", "litert-lm", "mlx"])
def test_every_backend_refuses_media_it_cannot_take_and_keeps_its_turn(
        tiny_bundle: Path, backend: str) -> None:
    """A session without ``capabilities.media`` gets an UnsupportedOperationError from the core
    before any hook (the backend's own code never sees the item); its sequence is untouched."""
    with open_stream(tiny_bundle, backend=backend, max_tokens=3) as stream:
        assert stream.session.capabilities.media == frozenset()
        stream.prefill("Once upon a time")
        first = [t for step in stream for t in step.tokens]
        history = stream.session.history
        for item in (image_from_bytes(png()), audio_from_bytes(wav())):
            with pytest.raises(UnsupportedOperationError, match=f"is {item.kind} input"):
                stream.prefill([*history[:1], item, history[-1]])
            with pytest.raises(UnsupportedOperationError):
                stream.session.plan_prefill([history[0], item, history[-1]])
        assert stream.session.history == history
        stream.reset()
        stream.prefill("Once upon a time")
        assert [t for step in stream for t in step.tokens] == first
