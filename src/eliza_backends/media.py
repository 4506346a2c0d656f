"""Media input: images and audio decoded and validated once, the same way for every backend.

A backend never parses a file: it receives a :class:`MediaItem`, already decoded and checked,
holding RGB pixels (an image) or 16 kHz mono float PCM (audio). Everything that can be wrong
with media is found here, before any session or native call, and raised as
:class:`~eliza_backends.errors.MediaError` (``ELIZA_ERR_INVALID_ARG``; HTTP 400 in the server):

* an image that is corrupt, truncated or not PNG / JPEG / WebP;
* a decompression bomb: the pixel count in the image's *header* is checked against
  :attr:`MediaLimits.max_pixels` before a single pixel is decoded;
* audio that is not WAV (16/24/32-bit or 8-bit PCM, any channel count), MP3 or FLAC (MP3 and
  FLAC through the ``miniaudio`` package), longer than :attr:`MediaLimits.max_audio_seconds`
  (checked from the header), at a sample rate outside 8-192 kHz, or holding NaN / infinity;
* a data URI that is not base64, more encoded bytes than :attr:`MediaLimits.max_bytes`;
* a URL: nothing is ever fetched from the network; a local file (a path or ``file://``) is
  read only when :attr:`MediaLimits.allow_files` says so.

Audio is resampled to 16 kHz (:data:`AUDIO_RATE`) with a band-limited (FFT) resampler and
mixed down to mono. Pillow, numpy and miniaudio are imported on first use
(``pip install 'eliza-backends[media]'``).

Every function here is pure and thread-safe; a :class:`MediaItem` is immutable (its arrays are
read-only) and may be shared between threads and sessions.
"""

from __future__ import annotations

import binascii
import io
import os
import re
import struct
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal

from .errors import InvalidArgumentError, MediaError

if TYPE_CHECKING:
    import numpy as np

MediaKind = Literal["image", "audio"]
#: The media kinds the contract knows.
MEDIA_KINDS: frozenset[str] = frozenset({"image", "audio"})
#: The sample rate every audio item is resampled to, in Hz (what Gemma 4's and most speech
#: encoders take).
AUDIO_RATE = 16_000
#: The sample rates audio may arrive at, in Hz (others are refused, not guessed at).
MIN_RATE, MAX_RATE = 8_000, 192_000
#: The image formats decoded (Pillow's names).
IMAGE_FORMATS = ("PNG", "JPEG", "WEBP")
#: The audio formats decoded (``input_audio.format`` values).
AUDIO_FORMATS = ("wav", "mp3", "flac")
_INSTALL = "pip install 'eliza-backends[media]'"


@dataclass(frozen=True)
class MediaLimits:
    """What media this process accepts. ``max_bytes``: encoded size of one item;
    ``max_pixels``: width x height of an image (from its header, before decoding);
    ``max_audio_seconds``: one clip's duration; ``allow_files``: read local files named by a
    path or ``file://`` URL in a content part (off: such a part is refused). Nothing is ever
    fetched from the network."""

    max_bytes: int = 32 << 20
    max_pixels: int = 40_000_000
    max_audio_seconds: float = 30.0
    allow_files: bool = False


DEFAULT_LIMITS = MediaLimits()


