"""``POST /v1/embeddings`` driven by the official ``openai`` SDK against the real server on the
tiny embedding bundle (llama.cpp): every ``input`` shape, ``encoding_format`` float and base64
(the SDK's default), ``dimensions``, 64 inputs in one request, ``usage``; the vectors equal the
in-process ones; typed 400s for what is refused, and for the wrong kind of model on either
side."""

from __future__ import annotations

import importlib.util
import json
import math
import re
from collections.abc import Iterator
from typing import Any

import httpx
import openai
import pytest
from conftest import ROOT, TINY_BUNDLE
from server_process import ServerProcess

from eliza_backends.openai.embedder import open_embedder

pytestmark = pytest.mark.skipif(importlib.util.find_spec("llama_cpp") is None,
                                reason="llama_cpp is not installed")

EMBEDDING_BUNDLE = ROOT / "examples" / "bundles" / "embedding-tiny"
REFERENCE = json.loads((EMBEDDING_BUNDLE / "reference.json").read_text())
TEXTS: list[str] = REFERENCE["texts"]


@pytest.fixture(scope="module")
def server() -> Iterator[ServerProcess]:
    with ServerProcess(EMBEDDING_BUNDLE, "--threads", "1") as served:
        yield served


@pytest.fixture(scope="module")
def client(server: ServerProcess) -> openai.OpenAI:
    return openai.OpenAI(base_url=server.url, api_key="unused", max_retries=0, timeout=120)


@pytest.fixture(scope="module")
def local() -> list[list[float]]:
    with open_embedder(EMBEDDING_BUNDLE, threads=1) as embedder:
        return embedder.embed(TEXTS).vectors


def cosine(a: list[float], b: list[float]) -> float:
    dot = math.fsum(x * y for x, y in zip(a, b, strict=True))
    return dot / math.sqrt(math.fsum(x * x for x in a) * math.fsum(y * y for y in b))


def test_every_input_shape_gives_the_in_process_vectors(
        client: openai.OpenAI, local: list[list[float]], server: ServerProcess) -> None:
    assert "embeddings, inputs up to 512 tokens" in server.announcement
    reply = client.embeddings.create(model="embedding-tiny", input=TEXTS)  # base64 on the wire
    assert reply.object == "list" and reply.model == "embedding-tiny"
    assert [d.index for d in reply.data] == list(range(len(TEXTS)))
    for got, want in zip(reply.data, local, strict=True):
        assert got.object == "embedding" and got.embedding == pytest.approx(want, abs=1e-6)
    tokens = sum(len(ids) for ids in REFERENCE["token_ids"])
    assert reply.usage.prompt_tokens == reply.usage.total_tokens == tokens
    floats = client.embeddings.create(model="embedding-tiny", input=TEXTS[0],
                                      encoding_format="float")
    # one input alone: flash attention's float16 rounding differs from the batch's (1e-4)
    assert cosine(floats.data[0].embedding, local[0]) > 0.999999
    by_ids = client.embeddings.create(model="embedding-tiny", input=REFERENCE["token_ids"],
                                      encoding_format="float")
    assert [d.embedding for d in by_ids.data] == [d.embedding for d in client.embeddings.create(
        model="embedding-tiny", input=TEXTS, encoding_format="float").data]
    one = client.embeddings.create(model="embedding-tiny", input=REFERENCE["token_ids"][2])
    assert len(one.data) == 1 and cosine(one.data[0].embedding, local[2]) > 0.999999


def test_64_inputs_in_one_request(client: openai.OpenAI, local: list[list[float]]) -> None:
    inputs = [TEXTS[i % len(TEXTS)] for i in range(64)]
    reply = client.embeddings.create(model="embedding-tiny", input=inputs)
    assert len(reply.data) == 64
    for i, item in enumerate(reply.data):
        assert item.index == i and cosine(item.embedding, local[i % len(TEXTS)]) > 0.999999


def test_dimensions_truncate_and_renormalise(client: openai.OpenAI) -> None:
    reply = client.embeddings.create(model="embedding-tiny", input=TEXTS[:2], dimensions=16)
    whole = client.embeddings.create(model="embedding-tiny", input=TEXTS[:2])
    for got, full in zip(reply.data, [d.embedding for d in whole.data], strict=True):
        assert len(got.embedding) == 16 and len(full) == 64
        norm = math.sqrt(math.fsum(x * x for x in full[:16]))
        assert got.embedding == pytest.approx([x / norm for x in full[:16]], abs=1e-6)


@pytest.mark.parametrize(("body", "param", "match"), [
    ({"input": "x", "dimensions": 20}, "dimensions", "dimensions=20 is not offered"),
    ({"input": "x", "encoding_format": "int8"}, "encoding_format", "encoding_format"),
    ({"input": []}, "input", "empty list"),
    ({"input": ""}, "input", "empty"),
    ({"input": [[1, 2], []]}, "input", r"input\[1\] is empty"),
    ({"input": [[1, 99999]]}, None, "outside the vocabulary"),
    ({"input": "x", "stream": True}, "stream", "stream"),
    ({"input": "x", "model": "other"}, "model", "serves the model"),
])
def test_refused_requests_are_typed_400s(server: ServerProcess, body: dict[str, Any],
                                         param: str | None, match: str) -> None:
    answer = httpx.post(server.url + "/embeddings", json=body, timeout=60)
    assert answer.status_code == (404 if param == "model" else 400), answer.text
    error = answer.json()["error"]
    assert error["param"] == param
    assert re.search(match, error["message"]), error


def test_generation_routes_on_an_embedding_server_are_400(server: ServerProcess,
                                                          client: openai.OpenAI) -> None:
    with pytest.raises(openai.BadRequestError, match="embedding model") as caught:
        client.chat.completions.create(model="embedding-tiny",
                                       messages=[{"role": "user", "content": "hi"}])
    assert caught.value.code == "ELIZA_ERR_UNSUPPORTED"
    health = server.health()
    assert health["status"] == "ok" and health["task"] == "embeddings"
    assert health["dimensions"] == 64 and health["served"] >= 1


def test_embeddings_on_a_generation_server_are_400() -> None:
    with ServerProcess(TINY_BUNDLE, "--sessions", "1", "--threads", "1") as served:
        client = openai.OpenAI(base_url=served.url, api_key="unused", max_retries=0)
        with pytest.raises(openai.BadRequestError, match="makes no embeddings") as caught:
            client.embeddings.create(model="tiny", input="hello")
        assert caught.value.code == "ELIZA_ERR_UNSUPPORTED"
