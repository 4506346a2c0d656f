"""Batch invariance on a real quantized model: ``serve --parallel 8`` on SmolLM2-135M Q4_1 gives
every greedy chat request, sent 8 at once, exactly the reply it gets alone (as llama-server
``-np 8`` does): by default in shared steps on this model (its Q4_1 matmuls take llama.cpp's
``vec_dot`` at every batch size, so ``batch_invariant`` follows the weights to shared steps; one
KV cache per sequence, ``kv_unified=False``, lays each sequence out as alone), and with
``batch_invariant=true`` too (each ``llama_decode`` carries one sequence, see
``eliza_llamacpp.batch_engine``)."""

from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import httpx
import pytest
from server_process import ServerProcess

PROMPTS = ["The capital of France is", "Once upon a time, in a small village,",
           "def fibonacci(n):", "The three primary colors are", "Water boils at",
           "My favourite book is", "In 1969, the first humans", "To make a cup of tea, first"]


def _ask(server: ServerProcess, prompt: str) -> str:
    reply = httpx.post(server.url + "/chat/completions", timeout=600, json={
        "messages": [{"role": "user", "content": prompt}], "max_tokens": 32,
        "ignore_eos": True}).json()
    return str(reply["choices"][0]["message"]["content"])


@pytest.mark.parametrize("shared_steps", [True, False], ids=["default", "one-sequence-steps"])
def test_batched_chat_replies_equal_the_solo_ones(smollm2_source: Path,
                                                  shared_steps: bool) -> None:
    option = [] if shared_steps else ["--option", "llama.cpp:batch_invariant=true"]
    with ServerProcess(smollm2_source, "--parallel", "8", "--threads", "1", *option) as server:
        alone = [_ask(server, p) for p in PROMPTS]
        for _burst in range(2):
            with ThreadPoolExecutor(len(PROMPTS)) as pool:
                together = list(pool.map(lambda p: _ask(server, p), PROMPTS))
            assert together == alone
        per_step = server.health()["batch"]["mean_sequences_per_step"]
        assert per_step > 1 if shared_steps else per_step == 1