@dataclass(frozen=True, eq=False)
class MediaItem:
    """One decoded image or audio clip.

    ``kind``: ``"image"`` or ``"audio"``. ``data``: for an image, numpy ``uint8`` of shape
    ``(height, width, 3)`` (RGB, C-contiguous); for audio, numpy ``float32`` of shape ``(n,)``
    (mono PCM at :data:`AUDIO_RATE`, nominally in [-1, 1]); read-only either way.
    ``digest``: sha256 (hex) of the kind, shape and decoded content: the identity a prefix
    cache compares (two encodings of the same pixels share it; two images never do).
    ``source``: where it came from (``"png"``, ``"wav"``, ``"rgb"``, ...), for messages.
    Equal items have equal digests.
    """

    kind: MediaKind
    data: Any
    digest: str
    source: str = ""

    @property
    def width(self) -> int:
        """Image width in pixels (0 for audio)."""
        return int(self.data.shape[1]) if self.kind == "image" else 0

    @property
    def height(self) -> int:
        """Image height in pixels (0 for audio)."""
        return int(self.data.shape[0]) if self.kind == "image" else 0

    @property
    def seconds(self) -> float:
        """Audio duration in seconds (0.0 for an image)."""
        return len(self.data) / AUDIO_RATE if self.kind == "audio" else 0.0

    def __eq__(self, other: object) -> bool:
        return isinstance(other, MediaItem) and (self.kind, self.digest) == (
            other.kind, other.digest)

    def __hash__(self) -> int:
        return hash((self.kind, self.digest))

    def __repr__(self) -> str:
        size = f"{self.width}x{self.height}" if self.kind == "image" else f"{self.seconds:.2f}s"
        return f"<MediaItem {self.kind} {self.source} {size} {self.digest[:12]}>"


def _numpy() -> Any:
    try:
        import numpy
    except ImportError:  # pragma: no cover - numpy comes with every backend
        raise MediaError(f"media input needs numpy: {_INSTALL}") from None
    return numpy


def _make(kind: MediaKind, array: np.ndarray, source: str) -> MediaItem:
    array = _numpy().ascontiguousarray(array)
    array.setflags(write=False)
    import hashlib  # media paths only: opening a stream does not pay for OpenSSL's start-up

    h = hashlib.sha256(f"{kind}:{array.dtype.str}:{array.shape}:".encode())
    h.update(array.data)  # (C-contiguous: hashed in place, no copy)
    return MediaItem(kind, array, h.hexdigest(), source)


# ------------------------------------------------------------------------------ images

def image_from_bytes(data: bytes, limits: MediaLimits = DEFAULT_LIMITS) -> MediaItem:
    """Decode a PNG, JPEG or WebP image to RGB. The pixel budget is checked from the header
    before any pixel is decoded; corrupt, truncated or other data raise :class:`MediaError`."""
    _check_bytes(data, limits, "image")
    try:
        from PIL import Image, UnidentifiedImageError
    except ImportError:
        raise MediaError(f"image input needs Pillow: {_INSTALL}") from None
    try:
        with Image.open(io.BytesIO(data), formats=IMAGE_FORMATS) as im:
            width, height = im.size
            _check_pixels(width, height, limits)
            fmt = (im.format or "").lower()
            im.load()  # decodes; a truncated file fails here
            pixels = _numpy().asarray(im if im.mode == "RGB" else im.convert("RGB"),
                                      dtype="uint8")
    except UnidentifiedImageError:
        raise MediaError(
            f"the image data is not a {' / '.join(IMAGE_FORMATS)} image (or it is damaged); "
            "send one of those formats") from None
    except MediaError:
        raise
    except Image.DecompressionBombError:  # Pillow's own header check, past twice its limit
        raise MediaError(f"the image's header claims far more than the {limits.max_pixels} "
                         "pixels allowed (a decompression bomb); it was not decoded") from None
    except (OSError, SyntaxError, ValueError, EOFError, MemoryError) as exc:
        raise MediaError(f"the image is corrupt or truncated and cannot be decoded ({exc}); "
                         "send the whole file") from None
    return _make("image", pixels, fmt)


def image_from_rgb(pixels: Any, limits: MediaLimits = DEFAULT_LIMITS) -> MediaItem:
    """An image from an RGB array (``uint8``, shape ``(height, width, 3)``), copied."""
    np_ = _numpy()
    array = np_.asarray(pixels)
    if array.ndim != 3 or array.shape[2] != 3 or array.dtype != np_.uint8:
        raise MediaError(f"an RGB image is a uint8 array of shape (height, width, 3), got "
                         f"{array.dtype} {array.shape}")
    _check_pixels(array.shape[1], array.shape[0], limits)
    return _make("image", array.copy(), "rgb")


