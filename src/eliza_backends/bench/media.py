"""``eliza-backends bench`` on a bundle that takes media: image and audio prefill time through
the seam, beside the runtime's own media path called directly where the backend offers one
(:meth:`~eliza_backends.backend.Factory.media_reference`: llama.cpp's is llama-cpp-python's
``mtmd_helper_eval_chunks``).

Per media kind, in the bench's worker process (the stream it measured text on, the same
files and threads for both sides), ``rounds`` interleaved rounds (seam first in even rounds,
the reference first in odd ones) of:

- seam: from the file's bytes: the decode and checks of :mod:`eliza_backends.media`, then
  ``Stream.prefill_pieces([prefix, item, suffix])`` into an empty sequence (the backend's
  preprocessing, encoder and the text model over the embeddings); then one step, for the
  time to the first token (a backend that runs its encoder lazily, as the LiteRT-LM engine
  does, spends it there);
- reference: the same prompt and file through the runtime's own API into an empty sequence.

Each side's wall time and this process's CPU time (every thread) are kept per round, with
the load average before and after: on a shared machine the CPU time is the steadier number.
The positions both sides took must agree (else the row says so).

The file of each kind: the one asked for (``--image`` / ``--audio``), else the first of the
bundle's ``media/`` folder, else a generated one (a 480x336 PNG gradient, a 1 s 16 kHz WAV
tone sweep), all kept byte-identical between runs.
"""

from __future__ import annotations

import io
import os
import statistics
import time
import wave
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ..backend import Factory, MediaReference
from ..media import MediaKind, audio_from_bytes, image_from_bytes, load_media_file
from ..stream import Stream

#: the text around the media item on both sides (BOS before the prefix)
MEDIA_PROMPT = ("Here: ", "\nWhat is it?")
#: the suffixes a file of each kind may have in a bundle's media/ folder
_SUFFIXES = {"image": (".png", ".jpg", ".jpeg", ".webp"), "audio": (".wav", ".mp3", ".flac")}


@dataclass(frozen=True)
class MediaSample:
    """One media file to measure: its kind, a name for the report, its bytes."""

    kind: str
    name: str
    data: bytes


