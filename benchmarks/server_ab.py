"""A/B of server changes beside llama-server: ``serve --parallel 8`` from several source trees
(each a checkout or worktree of this repository) and ``llama-server -np 8``, all up at once,
``--clients`` client threads each sending greedy streamed chat requests (48 tokens,
``ignore_eos``) back to back, ``max(8, 2 * clients)`` requests a round, the servers taking
turns round by round (the starting one rotates). Prints each server's median aggregate tok/s,
median time to first token, and the median of its per-round ratios to llama-server.

    python benchmarks/server_ab.py MODEL.gguf TREE[,TREE...] [--rounds 4] [--clients 8]
        [--threads 2] [--llama-server PATH]

A tree's server runs with ``PYTHONPATH`` set to its ``src`` and ``plugins/*/src`` (this
interpreter's installed dependencies).
"""

from __future__ import annotations

import argparse
import statistics
import sys
import threading
import time
from pathlib import Path

import httpx

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))
from bench_server import find_llama_server, start_llama_server, wait_ready
from server_process import ServerProcess

QUESTIONS = ["Tell me about the sea.", "What is two plus two?", "Name three colors.",
             "Why is the sky blue?", "Write a haiku.", "What is AI?", "Count to five.",
             "Say hello."]
TOKENS = 48


def first_token_ms(url: str, question: str) -> float:
    """One streamed request; ms until its first content chunk."""
    body = {"max_tokens": TOKENS, "temperature": 0.0, "stream": True, "ignore_eos": True,
            "messages": [{"role": "user", "content": question}]}
    t0 = time.perf_counter()
    first: float | None = None
    with httpx.stream("POST", f"{url}/chat/completions", json=body, timeout=600) as reply:
        for line in reply.iter_lines():
            if first is None and '"content":"' in line and '"content":""' not in line:
                first = time.perf_counter()
    return ((first or time.perf_counter()) - t0) * 1e3


def one_round(url: str, clients: int) -> tuple[float, float]:
    """(aggregate tok/s, median ms to first token) of one round."""
    jobs = list(range(max(8, 2 * clients)))
    lock = threading.Lock()
    ttfts: list[float] = []

    def worker() -> None:
        while True:
            with lock:
                if not jobs:
                    return
                j = jobs.pop()
            ms = first_token_ms(url, QUESTIONS[j % len(QUESTIONS)])
            with lock:
                ttfts.append(ms)

    t0 = time.perf_counter()
    threads = [threading.Thread(target=worker) for _ in range(clients)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    return TOKENS * len(ttfts) / (time.perf_counter() - t0), statistics.median(ttfts)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("model")
    ap.add_argument("trees", help="comma-separated source trees")
    ap.add_argument("--rounds", type=int, default=4)
    ap.add_argument("--clients", type=int, default=8)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--llama-server", help="the llama-server binary")
    args = ap.parse_args()
    binary = find_llama_server(args.llama_server)
    if binary is None:
        raise SystemExit("llama-server not found: build it (benchmarks/build_llama_bench.sh)")
    llama = start_llama_server(binary, Path(args.model), 8, args.threads)
    servers = {"llama-server": llama.url}
    procs: list[ServerProcess] = []
    try:
        for tree in args.trees.split(","):
            root = Path(tree).resolve()
            path = [root / "src", *sorted(root.glob("plugins/*/src"))]
            proc = ServerProcess(args.model, "--parallel", "8", "--threads", str(args.threads),
                                 env={"PYTHONPATH": ":".join(map(str, path))})
            procs.append(proc)
            servers[root.name] = proc.url
        wait_ready(llama)
        for url in servers.values():
            one_round(url, args.clients)  # warm
        results: dict[str, list[tuple[float, float]]] = {name: [] for name in servers}
        names = list(servers)
        for r in range(args.rounds):
            for name in names[r % len(names):] + names[:r % len(names)]:
                results[name].append(one_round(servers[name], args.clients))
    finally:
        llama.stop()
        for proc in procs:
            proc.stop()
    base = results["llama-server"]
    for name, rows in results.items():
        ratios = [mine[0] / theirs[0] for mine, theirs in zip(rows, base, strict=True)]
        rate = statistics.median(r[0] for r in rows)
        print(f"{args.clients} clients  {name:16s} tok/s {rate:6.1f}"
              f"  TTFT p50 {statistics.median(r[1] for r in rows):6.1f} ms"
              f"  vs llama-server {statistics.median(ratios):.3f}"
              f"  [{' '.join(f'{x:.2f}' for x in ratios)}]")


if __name__ == "__main__":
    main()
