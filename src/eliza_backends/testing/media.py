"""The kit's media area: images and audio as ``capabilities.media`` and ``Factory.media`` say,
refused in the core where the session takes none, part of the sequence where it does.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from ..backend.factory import Factory
from ..backend.session import Session
from ..errors import UnsupportedOperationError
from ..media import AUDIO_RATE, MEDIA_KINDS, MediaItem, audio_from_pcm, image_from_rgb
from .fixtures import KitFixtures


def sample_media() -> dict[str, MediaItem]:
    """A small image (64 x 48 gradient) and a 1 s tone, one per kind."""
    import numpy as np

    y, x = np.mgrid[0:48, 0:64]
    pixels = np.stack([x * 4, y * 5, (x + y) * 2], axis=-1).astype(np.uint8)
    t = np.arange(AUDIO_RATE) / AUDIO_RATE
    tone = (0.3 * np.sin(2 * np.pi * 440 * t)).astype(np.float32)
    return {"image": image_from_rgb(pixels), "audio": audio_from_pcm(tone, AUDIO_RATE)}


class MediaChecks(KitFixtures):
    """Media kinds declared honestly; refused before any hook, or part of the sequence."""

    def test_media_kinds_agree_with_the_factory(self, factory: Factory, bundle_dir: Path,
                                                session: Session) -> None:
        takes = session.capabilities.media
        assert takes <= MEDIA_KINDS, takes
        assert takes <= set(factory.media(bundle_dir)), (
            "the session takes media its factory's media() does not report (explain() and "
            "StreamConfig.media read media())")

    def test_media_the_session_does_not_take_is_refused(self, session: Session,
                                                        prompt: list[int]) -> None:
        refused = [i for k, i in sample_media().items() if k not in session.capabilities.media]
        if not refused:
            pytest.skip("the session takes every media kind")
        session.prefill(prompt)
        history = session.history
        for item in refused:
            with pytest.raises(UnsupportedOperationError):
                session.prefill([item, prompt[-1]])
        assert session.history == history and session.media == ()

    def test_media_it_takes_is_part_of_the_sequence(self, session: Session,
                                                    prompt: list[int]) -> None:
        taken = [i for k, i in sample_media().items() if k in session.capabilities.media]
        if not taken:
            pytest.skip("capabilities.media is empty")
        for item in taken:
            session.reset()
            plan = session.plan_prefill([*prompt, item, prompt[-1]])
            assert session.n_past == 0 and len(plan.spans) == 1  # nothing reached the cache
            session.prefill(plan)
            assert session.history == tuple(plan.ids)
            span = session.media[0]
            assert (span.kind, span.digest, span.start) == (item.kind, item.digest, len(prompt))
            first = list(session.next(1).tokens)
            assert first, "no token after a media prefill"
            assert session.reset_keep(span.start + 1) == span.start  # never inside an item
            assert session.media == ()
            session.reset()
            session.prefill(plan.tail(0))  # the same plan again: the same greedy token
            assert list(session.next(1).tokens) == first


__all__ = ["MediaChecks", "sample_media"]
