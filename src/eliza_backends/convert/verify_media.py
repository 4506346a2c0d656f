"""``--verify`` of a multimodal source (Gemma 4 with vision / audio towers, Gemma 4 Unified):
an image prompt and an audio prompt through every model artifact (``open_stream`` +
``prefill_messages`` with OpenAI content parts) against transformers float32 on the source
folder (the family's ``media_reference``).

The test media are drawn by formula (no file ships): a 480x336 RGB image (both sides multiples
of 48 px, 70 soft tokens at patch 16 / pooling 3: transformers and llama.cpp keep it at its
size) and 1 s of a 16 kHz sweep.
"""

from __future__ import annotations

import base64
import io
import math
import time
import wave
from collections.abc import Callable
from pathlib import Path
from typing import Any

N_MEDIA_TOKENS = 24
QUESTIONS = {"image": "Describe this image.", "audio": "What do you hear?"}


def test_image() -> Any:
    """480x336 RGB uint8: red / green steps and a blue checkerboard of 48-px squares."""
    import numpy as np

    y, x = np.mgrid[0:336, 0:480]
    return np.stack([x * 16 // 480 * 17, y * 12 // 336 * 21,
                     np.where((x // 48 + y // 48) % 2 == 1, 220, 30)], -1).astype(np.uint8)


def test_audio() -> Any:
    """1 s of 16-bit-exact 16 kHz PCM: a 300-800 Hz sweep (float32, int16 / 32768)."""
    import numpy as np

    t = np.arange(16000) / 16000
    wave_ = 0.5 * np.sin(2 * math.pi * (300 * t + 250 * t * t))
    return (np.round(wave_ * 32767).astype(np.int16) / 32768.0).astype(np.float32)


def _part(kind: str, data: Any) -> dict[str, Any]:
    """The OpenAI content part a client sends for ``data``."""
    buf = io.BytesIO()
    if kind == "image":
        from PIL import Image

        Image.fromarray(data).save(buf, format="PNG")
        return {"type": "image_url", "image_url": {
            "url": "data:image/png;base64," + base64.b64encode(buf.getvalue()).decode()}}
    import numpy as np

    with wave.open(buf, "wb") as w:
        w.setnchannels(1)
        w.setsampwidth(2)
        w.setframerate(16000)
        w.writeframes((np.asarray(data) * 32768).astype("<i2").tobytes())
    return {"type": "input_audio", "input_audio": {
        "data": base64.b64encode(buf.getvalue()).decode(), "format": "wav"}}


#: ``reference(source, kind, data, question, n_tokens)`` -> {"ids": the prompt ids,
#: "reference_ids": n greedy ids}: transformers float32 on the source folder (the family's
#: ``media_reference``)
MediaReference = Callable[[Path, str, Any, str, int], dict[str, Any]]


def verify_media(root: Path, source: Path, kinds: tuple[str, ...],
                 runs: list[tuple[str, str, dict[str, Any]]], reference: MediaReference, *,
                 log: Callable[[str], None] = print,
                 threads: int | None = None) -> dict[str, Any]:
    """Each media kind's prompt through every (label, backend, options) run of the bundle at
    ``root``: greedy ids equal to ``reference``'s; a run that takes no media says so."""
    from ..stream import open_stream

    data = {"image": test_image(), "audio": test_audio()}
    out: dict[str, Any] = {"n_tokens": N_MEDIA_TOKENS, "prompts": {}, "artifacts": {}}
    for kind in kinds:
        t0 = time.monotonic()
        out["prompts"][kind] = reference(source, kind, data[kind], QUESTIONS[kind],
                                         N_MEDIA_TOKENS)
        log(f"verify: {kind} reference in {time.monotonic() - t0:.1f}s")
    for label, backend, options in runs:
        res: dict[str, Any] = {}
        try:
            with open_stream(root, backend=backend, options=options,
                             max_tokens=N_MEDIA_TOKENS, temperature=0.0, ignore_eos=True,
                             context_size=1024, threads=threads) as stream:
                taken = stream.session.capabilities.media
                for kind in kinds:
                    if kind not in taken:
                        res[kind] = {"skipped": f"{backend} takes no {kind} here"}
                        continue
                    stream.reset()
                    stream.prefill_messages([{"role": "user", "content": [
                        _part(kind, data[kind]), {"type": "text", "text": QUESTIONS[kind]}]}])
                    got = [t for step in stream for t in step.tokens]
                    want = out["prompts"][kind]["reference_ids"]
                    res[kind] = {"greedy_agree": sum(a == b for a, b in zip(got, want,
                                                                            strict=False)),
                                 "compared": len(want), "ids": got,
                                 "prompt_ids_equal": list(stream.session.history[
                                     :len(out["prompts"][kind]["ids"])])
                                 == out["prompts"][kind]["ids"]}
        except Exception as exc:  # one artifact failing must not hide the others' results
            res = {"error": f"{type(exc).__name__}: {exc}"}
        out["artifacts"][label] = res
        if "error" in res:
            log(f"verify media: {label}: ERROR {res['error']}")
            continue
        log(f"verify media: {label}: " + ", ".join(
            f"{k} {v['greedy_agree']}/{v['compared']}" if "greedy_agree" in v else
            f"{k}: {v['skipped']}" for k, v in res.items()))
    return out


__all__ = ["N_MEDIA_TOKENS", "QUESTIONS", "MediaReference", "test_audio", "test_image",
           "verify_media"]
