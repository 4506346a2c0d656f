"""The LiteRT-LM engine session's soft-token counts, computed as the engine computes them
(``eliza_litert.litert_lm_media.planned_soft_tokens``: the Gemma 4 image resize from the
container's patchify fields, the audio framing) instead of two probe conversations per item:

* on the tiny multimodal bundle (``examples/bundles/gemma4-mm-tiny-litert``), for images of
  many shapes and clips of many lengths, the computed count equals the engine's own (the
  probe, :func:`~eliza_litert.litert_lm_media.soft_token_count`, run here as the check);
* a media prefill on the engine session runs no probe (the probe is made to fail) and gives
  the span the engine fills;
* where the rule cannot say (a clip past the encoder's frames, a container without the
  patchify fields) the count comes from the probe.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import pytest

pytest.importorskip("litert_lm")

from eliza_backends import Stream, open_stream
from eliza_backends.media import audio_from_pcm, image_from_rgb

ROOT = Path(__file__).resolve().parent.parent
BUNDLE = ROOT / "examples" / "bundles" / "gemma4-mm-tiny-litert"
ENGINE: dict[str, Any] = {"backend": "litert-lm", "max_tokens": 4, "temperature": 0.0,
                          "context_size": 512, "threads": 1,
                          "options": {"litert-lm": {"session": "engine"}}}
#: (width, height): kept, both orientations, square, odd sizes, extreme aspect ratios (the
#: engine's one-row / one-column branch), larger than the budget
SHAPES = [(120, 84), (84, 120), (200, 50), (64, 64), (333, 97), (1000, 20), (20, 1000),
          (37, 41), (500, 499)]
#: samples at 16 kHz: shorter than a hop, around a hop and the subsampling steps, 1-8 s
LENGTHS = [100, 160, 639, 641, 1000, 8000, 16000, 16100, 21920, 52800, 130000]


@pytest.fixture(scope="module")
def stream() -> Any:
    with open_stream(BUNDLE, **ENGINE) as s:
        yield s


def _image(width: int, height: int) -> Any:
    rng = np.random.default_rng(width * 7919 + height)
    return image_from_rgb(rng.integers(0, 256, (height, width, 3), dtype=np.uint8))


def _clip(samples: int) -> Any:
    return audio_from_pcm((0.3 * np.sin(np.arange(samples) * 0.05)).astype(np.float32), 16000)


def _probe(stream: Stream, item: Any) -> int:
    from eliza_litert.litert_lm_media import media_bytes, soft_token_count

    session: Any = stream.session
    return soft_token_count(session._loaded.engine, session._sampler(session.config),
                            item.kind, media_bytes(item))


def test_the_container_carries_the_patchify_fields(stream: Stream) -> None:
    loaded = stream.session._loaded  # type: ignore[attr-defined]
    assert loaded.planned_counts and loaded.patchify == (4, 4, 630)


@pytest.mark.parametrize(("width", "height"), SHAPES)
def test_image_counts_equal_the_engines(stream: Stream, width: int, height: int) -> None:
    from eliza_litert.litert_lm_media import planned_soft_tokens

    item = _image(width, height)
    planned = planned_soft_tokens(item, (4, 4, 630))
    assert planned is not None and planned == _probe(stream, item)


@pytest.mark.parametrize("samples", LENGTHS)
def test_audio_counts_equal_the_engines(stream: Stream, samples: int) -> None:
    from eliza_litert.litert_lm_media import planned_soft_tokens

    item = _clip(samples)
    planned = planned_soft_tokens(item, None)
    assert planned is not None and planned == _probe(stream, item)


def test_a_media_prefill_runs_no_probe(stream: Stream, monkeypatch: pytest.MonkeyPatch) -> None:
    import eliza_litert.litert_lm_session as engine_session

    def no_probe(*args: Any) -> int:
        raise AssertionError("the count was probed")

    monkeypatch.setattr(engine_session, "soft_token_count", no_probe)
    stream.reset()
    stream.prefill_pieces(["<|turn>user\n", _image(120, 84), _clip(32000),
                           "What is it?<turn|>\n<|turn>model\n"])
    assert [(s.kind, s.length) for s in stream.session.media] == [("image", 72),
                                                                  ("audio", 52)]
    assert len([t for step in stream for t in step.tokens]) > 0  # the engine agreed


def test_past_the_rule_the_engine_is_asked() -> None:
    from eliza_litert import litert_lm_media as media

    assert media.audio_soft_tokens(media.AUDIO_HOP * (media.AUDIO_MAX_FRAMES + 1)) is None
    assert media.planned_soft_tokens(_image(120, 84), None) is None  # no patchify fields
    assert media.image_soft_tokens(120, 84, (4, 8, 630)) is None  # non-square patches


def test_the_oracles_audio_front_end_frames_as_the_engine_counts() -> None:
    """tools/litert_audio_frontend.py (the LiteRT-LM oracle's audio features) gives a clip the
    frames whose subsampling is the engine's soft-token count, at every length above."""
    import sys

    from eliza_litert.litert_lm_media import audio_soft_tokens

    sys.path.insert(0, str(ROOT / "tools"))
    import litert_audio_frontend

    for samples in LENGTHS:
        frames = len(litert_audio_frontend.log_mel(np.zeros(samples, np.float32)))
        assert (frames + 3) // 4 == audio_soft_tokens(samples), samples
