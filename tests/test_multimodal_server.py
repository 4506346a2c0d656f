"""Images and audio where users meet them: the OpenAI server (the ``openai`` SDK sends an image
and an audio clip), the in-process ``chat_completion``, ``generate --image/--audio``; a request
with media the backend cannot take, or bad media, is a typed 400 and the server keeps serving.
"""

from __future__ import annotations

import base64
import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import openai
import pytest

from eliza_backends import chat_completion
from tests.server_process import ServerProcess

ROOT = Path(__file__).resolve().parent.parent
BUNDLE = ROOT / "examples" / "bundles" / "gemma4-mm-tiny"
TINY = ROOT / "examples" / "bundles" / "tiny"
PARITY = json.loads((BUNDLE / "parity.json").read_text(encoding="utf-8"))
PROMPTS = {p["name"]: p for p in PARITY["prompts"]}


def b64(name: str) -> str:
    return base64.b64encode((BUNDLE / name).read_bytes()).decode()


IMAGE = {"type": "image_url",
         "image_url": {"url": f"data:image/png;base64,{b64('media/image-portrait.png')}"}}
AUDIO = {"type": "input_audio", "input_audio": {"data": b64("media/audio-chirp.wav"),
                                                "format": "wav"}}
MESSAGES: list[dict[str, Any]] = [{"role": "user", "content": [
    IMAGE, AUDIO, {"type": "text", "text": "What did they say?"}]}]
#: the oracle's reply to MESSAGES, up to its first end token
ORACLE = PROMPTS["image_audio"]["text_until_stop"]


@pytest.fixture(scope="module")
def server() -> Any:
    with ServerProcess(BUNDLE, "--backend", "llama.cpp", "--context-size", "512") as proc:
        yield proc


def client(server: ServerProcess) -> openai.OpenAI:
    return openai.OpenAI(base_url=server.url, api_key="unused", max_retries=0, timeout=120)


def test_the_sdk_sends_an_image_and_audio_and_gets_the_in_process_reply(
        server: ServerProcess) -> None:
    reply = client(server).chat.completions.create(
        model="gemma4-mm-tiny", messages=MESSAGES, max_tokens=24, temperature=0)  # type: ignore[arg-type]
    local = chat_completion(BUNDLE, MESSAGES, max_tokens=24, temperature=0,
                            backend="llama.cpp", config={"context_size": 512})
    assert reply.choices[0].message.content == local.choices[0].message.content == ORACLE
    assert reply.usage is not None and reply.usage.prompt_tokens == len(
        PROMPTS["image_audio"]["prompt_ids"])


def test_streamed_media_replies_match(server: ServerProcess) -> None:
    chunks = client(server).chat.completions.create(
        model="gemma4-mm-tiny", messages=MESSAGES, max_tokens=24, temperature=0,  # type: ignore[arg-type]
        stream=True)
    assert "".join(c.choices[0].delta.content or "" for c in chunks if c.choices) == ORACLE


BAD = {
    "truncated image": {"type": "image_url", "image_url": {
        "url": "data:image/png;base64," + base64.b64encode(
            (BUNDLE / "media/image-portrait.png").read_bytes()[:200]).decode()}},
    "not base64": {"type": "image_url", "image_url": {"url": "data:image/png;base64,%%%"}},
    "remote url": {"type": "image_url", "image_url": {"url": "https://example.com/cat.png"}},
    "local file without the flag": {"type": "image_url", "image_url": {
        "url": f"file://{BUNDLE / 'media/image-portrait.png'}"}},
    "audio too long": {"type": "input_audio", "input_audio": {
        "data": base64.b64encode(b"RIFF" + (10**9).to_bytes(4, "little") + b"WAVEfmt "
                                 + bytes.fromhex("100000000100010080bb000000770100020010")
                                 + b"data" + (10**9).to_bytes(4, "little")).decode(),
        "format": "wav"}},
}


@pytest.mark.parametrize("case", sorted(BAD))
def test_bad_media_is_a_400_and_the_server_keeps_serving(server: ServerProcess,
                                                          case: str) -> None:
    api = client(server)
    with pytest.raises(openai.BadRequestError) as info:
        api.chat.completions.create(model="gemma4-mm-tiny", max_tokens=4, messages=[  # type: ignore[arg-type]
            {"role": "user", "content": [BAD[case], {"type": "text", "text": "hi"}]}])
    assert info.value.status_code == 400
    assert "ELIZA_ERR_INVALID_ARG" in str(info.value.body)
    assert server.health()["status"] == "ok"
    again = api.chat.completions.create(model="gemma4-mm-tiny", messages=MESSAGES,  # type: ignore[arg-type]
                                        max_tokens=24, temperature=0)
    assert again.choices[0].message.content == ORACLE