def _check_pixels(width: int, height: int, limits: MediaLimits) -> None:
    if width < 1 or height < 1:
        raise MediaError(f"the image is {width}x{height} pixels: it has no pixels to look at")
    if width * height > limits.max_pixels:
        raise MediaError(
            f"the image is {width}x{height} = {width * height} pixels, more than the "
            f"{limits.max_pixels} allowed (a decompression bomb, or a photo to downscale "
            "first); it was not decoded")


# ------------------------------------------------------------------------------ audio

def audio_from_bytes(data: bytes, fmt: str | None = None,
                     limits: MediaLimits = DEFAULT_LIMITS) -> MediaItem:
    """Decode a WAV, MP3 or FLAC clip (``fmt``; None: sniffed from the bytes) to 16 kHz mono.
    The duration is checked from the header before the samples are decoded."""
    _check_bytes(data, limits, "audio")
    fmt = (fmt or _sniff_audio(data)).lower().lstrip(".")
    if fmt == "wav":
        samples, rate = _read_wav(data, limits)
    elif fmt in ("mp3", "flac"):
        samples, rate = _read_compressed(data, fmt, limits)
    else:
        raise MediaError(f"audio format {fmt!r} is not supported: send "
                         f"{', '.join(AUDIO_FORMATS)}")
    return audio_from_pcm(samples, rate, limits, source=fmt)


def audio_from_pcm(samples: Any, rate: int, limits: MediaLimits = DEFAULT_LIMITS, *,
                   source: str = "pcm") -> MediaItem:
    """An audio item from PCM ``samples`` at ``rate`` Hz: float in [-1, 1] or int16, shape
    ``(n,)`` or ``(n, channels)`` (mixed down to mono), resampled to :data:`AUDIO_RATE`."""
    np_ = _numpy()
    _check_rate(rate)
    array = np_.asarray(samples)
    if array.dtype == np_.int16:
        array = array.astype(np_.float32) / 32768.0
    if array.dtype.kind != "f" or array.ndim not in (1, 2):
        raise MediaError(f"PCM samples are float (or int16) of shape (n,) or (n, channels), "
                         f"got {array.dtype} {array.shape}")
    if array.ndim == 2:
        array = array.mean(axis=1)
    if len(array) == 0:
        raise MediaError("the audio clip holds no samples")
    _check_seconds(len(array), rate, limits)
    array = array.astype(np_.float32)
    if not np_.isfinite(array).all():
        raise MediaError("the audio samples hold NaN or infinity")
    return _make("audio", resample(array, rate), source)


def resample(samples: np.ndarray, rate: int) -> np.ndarray:
    """Band-limited resampling of mono float PCM from ``rate`` Hz to :data:`AUDIO_RATE` (an
    FFT: frequencies above the lower Nyquist limit are dropped, none are aliased)."""
    np_ = _numpy()
    if rate == AUDIO_RATE:
        return samples.astype(np_.float32)
    n_out = max(1, round(len(samples) * AUDIO_RATE / rate))
    spectrum = np_.fft.rfft(samples.astype(np_.float64))
    keep = n_out // 2 + 1
    if keep <= len(spectrum):
        spectrum = spectrum[:keep]
    else:
        spectrum = np_.concatenate([spectrum, np_.zeros(keep - len(spectrum), spectrum.dtype)])
    out = np_.fft.irfft(spectrum, n_out) * (n_out / len(samples))
    resampled: np.ndarray = out.astype(np_.float32)
    return resampled


def _check_rate(rate: object) -> None:
    if isinstance(rate, bool) or not isinstance(rate, int) or not MIN_RATE <= rate <= MAX_RATE:
        raise MediaError(f"audio at {rate!r} Hz cannot be resampled to {AUDIO_RATE} Hz: the "
                         f"rate must be an int in {MIN_RATE}..{MAX_RATE} Hz")


