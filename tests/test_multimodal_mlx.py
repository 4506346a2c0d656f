"""Images and audio on MLX through mlx-vlm (eliza_mlx.vlm), on the tiny multimodal Gemma 4
(``examples/bundles/gemma4-mm-tiny``: the float32 Hugging Face folder and the torch oracle in
parity.json).

* every oracle prompt (text, image, audio, image + audio, a second turn after an image): the
  24 greedy tokens equal the oracle's;
* the first-step logits agree with the oracle's under the reference image mask (Gemma 4's own:
  bidirectional inside an image on sliding layers) to 1e-3 — mlx-vlm's own mask is 0.39 off
  on image_portrait — and are far from the causal rule's there;
* the projected media embeddings agree with the oracle's (cosine >= 0.999);
* a second turn after an image gets the oracle's reply; two images with equal placeholders
  never share cache; bad media loses nothing.
"""

from __future__ import annotations

import base64
from typing import Any

import numpy as np
import pytest

try:  # tests/ as a package or as a plain folder on sys.path
    from . import test_multimodal_llamacpp as mm
except ImportError:
    import test_multimodal_llamacpp as mm

from eliza_backends import MediaError, Stream, open_stream
from eliza_backends.media import load_media_file

pytest.importorskip("mlx.core")
pytest.importorskip("mlx_vlm")

CONFIG: dict[str, Any] = {**mm.CONFIG, "backend": "mlx"}


@pytest.fixture(scope="module")
def stream() -> Any:
    with open_stream(mm.BUNDLE, **CONFIG) as s:
        yield s


def first_logits(stream: Stream) -> np.ndarray:
    """The logits the first reply token is sampled from (the session queued its forward)."""
    import mlx.core as mx

    session: Any = stream.session
    row = session._ahead[1] if session._ahead is not None else session._logits
    return np.array(row[0].astype(mx.float32))


def oracle_logits(entry: dict[str, Any]) -> np.ndarray:
    return np.frombuffer(base64.b64decode(entry["base64"]), dtype="<f4")


def test_explain_reports_image_and_audio() -> None:
    from eliza_backends import explain

    report = explain(mm.BUNDLE, backend="mlx")
    assert set(report.media) == {"image", "audio"}


@pytest.mark.parametrize("name", sorted(mm.PROMPTS))
def test_greedy_tokens_and_first_logits_equal_the_torch_oracle(stream: Stream,
                                                               name: str) -> None:
    prompt = mm.PROMPTS[name]
    stream.reset()
    stream.prefill_messages(mm.openai_messages(prompt["messages"]))
    assert list(stream.session.history) == prompt["prompt_ids"]
    got = first_logits(stream)
    assert float(np.abs(got - oracle_logits(prompt["first_logits"])).max()) < 1e-3
    causal = prompt.get("other_mask_rules", {}).get("causal")
    if causal is not None and causal["first_logits_max_abs_diff"] > 0.1:
        assert float(np.abs(got - oracle_logits(causal["first_logits"])).max()) > 0.1
    assert [t for step in stream for t in step.tokens] == prompt["continuation_ids"]


@pytest.mark.parametrize("name", sorted(mm.PARITY["media"]))
def test_media_embeddings_match_the_oracle(stream: Stream, name: str) -> None:
    entry = mm.PARITY["media"][name]
    want = np.frombuffer(base64.b64decode(entry["embedding"]["base64"]), dtype="<f4").reshape(
        entry["embedding"]["shape"])
    item = load_media_file(mm.BUNDLE / name)
    got = np.array(stream.session._model.encode(item.kind, item.data))  # type: ignore[attr-defined]
    assert got.shape == want.shape
    rows = (got * want).sum(1) / (np.linalg.norm(got, axis=1) * np.linalg.norm(want, axis=1))
    assert float(rows.min()) >= 0.999, (name, float(rows.min()))


def test_a_second_turn_after_an_image_gets_the_oracle_reply(stream: Stream) -> None:
    """(The whole conversation is prefilled again: Gemma 4's sliding-window caches in
    mlx-vlm cannot be cut back once the window has rotated, so the common prefix is not
    kept; what matters is that the media go in again, right.)"""
    two = mm.PROMPTS["image_two_turns"]
    stream.reset()
    mm.reply_ids(stream, two["messages"][:1])
    fed = stream.prefill_messages(mm.openai_messages(two["messages"]))
    assert 0 < fed <= len(two["prompt_ids"])
    assert list(stream.session.history) == two["prompt_ids"]
    assert [t for step in stream for t in step.tokens] == two["continuation_ids"]


def test_two_images_with_the_same_placeholders_never_share_cache(stream: Stream) -> None:
    landscape, portrait = mm.PROMPTS["image_landscape"], mm.PROMPTS["image_portrait"]
    other = [{"role": "user", "content": [portrait["messages"][0]["content"][0],
                                          landscape["messages"][0]["content"][1]]}]
    stream.reset()
    mm.reply_ids(stream, landscape["messages"])
    assert stream.prefill_messages(mm.openai_messages(other)) >= 72
    swapped = [t for step in stream for t in step.tokens]
    with open_stream(mm.BUNDLE, **CONFIG) as fresh:
        assert swapped == mm.reply_ids(fresh, other)


def test_bad_media_loses_nothing(stream: Stream) -> None:
    prompt = mm.PROMPTS["audio_chirp"]
    stream.reset()
    mm.reply_ids(stream, prompt["messages"])
    history, media = stream.session.history, stream.session.media
    for name, bad in mm.BAD.items():
        messages = [*mm.openai_messages(prompt["messages"]), {"role": "user", "content": [
            bad, {"type": "text", "text": "And this?"}]}]
        with pytest.raises(MediaError):
            stream.prefill_messages(messages)
        assert stream.session.history == history and stream.session.media == media, name
    assert mm.reply_ids(stream, prompt["messages"]) == prompt["continuation_ids"]
