"""Images and audio on llama.cpp through libmtmd, on the tiny multimodal Gemma 4
(``examples/bundles/gemma4-mm-tiny``: the text GGUF, the gemma4v + gemma4a projector, and the
torch oracle in parity.json).

* every oracle prompt (text, image, audio, image + audio, a second turn after an image): the
  chat renderer's ids equal the oracle's and the 24 greedy tokens equal its continuation;
* the projected media embeddings agree with the oracle's (cosine >= 0.999);
* prefix reuse with an image in the history prefills only the new turn; two images with the
  same placeholder ids never share cache; slots keep the media; reset_keep never cuts an item;
* bad media on a media-capable session: a typed error before any native call, the session
  keeps its conversation; an image past the micro-batch is refused;
* concurrent media requests on a batched context (``parallel > 1``) get their solo replies.
"""

from __future__ import annotations

import base64
import json
from pathlib import Path
from typing import Any, ClassVar

import media_prompts
import numpy as np
import pytest

from eliza_backends import (
    InferenceContext,
    MediaError,
    Stream,
    open_stream,
)
from eliza_backends.media import load_media_file
from eliza_backends.testing import MediaChecks

ROOT = Path(__file__).resolve().parent.parent
BUNDLE = ROOT / "examples" / "bundles" / "gemma4-mm-tiny"
PARITY = json.loads((BUNDLE / "parity.json").read_text(encoding="utf-8"))
PROMPTS = {p["name"]: p for p in PARITY["prompts"]}
N_TOKENS = PARITY["n_tokens"]
CONFIG: dict[str, Any] = {"backend": "llama.cpp", "max_tokens": N_TOKENS, "ignore_eos": True,
                          "context_size": 512, "batch_size": 256}


def openai_messages(messages: list[dict[str, Any]]) -> list[dict[str, Any]]:
    return media_prompts.openai_messages(BUNDLE, messages)


def reply_ids(stream: Stream, messages: list[dict[str, Any]]) -> list[int]:
    return media_prompts.reply_ids(stream, BUNDLE, messages)


@pytest.fixture(scope="module")
def stream() -> Any:
    with open_stream(BUNDLE, **CONFIG) as s:
        yield s


def test_the_bundle_reports_image_and_audio() -> None:
    from eliza_backends import explain

    report = explain(BUNDLE, backend="llama.cpp")
    assert set(report.media) == {"image", "audio"}
    assert "gemma4v" in report.media["image"] and "gemma4a" in report.media["audio"]


@pytest.mark.parametrize("name", sorted(PROMPTS))
def test_greedy_tokens_equal_the_torch_oracle(stream: Stream, name: str) -> None:
    prompt = PROMPTS[name]
    stream.reset()
    got = reply_ids(stream, prompt["messages"])
    assert list(stream.session.history[:len(prompt["prompt_ids"])]) == prompt["prompt_ids"]
    assert [(s.start, s.length) for s in stream.session.media] == [
        (m["start"] - 1, m["count"] + 2) for m in prompt["media"]]  # markers included
    assert got == prompt["continuation_ids"], f"{name}: {got} != {prompt['continuation_ids']}"


@pytest.mark.parametrize("name", sorted(PARITY["media"]))
def test_media_embeddings_match_the_oracle(stream: Stream, name: str) -> None:
    entry = PARITY["media"][name]
    want = np.frombuffer(base64.b64decode(entry["embedding"]["base64"]), dtype="<f4").reshape(
        entry["embedding"]["shape"])
    got = stream.session._media.projector.encode(load_media_file(BUNDLE / name))  # type: ignore[attr-defined]
    assert got.shape == want.shape
    cos = float((got * want).sum() / (np.linalg.norm(got) * np.linalg.norm(want)))
    rows = (got * want).sum(1) / (np.linalg.norm(got, axis=1) * np.linalg.norm(want, axis=1))
    assert cos >= 0.999 and float(rows.min()) >= 0.999, (name, cos, float(rows.min()))


def test_a_second_turn_prefills_only_the_new_turn(stream: Stream) -> None:
    two = PROMPTS["image_two_turns"]
    stream.reset()
    reply_ids(stream, two["messages"][:1])
    held = stream.session.history
    shared = next(i for i, (a, b) in enumerate(zip(held, two["prompt_ids"], strict=False))
                  if a != b)  # the first turn, image included, and the reply's first tokens
    assert shared > two["media"][0]["start"] + two["media"][0]["count"]
    fed = stream.prefill_messages(openai_messages(two["messages"]))
    assert fed == len(two["prompt_ids"]) - shared
    assert stream.session.media[0].digest == load_media_file(
        BUNDLE / two["media"][0]["file"]).digest
    assert [t for step in stream for t in step.tokens] == two["continuation_ids"]