def _check_seconds(frames: int, rate: int, limits: MediaLimits) -> None:
    seconds = frames / rate
    if seconds > limits.max_audio_seconds:
        raise MediaError(f"the audio clip is {seconds:.1f} s long, more than the "
                         f"{limits.max_audio_seconds:g} s allowed; cut it into shorter clips")


def _sniff_audio(data: bytes) -> str:
    if data[:4] == b"RIFF" and data[8:12] == b"WAVE":
        return "wav"
    if data[:4] == b"fLaC":
        return "flac"
    if data[:3] == b"ID3" or (len(data) > 1 and data[0] == 0xFF and data[1] & 0xE0 == 0xE0):
        return "mp3"
    raise MediaError(f"the audio data is not {', '.join(AUDIO_FORMATS)} (or it is damaged)")


_WAV_DTYPES = {1: "u1", 2: "<i2", 4: "<i4"}


def _read_wav(data: bytes, limits: MediaLimits) -> tuple[np.ndarray, int]:
    """PCM WAV (8, 16, 24 or 32-bit integer samples) to float32 frames and the rate."""
    import wave

    np_ = _numpy()
    try:
        with wave.open(io.BytesIO(data), "rb") as w:
            channels, width, rate, frames = (w.getnchannels(), w.getsampwidth(),
                                             w.getframerate(), w.getnframes())
            _check_rate(rate)
            _check_seconds(frames, rate, limits)
            raw = w.readframes(frames)
    except (wave.Error, EOFError, struct.error) as exc:
        raise MediaError(f"the WAV data cannot be read ({exc}); send 8/16/24/32-bit integer "
                         "PCM WAV, or MP3 / FLAC") from None
    if channels < 1 or width not in (1, 2, 3, 4):
        raise MediaError(f"WAV with {channels} channels of {8 * width}-bit samples is not "
                         "supported: send 8/16/24/32-bit integer PCM")
    n = len(raw) // (channels * width)
    if n < frames or n == 0:
        raise MediaError(f"the WAV data is truncated: its header says {frames} frames, it "
                         f"holds {n}; send the whole file")
    raw = raw[:n * channels * width]
    if width == 3:  # 24-bit: widen to 32 by hand (numpy has no int24)
        b = np_.frombuffer(raw, dtype=np_.uint8).reshape(-1, 3)
        ints = (b[:, 0].astype(np_.int32) | (b[:, 1].astype(np_.int32) << 8)
                | (b[:, 2].astype(np_.int8).astype(np_.int32) << 16))
        samples = ints.astype(np_.float32) / float(1 << 23)
    else:
        ints = np_.frombuffer(raw, dtype=_WAV_DTYPES[width])
        if width == 1:
            samples = (ints.astype(np_.float32) - 128.0) / 128.0
        else:
            samples = ints.astype(np_.float32) / float(1 << (8 * width - 1))
    return samples.reshape(n, channels), rate


def _read_compressed(data: bytes, fmt: str, limits: MediaLimits) -> tuple[np.ndarray, int]:
    """MP3 or FLAC through miniaudio, at the file's own rate (resampled by :func:`resample`)."""
    np_ = _numpy()
    try:
        import miniaudio  # type: ignore[import-untyped]
    except ImportError:
        raise MediaError(f"{fmt.upper()} audio needs the miniaudio package ({_INSTALL}); WAV "
                         "works without it") from None
    try:
        info = (miniaudio.mp3_get_info if fmt == "mp3" else miniaudio.flac_get_info)(data)
        _check_rate(info.sample_rate)
        _check_seconds(info.num_frames, info.sample_rate, limits)
        decoded = miniaudio.decode(data, output_format=miniaudio.SampleFormat.FLOAT32,
                                   nchannels=1, sample_rate=info.sample_rate)
    except miniaudio.MiniaudioError as exc:
        raise MediaError(f"the {fmt.upper()} data cannot be decoded ({exc}); send the whole "
                         "file, or WAV") from None
    samples = np_.asarray(decoded.samples, dtype=np_.float32)  # an array.array("f")
    return samples.reshape(-1, 1), int(info.sample_rate)


