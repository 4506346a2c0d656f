"""``--verify`` of a multimodal source (Gemma 4 with vision / audio towers): an image prompt and
an audio prompt through every model artifact (``open_stream`` + ``prefill_messages`` with
OpenAI content parts) against transformers float32 on the source folder.

The test media are drawn by formula (no file ships): a 480x336 RGB image (both sides multiples
of 48 px, 70 soft tokens at patch 16 / pooling 3: transformers and llama.cpp keep it at its
size) and 1 s of a 16 kHz sweep. The reference renders the folder's chat template, expands each
media placeholder to begin marker + soft tokens + end marker (Gemma4Processor's rule) and
decodes greedily by full recompute (``generate()`` keeps the model's end ids), with the image
block bidirectional on sliding layers (transformers' own Gemma 4 mask, ``mm_token_type_ids``).
"""

from __future__ import annotations

import base64
import io
import json
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


def _reference(source: Path, kind: str, data: Any) -> dict[str, Any]:
    """transformers float32: the prompt ids and ``N_MEDIA_TOKENS`` greedy ids."""
    import torch
    from transformers import AutoTokenizer, Gemma4ForConditionalGeneration
    from transformers.models.gemma4 import Gemma4AudioFeatureExtractor, Gemma4ImageProcessorPil

    model = Gemma4ForConditionalGeneration.from_pretrained(str(source), dtype=torch.float32)
    model.eval()
    tok = AutoTokenizer.from_pretrained(str(source))
    cfg = model.config
    proc = json.loads((source / "processor_config.json").read_text(encoding="utf-8"))
    messages = [{"role": "user", "content": [{"type": kind},
                                             {"type": "text", "text": QUESTIONS[kind]}]}]
    rendered = tok.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)
    with torch.no_grad():
        if kind == "image":
            from PIL import Image

            ip = Gemma4ImageProcessorPil(**{k: v for k, v in proc["image_processor"].items()
                                            if k != "image_processor_type"})
            x = ip(images=[Image.fromarray(data)], return_tensors="pt")
            inputs = {"pixel_values": x["pixel_values"],
                      "image_position_ids": x["image_position_ids"]}
            n, soft, begin, end = (int(x["num_soft_tokens_per_image"][0]), cfg.image_token_id,
                                   cfg.boi_token_id, cfg.eoi_token_id)
        else:
            fe = Gemma4AudioFeatureExtractor(**{k: v for k, v in proc.get(
                "feature_extractor", {}).items() if k != "feature_extractor_type"})
            x = fe([data], sampling_rate=16000, return_tensors="pt")
            inputs = {"input_features": x["input_features"],
                      "input_features_mask": x["input_features_mask"]}
            enc = model.model.get_audio_features(x["input_features"], x["input_features_mask"])
            n, soft, begin, end = (int(enc.attention_mask[0].sum()), cfg.audio_token_id,
                                   cfg.boa_token_id, cfg.eoa_token_index)
        mark = tok.convert_ids_to_tokens(soft)
        text = rendered.replace(mark, tok.convert_ids_to_tokens(begin) + mark * n
                                + tok.convert_ids_to_tokens(end), 1)
        ids = tok(text, add_special_tokens=False).input_ids
        cur, out = list(ids), []
        for _ in range(N_MEDIA_TOKENS):
            t = torch.tensor([cur])
            types = torch.where(t == cfg.image_token_id, 1, torch.where(
                t == cfg.audio_token_id, 3, 0))
            logits = model(input_ids=t, mm_token_type_ids=types, **inputs).logits[0, -1]
            out.append(int(logits.argmax()))
            cur.append(out[-1])
    return {"ids": ids, "reference_ids": out}


def verify_media(root: Path, source: Path, kinds: tuple[str, ...],
                 runs: list[tuple[str, str, dict[str, Any]]], *,
                 log: Callable[[str], None] = print,
                 threads: int | None = None) -> dict[str, Any]:
    """Each media kind's prompt through every (label, backend, options) run of the bundle at
    ``root``: greedy ids equal to the reference's; a run that takes no media says so."""
    from ..stream import open_stream

    data = {"image": test_image(), "audio": test_audio()}
    out: dict[str, Any] = {"n_tokens": N_MEDIA_TOKENS, "prompts": {}, "artifacts": {}}
    for kind in kinds:
        t0 = time.monotonic()
        out["prompts"][kind] = _reference(source, kind, data[kind])
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


__all__ = ["N_MEDIA_TOKENS", "test_audio", "test_image", "verify_media"]