def test_mp3_input_gets_the_in_process_reply(server: ServerProcess) -> None:
    mp3 = base64.b64encode((ROOT / "tests" / "fixtures" / "media" / "speech-2s.mp3"
                            ).read_bytes()).decode()
    messages = [{"role": "user", "content": [
        {"type": "input_audio", "input_audio": {"data": mp3, "format": "mp3"}},
        {"type": "text", "text": "What do you hear?"}]}]
    reply = client(server).chat.completions.create(
        model="gemma4-mm-tiny", messages=messages, max_tokens=16, temperature=0)  # type: ignore[arg-type]
    local = chat_completion(BUNDLE, messages, max_tokens=16, temperature=0,
                            backend="llama.cpp", config={"context_size": 512})
    assert reply.choices[0].message.content == local.choices[0].message.content
    assert reply.usage is not None and reply.usage.prompt_tokens > 48  # 2 s: 48 embeddings


def test_concurrent_media_requests_on_serve_parallel_get_solo_replies() -> None:
    """``serve --parallel 3``: image, audio and mixed requests at once, each answered as the
    oracle answers it alone."""
    from concurrent.futures import ThreadPoolExecutor

    def part(p: dict[str, Any]) -> dict[str, Any]:
        if p["type"] == "text":
            return p
        if p["type"] == "image":
            return {"type": "image_url",
                    "image_url": {"url": f"data:image/png;base64,{b64(p['path'])}"}}
        return {"type": "input_audio", "input_audio": {"data": b64(p["path"]), "format": "wav"}}

    def parts(name: str) -> list[dict[str, Any]]:
        return [m if isinstance(m["content"], str) else
                {"role": m["role"], "content": [part(p) for p in m["content"]]}
                for m in PROMPTS[name]["messages"]]

    names = ["image_landscape", "audio_chirp", "image_audio", "image_portrait", "audio_tones",
             "image_two_turns"]
    with ServerProcess(BUNDLE, "--backend", "llama.cpp", "--context-size", "512",
                       "--parallel", "3") as proc:
        api = client(proc)

        def ask(name: str) -> str | None:
            return api.chat.completions.create(
                model="gemma4-mm-tiny", messages=parts(name), max_tokens=24,  # type: ignore[arg-type]
                temperature=0).choices[0].message.content

        with ThreadPoolExecutor(3) as pool:
            replies = list(pool.map(ask, names))
    assert replies == [PROMPTS[n]["text_until_stop"] for n in names]


def test_media_a_backend_cannot_take_is_a_typed_400() -> None:
    with ServerProcess(TINY, "--backend", "llama.cpp") as tiny:
        with pytest.raises(openai.BadRequestError) as info:
            client(tiny).chat.completions.create(model="tiny", max_tokens=4,  # type: ignore[arg-type]
                                                 messages=MESSAGES)
        assert "ELIZA_ERR_UNSUPPORTED" in str(info.value.body)
        assert "takes no image input" in str(info.value.body)


def test_local_files_with_the_flag() -> None:
    url = f"file://{BUNDLE / 'media/image-portrait.png'}"
    with ServerProcess(BUNDLE, "--backend", "llama.cpp", "--context-size", "512",
                       "--allow-media-files") as proc:
        reply = client(proc).chat.completions.create(
            model="gemma4-mm-tiny", max_tokens=24, temperature=0, messages=[  # type: ignore[arg-type]
                {"role": "user", "content": [{"type": "image_url", "image_url": {"url": url}},
                                             AUDIO, {"type": "text",
                                                     "text": "What did they say?"}]}])
    assert reply.choices[0].message.content == ORACLE


def test_generate_with_image_and_audio() -> None:
    out = subprocess.run(
        [sys.executable, "-m", "eliza_backends", "generate", str(BUNDLE), "What did they say?",
         "--backend", "llama.cpp", "--image", str(BUNDLE / "media/image-portrait.png"),
         "--audio", str(BUNDLE / "media/audio-chirp.wav"), "--max-tokens", "24",
         "--context-size", "512"],
        cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == ORACLE


def test_the_chat_repl_attaches_images_and_audio() -> None:
    lines = [f"/image {BUNDLE / 'media/image-portrait.png'}",
             f"/audio {BUNDLE / 'media/audio-chirp.wav'}", "What did they say?",
             "/image /no/such/file.png", f"/audio {BUNDLE / 'media/image-portrait.png'}",
             "/quit"]
    out = subprocess.run(
        [sys.executable, "-m", "eliza_backends", "chat", str(BUNDLE), "--backend", "llama.cpp",
         "--max-tokens", "24", "--context-size", "512"], input="\n".join(lines) + "\n",
        cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == ORACLE
    assert out.stderr.count("attached to your next message") == 2
    assert "[/image failed: " in out.stderr and "is not a file" in out.stderr
    assert "[/audio failed: " in out.stderr  # a PNG is not audio
    with_tiny = subprocess.run(
        [sys.executable, "-m", "eliza_backends", "chat", str(TINY), "--backend", "llama.cpp",
         "--max-tokens", "4"], input=f"/image {BUNDLE / 'media/image-portrait.png'}\n/quit\n",
        cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert with_tiny.returncode == 0 and "takes no image input" in with_tiny.stderr