# ------------------------------------------------------------------------------ sources

def _check_bytes(data: object, limits: MediaLimits, what: str) -> None:
    if not isinstance(data, (bytes, bytearray, memoryview)):
        raise MediaError(f"{what} data must be bytes, got {type(data).__name__}")
    if len(data) == 0:
        raise MediaError(f"the {what} data is empty: send the whole file's bytes")
    if len(data) > limits.max_bytes:
        raise MediaError(f"the {what} is {len(data)} bytes, more than the {limits.max_bytes} "
                         "allowed")


def decode_base64(text: str, limits: MediaLimits, what: str) -> bytes:
    """Strict base64 (whitespace ignored) to bytes, size-checked before decoding."""
    if not isinstance(text, str):
        raise MediaError(f"{what}: base64 data must be a string, got {type(text).__name__}")
    compact = re.sub(r"\s+", "", text)
    if len(compact) * 3 // 4 > limits.max_bytes:
        raise MediaError(f"{what} is about {len(compact) * 3 // 4} bytes, more than the "
                         f"{limits.max_bytes} allowed")
    import base64

    try:
        return base64.b64decode(compact, validate=True)
    except (binascii.Error, ValueError):
        raise MediaError(f"{what} is not valid base64; encode the file's bytes with "
                         "standard base64") from None


_DATA_URI = re.compile(r"data:(?P<mime>[^;,]*)(?P<params>(?:;[^;,]*)*),(?P<data>.*)", re.S)
_FILE_SUFFIXES: dict[str, MediaKind] = {
    ".png": "image", ".jpg": "image", ".jpeg": "image", ".webp": "image",
    ".wav": "audio", ".mp3": "audio", ".flac": "audio"}


def image_from_url(url: str, limits: MediaLimits = DEFAULT_LIMITS) -> MediaItem:
    """An ``image_url``'s ``url``: a base64 data URI, or a local file when
    ``limits.allow_files``; http(s) and every other scheme are refused (no network fetch)."""
    if not isinstance(url, str) or not url:
        raise MediaError("image_url.url must be a non-empty string (a data: URI)")
    match = _DATA_URI.fullmatch(url) if url.startswith("data:") else None
    if match is not None:
        if ";base64" not in match["params"]:
            raise MediaError("the image data URI is not base64: write "
                             "data:image/png;base64,<data>")
        if match["mime"] and not match["mime"].startswith("image/"):
            raise MediaError(f"the image_url data URI says {match['mime']!r}, not an image")
        return image_from_bytes(decode_base64(match["data"], limits, "the image data URI"),
                                limits)
    if url.startswith("data:"):
        raise MediaError("the image data URI is malformed: write data:image/png;base64,<data>")
    if re.match(r"[a-zA-Z][a-zA-Z0-9+.-]+://", url) and not url.startswith("file://"):
        raise MediaError("remote image URLs are not fetched (no network access): send the "
                         "image inline as data:image/png;base64,<data>")
    return _local_file(url, limits, "image")


def _local_file(url: str, limits: MediaLimits, kind: MediaKind) -> MediaItem:
    if not limits.allow_files:
        raise MediaError(f"local {kind} files are not read unless allowed (serve "
                         "--allow-media-files, or MediaLimits(allow_files=True)); send the "
                         f"{kind} inline as base64")
    path = url[len("file://"):] if url.startswith("file://") else url
    return load_media_file(path, kind, limits)


