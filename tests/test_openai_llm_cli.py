"""simonw/llm's command line against ``eliza-backends serve``, configured the way its docs say
(an ``extra-openai-models.yaml`` in its user directory): the same greedy text as the
in-process API, streamed and not, and a continued conversation (``llm -c``) that the server
answers from the session that already holds it."""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest
from conftest import TINY_BUNDLE
from server_process import ServerProcess, backend_params

from eliza_backends import chat_completion, completion

LLM = Path(sys.executable).with_name("llm")


@pytest.fixture(scope="module", params=backend_params())
def backend(request: pytest.FixtureRequest) -> str:
    return str(request.param)


@pytest.fixture(scope="module")
def server(backend: str) -> Iterator[ServerProcess]:
    with ServerProcess(TINY_BUNDLE, "--backend", backend, "--sessions", "2",
                       "--threads", "1") as proc:
        yield proc


@pytest.fixture
def llm_home(tmp_path: Path, server: ServerProcess) -> dict[str, str]:
    (tmp_path / "extra-openai-models.yaml").write_text(
        "- model_id: eliza-tiny\n"
        "  model_name: tiny\n"
        f"  api_base: \"{server.url}\"\n"
        "- model_id: eliza-tiny-completion\n"
        "  model_name: tiny\n"
        f"  api_base: \"{server.url}\"\n"
        "  completion: true\n", encoding="utf-8")
    env = {k: v for k, v in os.environ.items() if not k.startswith("OPENAI")}
    env["LLM_USER_PATH"] = str(tmp_path)
    return env


def llm(env: dict[str, str], *args: str) -> str:
    proc = subprocess.run([str(LLM), *args], env=env, capture_output=True, text=True,
                          timeout=120)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    return proc.stdout


def test_llm_lists_the_model(llm_home: dict[str, str]) -> None:
    assert "eliza-tiny" in llm(llm_home, "models")


@pytest.mark.parametrize("stream", [True, False], ids=["streamed", "not-streamed"])
def test_llm_prompt_gives_the_in_process_greedy_text(llm_home: dict[str, str], backend: str,
                                                     stream: bool) -> None:
    prompt = "What is two plus two?"
    want = chat_completion(TINY_BUNDLE, [{"role": "user", "content": prompt}], max_tokens=48,
                           backend=backend, config={"threads": 1}).choices[0].message.content
    args = ["-m", "eliza-tiny", "-o", "temperature", "0", "-o", "max_tokens", "48", prompt]
    got = llm(llm_home, *args, *([] if stream else ["--no-stream"]))
    assert got == want + "\n"


def test_llm_continued_conversation_reuses_the_session(llm_home: dict[str, str], backend: str,
                                                       server: ServerProcess) -> None:
    first = llm(llm_home, "-m", "eliza-tiny", "-o", "max_tokens", "24",
                "What is two plus two?").rstrip("\n")
    second = llm(llm_home, "-c", "-o", "max_tokens", "24", "And three plus three?")
    messages = [{"role": "user", "content": "What is two plus two?"},
                {"role": "assistant", "content": first},
                {"role": "user", "content": "And three plus three?"}]
    want = chat_completion(TINY_BUNDLE, messages, max_tokens=24, backend=backend,
                           config={"threads": 1})
    assert second == want.choices[0].message.content + "\n"
    *_, turn1, turn2 = [r for r in server.access_records()
                        if r["path"] == "/v1/chat/completions"]
    # the second turn prefilled only its new tokens: the first turn's were in the session
    assert turn2["cached_tokens"] >= turn1["prompt_tokens"] + turn1["completion_tokens"] - 1
    assert turn2["slot"] == turn1["slot"]


def test_llm_completion_model_uses_v1_completions(llm_home: dict[str, str],
                                                   backend: str) -> None:
    prompt = "Four score and seven years ago"
    want = completion(TINY_BUNDLE, prompt, max_tokens=16, backend=backend,
                      config={"threads": 1})
    got = llm(llm_home, "-m", "eliza-tiny-completion", "-o", "max_tokens", "16", prompt)
    assert got == want.choices[0].text + "\n"
