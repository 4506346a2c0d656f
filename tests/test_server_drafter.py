"""``eliza-backends serve --drafter``: speculative decoding over HTTP on the tiny Gemma 4 pair
(target + MTP assistant, real llama.cpp). The drafted server streams exactly the replies of
the undrafted one, says how many tokens were drafted and kept in each response's ``usage``
(extension fields) and in ``/health``; a combination llama.cpp cannot run (MTP on a batched
context) is refused before the model loads."""

from __future__ import annotations

import subprocess
import sys
from collections.abc import Iterator
from typing import Any

import openai
import pytest
from conftest import ROOT
from server_process import ServerProcess

pytest.importorskip("llama_cpp")

MTP_BUNDLE = ROOT / "examples" / "bundles" / "gemma4-tiny"
#: Ordinary prompts of the tiny family (its training text, where the assistant was distilled)
PROMPTS = ["We hold these truths to be self-evident,", "Ships that passed in the dark",
           "The river does not hurry"]
COMMON = ("--threads", "1", "--context-size", "512", "--batch-size", "64")


@pytest.fixture(scope="module")
def servers() -> Iterator[tuple[ServerProcess, ServerProcess]]:
    with ServerProcess(MTP_BUNDLE, "--sessions", "1", *COMMON) as plain, \
            ServerProcess(MTP_BUNDLE, "--drafter", "mtp", "--draft-length", "3",
                          "--draft-policy", "fixed", *COMMON) as drafted:
        yield plain, drafted


def _client(server: ServerProcess) -> openai.OpenAI:
    return openai.OpenAI(base_url=server.url, api_key="unused", max_retries=0, timeout=120)


def _streamed(server: ServerProcess, prompt: str) -> tuple[list[str], dict[str, Any]]:
    """The text pieces of a streamed completion and its usage (extension fields too)."""
    pieces, usage = [], None
    for chunk in _client(server).completions.create(
            model="gemma4-tiny", prompt=prompt, max_tokens=40, stream=True,
            stream_options={"include_usage": True}, extra_body={"ignore_eos": True}):
        pieces += [c.text for c in chunk.choices if c.text]
        if chunk.usage is not None:
            usage = chunk.usage.model_dump()
    assert usage is not None
    return pieces, usage


def test_mtp_streams_the_undrafted_replies_with_draft_counts(servers: Any) -> None:
    plain, drafted = servers
    assert "1 session" in drafted.announcement
    total_drafted = total_accepted = 0
    for prompt in PROMPTS:
        want, plain_usage = _streamed(plain, prompt)
        got, usage = _streamed(drafted, prompt)
        assert "".join(got) == "".join(want), prompt
        assert usage["completion_tokens"] == plain_usage["completion_tokens"] == 40
        assert plain_usage.get("drafted_tokens") is None  # no drafter: no draft fields
        assert 0 <= usage["accepted_tokens"] <= usage["drafted_tokens"]
        total_drafted += usage["drafted_tokens"]
        total_accepted += usage["accepted_tokens"]
    assert total_drafted > 0 and total_accepted > 0
    draft = drafted.health()["draft"]
    assert draft["drafter"] == "mtp"
    assert draft["drafted"] >= total_drafted > 0 and draft["accepted"] >= total_accepted > 0
    assert plain.health()["draft"] is None


def test_mtp_chat_equals_the_undrafted_chat(servers: Any) -> None:
    plain, drafted = servers
    messages = [{"role": "user", "content": "What is two plus two?"}]
    want = _client(plain).chat.completions.create(model="gemma4-tiny", messages=messages,
                                                  max_tokens=24)
    got = _client(drafted).chat.completions.create(model="gemma4-tiny", messages=messages,
                                                   max_tokens=24)
    assert got.choices[0].message.content == want.choices[0].message.content
    assert got.usage is not None and (got.usage.model_extra or {})["drafted_tokens"] > 0


def test_mtp_on_a_batched_context_is_refused_before_loading() -> None:
    run = subprocess.run([sys.executable, "-m", "eliza_backends", "serve", str(MTP_BUNDLE),
                          "--drafter", "mtp", "--parallel", "2"], cwd=ROOT,
                         capture_output=True, text=True, timeout=60)
    assert run.returncode == 2, run.stderr
    assert "--drafter mtp and --parallel 2" in run.stderr and "--sessions" in run.stderr