def load_media_file(path: str | os.PathLike[str], kind: MediaKind | None = None,
                    limits: MediaLimits = DEFAULT_LIMITS) -> MediaItem:
    """Read and decode a local image or audio file (``kind``: None guesses it from the
    suffix). The caller decides the path may be read (this ignores ``allow_files``)."""
    p = Path(path)
    guessed = _FILE_SUFFIXES.get(p.suffix.lower())
    kind = kind or guessed
    if kind is None:
        raise MediaError(f"{p}: cannot tell image from audio by its suffix; use "
                         f"{', '.join(sorted(_FILE_SUFFIXES))}")
    try:
        if not p.is_file():
            raise MediaError(f"{p} is not a file")
        if p.stat().st_size > limits.max_bytes:
            raise MediaError(f"{p} is {p.stat().st_size} bytes, more than the "
                             f"{limits.max_bytes} allowed")
        data = p.read_bytes()
    except OSError as exc:
        raise MediaError(f"cannot read {p}: {exc.strerror or exc}") from None
    if kind == "image":
        return image_from_bytes(data, limits)
    fmt = p.suffix.lower().lstrip(".") if guessed == "audio" else None
    return audio_from_bytes(data, fmt, limits)


_MIME = {"png": "image/png", "jpeg": "image/jpeg", "webp": "image/webp"}


def part_from_file(path: str | os.PathLike[str], kind: MediaKind | None = None,
                   limits: MediaLimits = DEFAULT_LIMITS) -> dict[str, Any]:
    """The OpenAI content part of a local image or audio file (a base64 data URI /
    ``input_audio``), decoded once first so a bad file is a :class:`MediaError` here."""
    import base64

    item = load_media_file(path, kind, limits)
    data = base64.b64encode(Path(path).read_bytes()).decode("ascii")
    if item.kind == "image":
        url = f"data:{_MIME.get(item.source, 'image/png')};base64,{data}"
        return {"type": "image_url", "image_url": {"url": url}}
    return {"type": "input_audio", "input_audio": {"data": data, "format": item.source}}


def media_from_part(part: Mapping[str, Any],
                    limits: MediaLimits = DEFAULT_LIMITS) -> MediaItem | None:
    """An OpenAI content part as a :class:`MediaItem`; None for a ``text`` part.

    ``{"type": "image_url", "image_url": {"url": "data:image/png;base64,..."}}`` (or the url as
    a plain string), ``{"type": "input_audio", "input_audio": {"data": B64, "format": "wav"}}``.
    Another type is an :class:`InvalidArgumentError`; bad media a :class:`MediaError`."""
    if not isinstance(part, Mapping):
        raise InvalidArgumentError(f"a content part must be an object, got "
                                   f"{type(part).__name__}")
    kind = part.get("type")
    if kind == "text":
        return None
    if kind == "image_url":
        spec = part.get("image_url")
        url = spec.get("url") if isinstance(spec, Mapping) else spec
        return image_from_url(url, limits)  # type: ignore[arg-type]
    if kind == "input_audio":
        spec = part.get("input_audio")
        if not isinstance(spec, Mapping) or "data" not in spec:
            raise MediaError('input_audio must be {"data": <base64>, "format": "wav"}')
        fmt = spec.get("format")
        if fmt is not None and (not isinstance(fmt, str) or fmt.lower() not in AUDIO_FORMATS):
            raise MediaError(f"input_audio.format {fmt!r} is not supported: use "
                             f"{', '.join(AUDIO_FORMATS)}")
        data = decode_base64(spec["data"], limits, "input_audio.data")
        return audio_from_bytes(data, fmt, limits)
    raise InvalidArgumentError(f"content part type {kind!r} is not supported: use text, "
                               "image_url or input_audio")


__all__ = ["AUDIO_FORMATS", "AUDIO_RATE", "DEFAULT_LIMITS", "IMAGE_FORMATS", "MEDIA_KINDS",
           "MediaItem", "MediaKind", "MediaLimits", "audio_from_bytes", "audio_from_pcm",
           "decode_base64", "image_from_bytes", "image_from_rgb", "image_from_url",
           "load_media_file", "media_from_part", "part_from_file", "resample"]
