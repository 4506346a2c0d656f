"""``/v1/embeddings`` on Ray Serve: a replica of an embedding model's bundle runs the
server's :class:`~eliza_backends.server.embedding_service.EmbeddingService` under the same app,
so the official ``openai`` client gets the in-process vectors (one replica on the session's
one Ray cluster)."""

from __future__ import annotations

import math
from collections.abc import Iterator

import openai
import pytest
from conftest import ROOT
from ray import serve
from ray_cluster import free_port

from eliza_backends.openai.embedder import open_embedder
from eliza_backends.ray import deployment

EMBEDDING_BUNDLE = ROOT / "examples" / "bundles" / "embedding-tiny"
TEXTS = ["In summer the garden is", "Four score and seven years ago", "a"]


@pytest.fixture(scope="module")
def served(ray_session: None) -> Iterator[str]:
    try:
        port = free_port()
        serve.start(http_options={"host": "127.0.0.1", "port": port})
        serve.run(deployment(EMBEDDING_BUNDLE, num_replicas=1, config={"threads": 1},
                             name="eliza-embeddings"),
                  name="eliza-embeddings", route_prefix="/", blocking=False)
        yield f"http://127.0.0.1:{port}/v1"
    finally:
        serve.shutdown()


def test_a_replica_of_an_embedding_bundle_serves_v1_embeddings(served: str) -> None:
    with open_embedder(EMBEDDING_BUNDLE, threads=1) as embedder:
        local = embedder.embed(TEXTS).vectors
    client = openai.OpenAI(base_url=served, api_key="unused", max_retries=5, timeout=120)
    reply = client.embeddings.create(model="embedding-tiny", input=TEXTS)
    assert [d.index for d in reply.data] == [0, 1, 2]
    for got, want in zip(reply.data, local, strict=True):
        dot = math.fsum(x * y for x, y in zip(got.embedding, want, strict=True))
        assert dot > 0.999999
    with pytest.raises(openai.BadRequestError, match="embedding model"):
        client.chat.completions.create(model="embedding-tiny",
                                       messages=[{"role": "user", "content": "hi"}])