def test_two_images_with_the_same_placeholders_never_share_cache(stream: Stream) -> None:
    landscape = PROMPTS["image_landscape"]
    other = [{"role": "user", "content": [
        {"type": "image", "path": "media/image-portrait.png"},
        {"type": "text", "text": "Describe this image."}]}]
    stream.reset()
    reply_ids(stream, landscape["messages"])
    fed = stream.prefill_messages(openai_messages(other))
    assert fed >= 72  # the whole image (70 embeddings and its two markers) again
    swapped = [t for step in stream for t in step.tokens]
    with open_stream(BUNDLE, **CONFIG) as fresh:
        assert swapped == reply_ids(fresh, other)
    assert swapped != landscape["continuation_ids"]


def test_reset_keep_never_cuts_an_image(stream: Stream) -> None:
    stream.reset()
    reply_ids(stream, PROMPTS["image_landscape"]["messages"])
    span = stream.session.media[0]
    assert stream.reset_keep(span.start + 10) == span.start
    assert stream.session.media == ()


def test_slots_keep_the_media(stream: Stream, tmp_path: Path) -> None:
    prompt = PROMPTS["image_landscape"]
    stream.reset()
    stream.prefill_messages(openai_messages(prompt["messages"]))
    stream.save_slot(tmp_path / "s.slot")
    spans = stream.session.media
    with open_stream(BUNDLE, **CONFIG) as other:
        other.restore_slot(tmp_path / "s.slot")
        assert other.session.media == spans
        assert [t for step in other for t in step.tokens] == prompt["continuation_ids"]


BAD = {
    "truncated image": {"type": "image_url", "image_url": {
        "url": "data:image/png;base64," + base64.b64encode(
            (BUNDLE / "media/image-landscape.png").read_bytes()[:300]).decode()}},
    "not base64": {"type": "image_url", "image_url": {"url": "data:image/png;base64,&&&"}},
    "remote url": {"type": "image_url", "image_url": {"url": "https://example.com/a.png"}},
    "local file": {"type": "image_url", "image_url": {
        "url": str(BUNDLE / "media/image-landscape.png")}},
    "audio as ogg": {"type": "input_audio", "input_audio": {"data": "AAAA", "format": "ogg"}},
}


def test_bad_media_loses_nothing(stream: Stream) -> None:
    prompt = PROMPTS["audio_chirp"]
    stream.reset()
    reply_ids(stream, prompt["messages"])
    history, media = stream.session.history, stream.session.media
    for name, bad in BAD.items():
        messages = [*openai_messages(prompt["messages"]), {"role": "user", "content": [
            bad, {"type": "text", "text": "And this?"}]}]
        with pytest.raises(MediaError):
            stream.prefill_messages(messages)
        assert stream.session.history == history and stream.session.media == media, name
    assert reply_ids(stream, prompt["messages"]) == prompt["continuation_ids"]


def test_an_image_past_the_micro_batch_is_refused_before_llama_cpp() -> None:
    with open_stream(BUNDLE, **{**CONFIG, "batch_size": 64}) as small:
        with pytest.raises(MediaError, match="batch_size >= 70"):
            reply_ids(small, PROMPTS["image_landscape"]["messages"])
        assert small.session.n_past == 0
        assert reply_ids(small, PROMPTS["text_hello"]["messages"]) == \
            PROMPTS["text_hello"]["continuation_ids"]


def test_concurrent_media_on_a_batched_context_get_solo_replies() -> None:
    """Sessions sharing one llama_context (parallel=3): an image, an audio clip and a text
    prompt at once; each reply is the oracle's (media decode alone, between steps), and no
    sequence copies another's media positions (two images, same placeholders)."""
    from concurrent.futures import ThreadPoolExecutor

    names = ["image_landscape", "audio_chirp", "image_portrait", "text_colors", "image_audio"]
    with InferenceContext(BUNDLE, parallel=3) as ctx:
        streams = [open_stream(ctx, **CONFIG) for _ in range(3)]
        try:
            assert streams[0].session.capabilities.batched
            assert streams[0].session.capabilities.media == {"image", "audio"}

            def run(i: int) -> list[list[int]]:
                return [reply_ids(streams[i], PROMPTS[n]["messages"]) for n in names[i::3]]

            with ThreadPoolExecutor(3) as pool:
                results = list(pool.map(run, range(3)))
        finally:
            for s in streams:
                s.close()
    for i, got in enumerate(results):
        for name, ids in zip(names[i::3], got, strict=True):
            assert ids == PROMPTS[name]["continuation_ids"], name


