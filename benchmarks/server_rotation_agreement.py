"""Replies under slot rotation (a reproducer, issue 39): 8 streaming greedy clients (chat and text
completions, as tests/test_parallel_serving.py sends them) at once to ``serve --parallel 4`` on
the tiny bundle with shared steps, ROUNDS times on one server; prints every reply that differs
from the same request served alone, with how often and its divergence gap (nats; a gap of a
few nats is not a near-tie: the reply read another conversation's cells). Extra arguments go
to the server (e.g. ``--cache-ram 0``).

    python benchmarks/server_rotation_agreement.py [ROUNDS] [SERVE ARGS ...]

Measured 2026-12-03 (30 rounds a server): with the prompt cache on (the default), main gave
replies 7.6-9.0 nats off their solo ones on 4 of 5 servers and the branch that lays steps out
by sequence id on most (in 1-19 of 30 rounds; e.g. the completion of ``In summer the garden
is`` answered `` your name?``, and ``What is two plus two?`` got ``en and crowded.``, the
garden text's continuation: another conversation's cells); with ``--cache-ram 0`` 7 servers x
30 rounds were all equal to the solo replies. The cause: across per-sequence KV caches
llama.cpp's ``llama_memory_seq_cp`` copies the source's cache at the next ``llama_decode``, and
a state the prompt cache loaded into the source in between was what the copy got; the engine
now refuses such a load until that decode (eliza_llamacpp.batch_engine). After the fix: 5
servers x 30 rounds all equal to the solo replies (before it, on the same branch: 4 of 4 servers
off, in 3-20 of 30 rounds). tests/test_batching.py makes the interleaving certain.
"""

from __future__ import annotations

import collections
import sys
import threading
from pathlib import Path
from typing import Any

import openai

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))
from conftest import TINY_BUNDLE
from near_ties import divergence_gap
from server_process import ServerProcess

from eliza_backends import chat_completion, completion

QUESTIONS = ["What is two plus two?", "Where do fish live?", "What is four plus four?",
             "Hello", "Why is the sky blue?", "Tell me about the river."]
TEXTS = ["Once upon a time", "The river does not hurry", "In summer the garden is"]
LOCAL: dict[str, Any] = {"threads": 1}


def prompt(i: int) -> Any:
    """Client ``i``'s prompt: a text completion for every third, else a chat message."""
    return TEXTS[i % 3] if i % 3 == 2 else [{"role": "user", "content": QUESTIONS[i % 6]}]


def ask(url: str, i: int, out: dict[int, str]) -> None:
    """Client ``i``'s streamed greedy reply of ``20 + i`` tokens into ``out[i]``."""
    api = openai.OpenAI(base_url=url, api_key="unused", max_retries=0, timeout=120)
    if i % 3 == 2:
        chunks = list(api.completions.create(model="tiny", prompt=TEXTS[i % 3],
                                             max_tokens=20 + i, stream=True))
        out[i] = "".join(c.choices[0].text for c in chunks if c.choices)
    else:
        stream = api.chat.completions.create(model="tiny", messages=prompt(i),
                                             max_tokens=20 + i, stream=True)
        out[i] = "".join(c.choices[0].delta.content or "" for c in stream if c.choices)


def alone(i: int) -> str:
    """Client ``i``'s reply from a lone in-process session."""
    if i % 3 == 2:
        return completion(TINY_BUNDLE, TEXTS[i % 3], max_tokens=20 + i, backend="llama.cpp",
                          config=LOCAL).choices[0].text
    reply = chat_completion(TINY_BUNDLE, prompt(i), max_tokens=20 + i, backend="llama.cpp",
                            config=LOCAL)
    return reply.choices[0].message.content or ""


def main() -> None:
    rounds = int(sys.argv[1]) if len(sys.argv) > 1 else 30
    seen: dict[int, collections.Counter[str]] = collections.defaultdict(collections.Counter)
    with ServerProcess(TINY_BUNDLE, "--backend", "llama.cpp", "--parallel", "4", "--threads",
                       "1", "--queue", "16", "--option", "llama.cpp:batch_invariant=false",
                       *sys.argv[2:]) as server:
        for _ in range(rounds):
            out: dict[int, str] = {}
            clients = [threading.Thread(target=ask, args=(server.url, i, out))
                       for i in range(8)]
            for t in clients:
                t.start()
            for t in clients:
                t.join()
            for i, text in out.items():
                seen[i][text] += 1
    for i in sorted(seen):
        want = alone(i)
        for got, n in seen[i].items():
            if got != want:
                gap = divergence_gap(TINY_BUNDLE, prompt(i), got, max_tokens=20 + i,
                                     config=LOCAL)
                print(f"client {i}: {n}/{rounds} {got!r} (alone {want!r}), gap {gap}")
    print(f"{rounds} rounds of 8 clients, server args {sys.argv[2:]}")


if __name__ == "__main__":
    main()
