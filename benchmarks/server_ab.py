"""A/B of server changes beside llama-server: ``serve --parallel 8`` from several source trees
(each a checkout or worktree of this repository) and ``llama-server -np 8``, all up at once,
each round :func:`bench_server.run_batch` (``--clients`` threads sending greedy streamed chat
requests back to back, ``max(8, 2 * clients)`` of them), the servers taking turns round by
round (the starting one rotates). Prints each server's median aggregate tok/s, median time to
first token, and the median of its per-round ratios to llama-server.

    python benchmarks/server_ab.py MODEL.gguf TREE[,TREE...] [--rounds 4] [--clients 8]
        [--threads 2] [--llama-server PATH]

A tree's server runs its own ``src`` and ``plugins/*/src`` (``start_eliza(source=...)``) with
this interpreter's installed dependencies.
"""

from __future__ import annotations

import argparse
import statistics
from pathlib import Path

from bench_server import (
    Server,
    find_llama_server,
    run_batch,
    start_eliza,
    start_llama_server,
    wait_ready,
)

TOKENS = 48


def one_round(server: Server, clients: int) -> tuple[float, float, float]:
    """(aggregate tok/s, median ms to first token, median ms per token after the first) of
    one round."""
    samples, wall = run_batch(server, clients, TOKENS)
    return (sum(s.tokens for s in samples) / wall,
            statistics.median(s.ttft for s in samples) * 1e3,
            statistics.median((s.seconds - s.ttft) / max(1, s.tokens - 1) for s in samples) * 1e3)


def start_servers(model: Path, trees: str, threads: int, llama_server: str | None,
                  servers: dict[str, Server]) -> None:
    """Start llama-server ``-np 8`` and ``serve --parallel 8`` from each of the comma-separated
    source ``trees`` (named by their folder) into ``servers`` (the caller stops them, also
    when this raises), and wait until each answers."""
    binary = find_llama_server(llama_server)
    if binary is None:
        raise SystemExit("llama-server not found: build it (benchmarks/build_llama_bench.sh)")
    servers["llama-server"] = start_llama_server(binary, model, 8, threads)
    for tree in trees.split(","):
        root = Path(tree).resolve()
        servers[root.name] = start_eliza(model, "parallel", 8, threads, source=root)
    for server in servers.values():
        wait_ready(server)


def ab_parser(description: str, rounds: int) -> argparse.ArgumentParser:
    """The arguments of a comparison of source trees beside llama-server: ``model``,
    ``trees``, ``--rounds`` (default ``rounds``), ``--threads``, ``--llama-server``."""
    ap = argparse.ArgumentParser(description=description)
    ap.add_argument("model", type=Path)
    ap.add_argument("trees", help="comma-separated source trees")
    ap.add_argument("--rounds", type=int, default=rounds)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--llama-server", help="the llama-server binary")
    return ap


def main() -> None:
    ap = ab_parser(__doc__.split("\n")[0], rounds=4)
    ap.add_argument("--clients", type=int, default=8)
    args = ap.parse_args()
    servers: dict[str, Server] = {}
    try:
        start_servers(args.model, args.trees, args.threads, args.llama_server, servers)
        for server in servers.values():
            one_round(server, args.clients)  # warm
        results: dict[str, list[tuple[float, float, float]]] = {name: [] for name in servers}
        names = list(servers)
        for r in range(args.rounds):
            for name in names[r % len(names):] + names[:r % len(names)]:
                results[name].append(one_round(servers[name], args.clients))
    finally:
        for server in servers.values():
            server.stop()
    base = results["llama-server"]
    for name, rows in results.items():
        ratios = [mine[0] / theirs[0] for mine, theirs in zip(rows, base, strict=True)]
        rate = statistics.median(r[0] for r in rows)
        print(f"{args.clients} clients  {name:16s} tok/s {rate:6.1f}"
              f"  TTFT p50 {statistics.median(r[1] for r in rows):6.1f} ms"
              f"  then {statistics.median(r[2] for r in rows):5.2f} ms/token"
              f"  vs llama-server {statistics.median(ratios):.3f}"
              f"  [{' '.join(f'{x:.2f}' for x in ratios)}]")


if __name__ == "__main__":
    main()
