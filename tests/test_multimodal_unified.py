"""Gemma 4 Unified (raw image patches and audio frames, no encoders) on llama.cpp and MLX, on
``examples/bundles/gemma4-unified-tiny`` (tools/make_gemma4_unified_tiny.py: the text GGUF,
the gemma4uv + gemma4ua projector, the assistant, the float32 Hugging Face folder and the torch
oracle in parity.json), through the serving path (chat renderer, OpenAI media parts, the
backends' media feeders) that tools/gemma4_mm_parity.py's direct runtime calls bypass.

* llama.cpp: every oracle prompt (text, image, audio, image + audio, a second turn after an
  image): the renderer's ids equal the oracle's and the 24 greedy tokens equal its
  continuation; the projected media equal the oracle's (cosine >= 0.999); the projector is
  reported as gemma4uv / gemma4ua;
* MLX (mlx-vlm's gemma4_unified weights, the image block prefilled with Gemma 4's reference
  mask): the same prompts, and the first-step logits within 1e-3 of the oracle's and far from
  the other mask rules' (the Unified forward's all-layers rule, causal) where those are far;
* ``drafter="mtp"`` with the Unified assistant, on llama.cpp and on MLX (mlx-vlm's drafter,
  the core's loop): output equal to plain greedy and the oracle (MLX: image and audio chats
  too), drafted > 0, MLX's acceptance within 0.05 of llama.cpp's; a llama.cpp session with it
  refuses media plainly.
"""

from __future__ import annotations

import base64
import json
from pathlib import Path
from typing import Any

import media_prompts
import numpy as np
import pytest

from eliza_backends import Stream, open_stream
from eliza_backends.media import load_media_file
from eliza_backends.testing import generated_tokens, run_to_end

ROOT = Path(__file__).resolve().parent.parent
BUNDLE = ROOT / "examples" / "bundles" / "gemma4-unified-tiny"
PARITY = json.loads((BUNDLE / "parity.json").read_text(encoding="utf-8"))
PROMPTS = {p["name"]: p for p in PARITY["prompts"]}
N_TOKENS = PARITY["n_tokens"]
CONFIG: dict[str, Any] = {"max_tokens": N_TOKENS, "ignore_eos": True, "context_size": 512,
                          "batch_size": 256, "threads": 1}
BACKENDS = ["llama.cpp", "mlx"]


def _available(backend: str) -> bool:
    import importlib.util

    module = "llama_cpp" if backend == "llama.cpp" else "mlx_vlm"
    return importlib.util.find_spec(module) is not None


@pytest.fixture(scope="module", params=BACKENDS)
def stream(request: pytest.FixtureRequest) -> Any:
    if not _available(request.param):
        pytest.skip(f"{request.param} is not installed")
    with open_stream(BUNDLE, backend=request.param, **CONFIG) as s:
        yield s


def reply_ids(stream: Stream, messages: list[dict[str, Any]]) -> list[int]:
    return media_prompts.reply_ids(stream, BUNDLE, messages)


def decode(entry: dict[str, Any]) -> np.ndarray:
    return np.frombuffer(base64.b64decode(entry["base64"]), dtype="<f4").reshape(entry["shape"])


def test_the_bundle_reports_the_unified_projector_and_the_mtp_drafter() -> None:
    from eliza_backends import explain

    report = explain(BUNDLE, backend="llama.cpp")
    assert set(report.media) == {"image", "audio"}
    assert "gemma4uv" in report.media["image"] and "gemma4ua" in report.media["audio"]
    assert report.drafters["mtp"].startswith("text/draft/mtp/gemma4-unified-tiny-assistant-f32")
    if _available("mlx"):
        mlx = explain(BUNDLE, backend="mlx")
        assert set(mlx.media) == {"image", "audio"}
        assert mlx.drafters["mtp"].startswith("text/draft/mtp/gemma4-unified-tiny-assistant-mlx")


@pytest.mark.parametrize("name", sorted(PROMPTS))
def test_greedy_tokens_equal_the_torch_oracle(stream: Stream, name: str) -> None:
    prompt = PROMPTS[name]
    stream.reset()
    got = reply_ids(stream, prompt["messages"])
    assert list(stream.session.history[:len(prompt["prompt_ids"])]) == prompt["prompt_ids"]
    assert got == prompt["continuation_ids"], f"{name}: {got} != {prompt['continuation_ids']}"


def _first_logits_mlx(stream: Stream) -> np.ndarray:
    import mlx.core as mx

    session: Any = stream.session
    row = session._ahead[1] if session._ahead is not None else session._logits
    return np.array(row[0].astype(mx.float32))


@pytest.mark.parametrize("name", sorted(n for n, p in PROMPTS.items() if p["media"]))
def test_mlx_follows_the_reference_image_mask(name: str) -> None:
    """The MLX backend's first-step logits are the oracle's (Gemma 4's mask) to 1e-3, and not
    the Unified forward's own rule's or the causal rule's where those differ by > 0.1."""
    if not _available("mlx"):
        pytest.skip("mlx-vlm is not installed")
    prompt = PROMPTS[name]
    with open_stream(BUNDLE, backend="mlx", **CONFIG) as s:
        s.prefill_messages(media_prompts.openai_messages(BUNDLE, prompt["messages"]))
        got = _first_logits_mlx(s)
    assert float(np.abs(got - decode(prompt["first_logits"]).ravel()).max()) < 1e-3
    for rule, other in prompt.get("other_mask_rules", {}).items():
        if other["first_logits_max_abs_diff"] > 0.1:
            assert float(np.abs(got - decode(other["first_logits"]).ravel()).max()) > 0.1, rule