def synthetic_image() -> bytes:
    """A 480x336 RGB gradient as PNG bytes (deterministic)."""
    import numpy as np
    from PIL import Image

    y, x = np.mgrid[0:336, 0:480]
    rgb = np.stack([x * 255 // 479, y * 255 // 335, (x + y) * 255 // 814], -1)
    out = io.BytesIO()
    Image.fromarray(rgb.astype(np.uint8), "RGB").save(out, format="PNG")
    return out.getvalue()


def synthetic_audio() -> bytes:
    """1 s of a 200-2000 Hz sweep, 16 kHz mono 16-bit WAV bytes (deterministic)."""
    import numpy as np

    t = np.arange(16000) / 16000.0
    pcm = 0.4 * np.sin(2 * np.pi * (200 * t + 900 * t * t))
    out = io.BytesIO()
    with wave.open(out, "wb") as w:
        w.setnchannels(1)
        w.setsampwidth(2)
        w.setframerate(16000)
        w.writeframes((pcm * 32767).astype("<i2").tobytes())
    return out.getvalue()


def media_samples(bundle: str, kinds: Iterable[str],
                  files: Mapping[str, str] | None = None) -> list[MediaSample]:
    """The file to measure for each of ``kinds`` (see the module docstring for the order)."""
    samples = []
    folder = Path(bundle, "media") if Path(bundle).is_dir() else None
    wanted = set(kinds)
    order: tuple[MediaKind, ...] = ("audio", "image")
    for kind in (k for k in order if k in wanted):
        path = (files or {}).get(kind)
        if path is None and folder is not None and folder.is_dir():
            found = sorted(p for p in folder.iterdir() if p.suffix.lower() in _SUFFIXES[kind])
            path = str(found[0]) if found else None
        if path is not None:
            load_media_file(path, kind)  # a bad file is a MediaError before any timing
            samples.append(MediaSample(kind, Path(path).name, Path(path).read_bytes()))
        else:
            data = synthetic_image() if kind == "image" else synthetic_audio()
            samples.append(MediaSample(kind, f"generated {kind}", data))
    return samples


def _timed(run: Callable[[], Any]) -> tuple[float, float, Any]:
    """(wall seconds, process CPU seconds, result) of ``run()``."""
    w0, c0 = time.perf_counter(), time.process_time()
    result = run()
    return time.perf_counter() - w0, time.process_time() - c0, result


def _seam_round(stream: Stream, sample: MediaSample) -> dict[str, float]:
    def prefill() -> int:
        item = (image_from_bytes(sample.data) if sample.kind == "image"
                else audio_from_bytes(sample.data))
        return stream.prefill_pieces([MEDIA_PROMPT[0], item, MEDIA_PROMPT[1]])

    stream.reset()
    wall, cpu, positions = _timed(prefill)
    step_wall, step_cpu, _ = _timed(lambda: stream.next(1))
    return {"wall_s": wall, "cpu_s": cpu, "first_token_s": wall + step_wall,
            "first_token_cpu_s": cpu + step_cpu, "positions": float(positions)}


def _reference_round(reference: MediaReference, sample: MediaSample) -> dict[str, float]:
    wall, cpu, positions = _timed(lambda: reference.prefill(
        sample.kind, sample.data, *MEDIA_PROMPT))
    return {"wall_s": wall, "cpu_s": cpu, "positions": float(positions)}


def measure_media(stream: Stream, factory: Factory, samples: Iterable[MediaSample],
                  rounds: int) -> dict[str, Any]:
    """Per sample kind: the rounds of each side (see the module docstring), the reference's
    name (None without one) and the load average around them."""
    reference = factory.media_reference(stream.session)
    out: dict[str, Any] = {}
    try:
        for sample in samples:
            _seam_round(stream, sample)  # warm-up: the encoder's first run, caches
            if reference is not None:
                _reference_round(reference, sample)
            seam, ref = [], []
            load = [os.getloadavg()[0]]
            for r in range(rounds):
                first_ref = reference is not None and r % 2 == 1
                if first_ref:
                    ref.append(_reference_round(reference, sample))  # type: ignore[arg-type]
                seam.append(_seam_round(stream, sample))
                if reference is not None and not first_ref:
                    ref.append(_reference_round(reference, sample))
            load.append(os.getloadavg()[0])
            out[sample.kind] = {"file": sample.name, "seam": seam, "reference": ref,
                                "reference_name": reference.name if reference else None,
                                "load": load}
    finally:
        stream.reset()
        if reference is not None:
            reference.close()
    return out


def media_summary(runs: Iterable[Mapping[str, Any]]) -> dict[str, dict[str, Any]]:
    """Per kind over every run's rounds: median seam / reference wall and CPU seconds, the
    median of the per-round ratios seam / reference (wall and CPU), the load range, and
    whether the positions agreed."""
    by_kind: dict[str, list[Mapping[str, Any]]] = {}
    for run in runs:
        for kind, got in (run.get("media") or {}).items():
            by_kind.setdefault(kind, []).append(got)
    summary: dict[str, dict[str, Any]] = {}
    for kind, got in by_kind.items():
        seam = [r for g in got for r in g["seam"]]
        pairs = [p for g in got for p in zip(g["seam"], g["reference"], strict=False)]
        row: dict[str, Any] = {
            "file": got[0]["file"], "reference": got[0]["reference_name"],
            "seam_wall_s": statistics.median(r["wall_s"] for r in seam),
            "seam_cpu_s": statistics.median(r["cpu_s"] for r in seam),
            "first_token_s": statistics.median(r["first_token_s"] for r in seam),
            "positions": int(seam[0]["positions"]),
            "load": [min(v for g in got for v in g["load"]),
                     max(v for g in got for v in g["load"])]}
        if pairs:
            row.update({
                "reference_wall_s": statistics.median(r["wall_s"] for _, r in pairs),
                "reference_cpu_s": statistics.median(r["cpu_s"] for _, r in pairs),
                "ratio_wall": statistics.median(s["wall_s"] / r["wall_s"] for s, r in pairs),
                "ratio_cpu": statistics.median(s["cpu_s"] / max(r["cpu_s"], 1e-9)
                                               for s, r in pairs),
                "positions_agree": all(s["positions"] == r["positions"] for s, r in pairs)})
        summary[kind] = row
    return summary


__all__ = ["MEDIA_PROMPT", "MediaSample", "measure_media", "media_samples", "media_summary",
           "synthetic_audio", "synthetic_image"]
