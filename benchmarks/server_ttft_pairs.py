"""Time to first token at one client, paired request by request: llama-server ``-np 8`` and
``serve --parallel 8`` from one or more source trees, all up at once, each question of
``bench_server.py`` sent to every server in turn (a new connection each, as ``bench_server.py``
does; which server goes first rotates), so a pair shares the machine's speed of the moment.
Prints each server's median time to the first event and to the first content, and the median
of its paired differences to llama-server (issue 39).

    python benchmarks/server_ttft_pairs.py MODEL.gguf TREE[,TREE...] [--rounds 12]
        [--threads 2] [--llama-server PATH]

The first round is a warm-up (every question once on every server) and is not counted.
"""

from __future__ import annotations

import json
import statistics
import time

from bench_server import QUESTIONS, Server
from server_ab import ab_parser, start_servers


def first_times(server: Server, question: str) -> tuple[float, float]:
    """(ms to the first event, ms to the first content) of one streamed greedy answer."""
    import httpx

    body = {"model": server.model, "max_tokens": 48, "temperature": 0.0, "stream": True,
            "ignore_eos": True, "messages": [{"role": "user", "content": question}]}
    t0 = time.perf_counter()
    first_event = first_content = None
    with httpx.stream("POST", f"{server.url}/chat/completions", json=body, timeout=60) as resp:
        resp.raise_for_status()
        for line in resp.iter_lines():
            if not line.startswith("data: {"):
                continue
            now = time.perf_counter()
            first_event = first_event or now
            choices = json.loads(line[6:]).get("choices", [])
            if first_content is None and any(c.get("delta", {}).get("content") for c in choices):
                first_content = now
    end = time.perf_counter()
    return ((first_event or end) - t0) * 1e3, ((first_content or end) - t0) * 1e3


def main() -> None:
    args = ab_parser(__doc__.split("\n")[0], rounds=12).parse_args()
    servers: dict[str, Server] = {}
    try:
        start_servers(args.model, args.trees, args.threads, args.llama_server, servers)
        names = list(servers)
        times: dict[str, list[tuple[float, float]]] = {name: [] for name in names}
        turn = 0
        for rnd in range(args.rounds):
            for question in QUESTIONS[:8]:
                order = names[turn % len(names):] + names[:turn % len(names)]
                turn += 1
                for name in order:
                    sample = first_times(servers[name], question)
                    if rnd:
                        times[name].append(sample)
    finally:
        for server in servers.values():
            server.stop()
    base = times["llama-server"]
    for name in names:
        own = times[name]
        paired = statistics.median(a[1] - b[1] for a, b in zip(own, base, strict=True))
        print(f"{name:16s} first event {statistics.median(s[0] for s in own):6.1f} ms  "
              f"first content {statistics.median(s[1] for s in own):6.1f} ms  "
              f"paired vs llama-server {paired:+5.1f} ms  ({len(own)} requests)")


if __name__ == "__main__":
    main()