@pytest.mark.parametrize("name", sorted(PARITY["media"]))
def test_media_embeddings_match_the_oracle(name: str) -> None:
    if not _available("llama.cpp"):
        pytest.skip("llama.cpp is not installed")
    want = decode(PARITY["media"][name]["embedding"])
    with open_stream(BUNDLE, backend="llama.cpp", **CONFIG) as s:
        s.prefill_messages([{"role": "user", "content": "Hello!"}])
        got = s.session._media.projector.encode(load_media_file(BUNDLE / name))  # type: ignore[attr-defined]
    assert got.shape == want.shape
    rows = (got * want).sum(1) / (np.linalg.norm(got, axis=1) * np.linalg.norm(want, axis=1))
    assert float(rows.min()) >= 0.999, (name, float(rows.min()))


def test_a_second_turn_after_an_image_gets_the_oracle_reply(stream: Stream) -> None:
    """llama.cpp prefills only the new turn; MLX the whole conversation again (Gemma 4's
    sliding-window caches in mlx-vlm cannot be cut back once the window has rotated), the
    image included."""
    two = PROMPTS["image_two_turns"]
    stream.reset()
    reply_ids(stream, two["messages"][:1])
    fed = stream.prefill_messages(media_prompts.openai_messages(BUNDLE, two["messages"]))
    if stream.session.backend_name == "llama.cpp":
        assert fed < len(two["prompt_ids"]) - two["media"][0]["count"]
    else:
        assert 0 < fed <= len(two["prompt_ids"])
    assert list(stream.session.history) == two["prompt_ids"]
    assert [t for step in stream for t in step.tokens] == two["continuation_ids"]


#: prompts for the MTP drafter: the oracle's chats (media ones on MLX only: a llama.cpp session
#: with the MTP drafter takes no media) and gemma4-tiny's plain prompts (its training text)
MTP_PROMPTS = ["text_hello", "text_colors", "image_landscape", "image_two_turns",
               "audio_chirp", "We hold these truths to be self-evident,",
               "Four score and seven years ago"]
MTP = {"drafter": "mtp", "draft_length": 3, "draft_policy": "fixed"}


def _mtp_run(backend: str, name: str, extra: dict[str, Any]) -> tuple[list[int], int, int]:
    with open_stream(BUNDLE, backend=backend, **{**CONFIG, **extra}) as s:
        if name in PROMPTS:
            s.prefill_messages(media_prompts.openai_messages(BUNDLE, PROMPTS[name]["messages"]))
        else:
            s.prefill(name)
        steps = run_to_end(s.session)
        return (generated_tokens(steps), sum(st.drafted for st in steps),
                sum(st.accepted for st in steps))


@pytest.mark.parametrize(("backend", "name"), [
    (b, n) for b in BACKENDS for n in MTP_PROMPTS
    if b == "mlx" or not PROMPTS.get(n, {}).get("media")])
def test_mtp_is_plain_greedy(backend: str, name: str) -> None:
    """drafter='mtp' (the Unified assistant; on MLX through mlx-vlm's drafter and the core's
    loop, media prefilled beside it) gives plain greedy's tokens, the oracle's on its prompts."""
    if not _available(backend):
        pytest.skip(f"{backend} is not installed")
    plain = _mtp_run(backend, name, {})[0]
    out, drafted, accepted = _mtp_run(backend, name, MTP)
    assert out == plain
    if name in PROMPTS:
        assert out == PROMPTS[name]["continuation_ids"]
    assert drafted > 0 and 0 <= accepted <= drafted


def test_mtp_acceptance_is_the_same_on_mlx_and_llama_cpp() -> None:
    """On the plain prompts at k=3, MLX's acceptance (mlx-vlm's drafter, the core's loop) is
    within 0.05 of the llama.cpp seam's (measured: 0.896 / 0.894 on four prompts)."""
    if not (_available("mlx") and _available("llama.cpp")):
        pytest.skip("needs both backends")
    rate = {}
    for backend in BACKENDS:
        runs = [_mtp_run(backend, p, {**MTP, "max_tokens": 64, "ignore_eos": False})
                for p in MTP_PROMPTS if p not in PROMPTS]
        rate[backend] = sum(r[2] for r in runs) / sum(r[1] for r in runs)
    assert abs(rate["mlx"] - rate["llama.cpp"]) <= 0.05, rate


def test_mtp_on_llama_cpp_refuses_media_plainly() -> None:
    """A llama.cpp session with the MTP drafter takes no media (as for Gemma 4): a typed error
    before any native call."""
    from eliza_backends import UnsupportedOperationError

    if not _available("llama.cpp"):
        pytest.skip("llama.cpp is not installed")
    with open_stream(BUNDLE, backend="llama.cpp", drafter="mtp", **CONFIG) as s:
        with pytest.raises(UnsupportedOperationError, match="takes no image"):
            s.prefill_messages(media_prompts.openai_messages(
                BUNDLE, PROMPTS["image_landscape"]["messages"]))
        assert s.session.n_past == 0
