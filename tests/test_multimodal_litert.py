"""Images and audio on the LiteRT-LM engine session, on the tiny multimodal Gemma 4 exported by
litert-torch (``examples/bundles/gemma4-mm-tiny-litert``: one ``.litertlm`` with the image and
audio encoders, and the torch oracle in parity.json).

* the bundle reports image and audio (a header probe), a text-only ``.litertlm`` none;
* every oracle prompt through ``session="engine"`` gives the oracle's greedy tokens up to its
  first stop token (the engine ends its turn there and does not emit it): parity.json's
  ``litert_lm.ids``, the oracle under LiteRT-LM's rules: the **causal** image mask (its
  prefill is causal) and, for audio, LiteRT-LM's own mel front end (one frame more than
  transformers' at a clip's end: tools/litert_audio_frontend.py); for text prompts the
  reference tokens; the chat renderer's ids equal the oracle's ``prompt_ids``;
* bad media on the engine session: a typed error before any engine call, the session keeps
  its conversation;
* the token-exact session takes no media: a typed error at open (``media=``) and at prefill.
"""

from __future__ import annotations

import base64
import json
from pathlib import Path
from typing import Any

import media_prompts
import pytest
from conftest import TINY_BUNDLE

pytest.importorskip("litert_lm")

from eliza_backends import (
    MediaError,
    Stream,
    UnsupportedOperationError,
    explain,
    open_stream,
)

ROOT = Path(__file__).resolve().parent.parent
BUNDLE = ROOT / "examples" / "bundles" / "gemma4-mm-tiny-litert"
PARITY = json.loads((BUNDLE / "parity.json").read_text(encoding="utf-8"))
PROMPTS = {p["name"]: p for p in PARITY["prompts"]}
ENGINE: dict[str, Any] = {"backend": "litert-lm", "max_tokens": PARITY["n_tokens"],
                          "temperature": 0.0, "context_size": 512, "threads": 1,
                          "options": {"litert-lm": {"session": "engine"}}}
INTERP = {"litert-lm": {"session": "interpreter"}}


def openai_messages(messages: list[dict[str, Any]]) -> list[dict[str, Any]]:
    return media_prompts.openai_messages(BUNDLE, messages)


def reply_ids(stream: Stream, messages: list[dict[str, Any]]) -> list[int]:
    return media_prompts.reply_ids(stream, BUNDLE, messages)


def expected(prompt: dict[str, Any]) -> list[int]:
    """The oracle's greedy tokens under LiteRT-LM's rules (the causal image mask, its own
    audio front end: tools/litert_audio_frontend.py), up to the first stop token (the engine
    ends its turn there and does not emit it)."""
    want = prompt["litert_lm"]
    return list(want["ids"][:want["until_stop"]])


@pytest.fixture(scope="module")
def stream() -> Any:
    with open_stream(BUNDLE, **ENGINE) as s:
        yield s


def test_the_bundle_reports_image_and_audio_and_a_text_file_none() -> None:
    report = explain(BUNDLE, backend="litert-lm")
    assert set(report.media) == {"image", "audio"}
    assert "vision_encoder" in report.media["image"]
    assert "audio_encoder" in report.media["audio"]
    assert explain(TINY_BUNDLE, backend="litert-lm").media == {}


@pytest.mark.parametrize("name", sorted(PROMPTS))
def test_greedy_tokens_equal_the_causal_mask_oracle(stream: Stream, name: str) -> None:
    prompt = PROMPTS[name]
    stream.reset()
    got = reply_ids(stream, prompt["messages"])
    assert list(stream.session.history[:len(prompt["prompt_ids"])]) == prompt["prompt_ids"]
    assert [(s.start, s.length) for s in stream.session.media] == [
        (m["start"] - 1, m["count"] + 2) for m in prompt["media"]]  # markers included
    assert got == expected(prompt), f"{name}: {got} != {expected(prompt)}"


def test_a_second_turn_after_an_image_replays_the_whole_sequence(stream: Stream) -> None:
    two = PROMPTS["image_two_turns"]
    stream.reset()
    reply_ids(stream, two["messages"][:1])
    assert reply_ids(stream, two["messages"]) == expected(two)


def test_a_text_chat_after_a_reset_from_an_image_runs_on_the_session(stream: Stream) -> None:
    stream.reset()
    reply_ids(stream, PROMPTS["image_portrait"]["messages"])
    stream.reset()
    assert stream.session.media == ()
    assert reply_ids(stream, PROMPTS["text_hello"]["messages"]) == expected(
        PROMPTS["text_hello"])
    assert stream.session._conversation is None  # type: ignore[attr-defined]


BAD = {
    "truncated image": {"type": "image_url", "image_url": {
        "url": "data:image/png;base64," + base64.b64encode(
            (BUNDLE / "media/image-landscape.png").read_bytes()[:60]).decode()}},
    "not base64": {"type": "image_url", "image_url": {"url": "data:image/png;base64,&&&"}},
    "remote url": {"type": "image_url", "image_url": {"url": "https://example.com/a.png"}},
    "audio as ogg": {"type": "input_audio", "input_audio": {"data": "AAAA", "format": "ogg"}},
}


def test_bad_media_on_the_engine_loses_nothing(stream: Stream) -> None:
    prompt = PROMPTS["audio_chirp"]
    stream.reset()
    first = reply_ids(stream, prompt["messages"])
    history, media = stream.session.history, stream.session.media
    for name, bad in BAD.items():
        messages = [*openai_messages(prompt["messages"]), {"role": "user", "content": [
            bad, {"type": "text", "text": "And this?"}]}]
        with pytest.raises(MediaError):
            stream.prefill_messages(messages)
        assert stream.session.history == history and stream.session.media == media, name
    assert reply_ids(stream, prompt["messages"]) == first


def test_the_token_exact_session_takes_no_media() -> None:
    with pytest.raises(UnsupportedOperationError, match="interpreter"):
        open_stream(BUNDLE, backend="litert-lm", media=["image"], options=INTERP)
    image = media_prompts.openai_part(
        BUNDLE, {"type": "image", "path": "media/image-landscape.png"})
    with open_stream(TINY_BUNDLE, backend="litert-lm", max_tokens=4, options=INTERP) as s:
        assert s.session.capabilities.media == frozenset()
        with pytest.raises(UnsupportedOperationError):
            s.prefill_messages([{"role": "user", "content": [
                image, {"type": "text", "text": "What is it?"}]}])
        assert len(s.session.history) == 0
        s.prefill_messages([{"role": "user", "content": "Hello"}])
        assert len([t for step in s for t in step.tokens]) > 0


def test_auto_opens_the_engine_for_a_stream_that_asks_for_media() -> None:
    with open_stream(BUNDLE, backend="litert-lm", media=["image", "audio"],
                     max_tokens=4) as s:
        assert s.session.capabilities.media == frozenset({"image", "audio"})
        assert type(s.session).__name__ == "EngineSession"