def test_a_batched_sequence_never_copies_another_image_as_its_prefix() -> None:
    """Two sequences of one context, the same text around different images: the second
    copies the first's prefix up to the image, never the image (its positions are cached
    under the media's digest); after the same image at the same place, the text is shared.
    (Steps shared by the sequences, ``batch_invariant=False``: the default copies whole
    batches only, tests/test_batch_invariance.py.)"""
    shared = {**CONFIG, "options": {"llama.cpp": {"batch_invariant": False}}}
    portrait = [{"role": "user", "content": [
        {"type": "image", "path": "media/image-portrait.png"},
        {"type": "text", "text": "Describe this image."}]}]
    landscape = PROMPTS["image_landscape"]
    with open_stream(BUNDLE, **CONFIG) as solo:
        want = reply_ids(solo, portrait)
    with InferenceContext(BUNDLE, parallel=3) as ctx:
        first, second, third = (open_stream(ctx, **shared) for _ in range(3))
        try:
            engine = first.session._lane.engine  # type: ignore[attr-defined]
            assert reply_ids(first, landscape["messages"]) == landscape["continuation_ids"]
            copied = engine.prefill_copied
            assert reply_ids(second, portrait) == want
            # the text before the image, short of the begin marker (the last token of the
            # prefill that precedes the image is decoded: its run ends there)
            assert engine.prefill_copied - copied == landscape["media"][0]["start"] - 1
            copied = engine.prefill_copied
            assert reply_ids(third, landscape["messages"]) == landscape["continuation_ids"]
            # the same image at the same place: the text before it and the text after it are
            # copied (the image itself is encoded again), each run short of its last token
            start, count = landscape["media"][0]["start"], landscape["media"][0]["count"]
            assert engine.prefill_copied - copied == (start - 1) + (
                len(landscape["prompt_ids"]) - (start + count) - 1)
        finally:
            for s in (first, second, third):
                s.close()


def test_cancel_then_reset_keep_after_an_image(stream: Stream) -> None:
    prompt = PROMPTS["image_landscape"]
    stream.reset()
    stream.prefill_messages(openai_messages(prompt["messages"]))
    stream.cancel()
    from eliza_backends import CancelledError

    with pytest.raises(CancelledError):
        stream.next()
    kept = stream.reset_keep(stream.session.n_past)
    assert kept == stream.session.n_past and len(stream.session.media) == 1
    assert reply_ids(stream, prompt["messages"]) == prompt["continuation_ids"]


def test_audio_longer_than_the_micro_batch_is_decoded_in_pieces() -> None:
    """Audio is causal: a clip of more positions than the batch goes in pieces (an image,
    bidirectional, must fit one: see above)."""
    from eliza_backends.media import audio_from_pcm

    t = np.arange(16_000 * 12) / 16_000
    clip = audio_from_pcm((0.3 * np.sin(2 * np.pi * 300 * t)).astype(np.float32), 16_000)
    with open_stream(BUNDLE, **{**CONFIG, "batch_size": 64}) as small:
        small.prefill([2, clip, 5])
        assert small.session.media[0].length == 302  # 300 embeddings and the two markers
        assert len(small.text()) > 0


def test_images_take_the_model_processors_budget() -> None:
    """A larger image is scaled to the processor's max_soft_tokens (70 here, from the bundle's
    processor_config.json) as transformers does, not llama.cpp's own default; the option
    overrides it."""
    from eliza_backends.media import image_from_rgb

    big = image_from_rgb(np.random.default_rng(0).integers(0, 255, (672, 960, 3), np.uint8))
    for options, count in (({}, 70), ({"llama.cpp": {"image_max_tokens": 280}}, 280)):
        with open_stream(BUNDLE, **{**CONFIG, "context_size": 1024, "batch_size": 512},
                         options=options) as s:
            assert [sp.length for sp in s.session.plan_prefill([2, big, 5]).spans] == [
                count + 2]


class TestLlamaCppMediaConformance(MediaChecks):
    """The kit's media area on a bundle whose llama.cpp sessions take images and audio."""

    @pytest.fixture
    def factory(self) -> Any:
        from eliza_llamacpp import LlamaCppFactory

        return LlamaCppFactory()

    @pytest.fixture
    def bundle_dir(self) -> Path:
        return BUNDLE

    base_config: ClassVar[dict[str, Any]] = {"context_size": 512, "batch_size": 256,
                                             "max_tokens": 24, "threads": 1}
