"""Batch invariance through the server: 8 greedy requests (32 tokens each) sent alone, then in
bursts of 8 at once, to ``eliza-backends serve --parallel 8`` with one sequence per
``llama_decode`` (``batch_invariant=true``) and with shared steps (``batch_invariant=false``;
the default follows the weights: shared steps on Q4_1, Q5_1, K- and IQ-quants), and to llama.cpp's
``llama-server -np 8`` when it is built, in one run; prints, per server, how many burst replies
equal the solo ones and the bursts' median aggregate tokens/s.

    python benchmarks/server_batch_agreement.py MODEL.gguf [--completions] [--threads 2] \\
        [--bursts 3] [--llama-server PATH] [--option llama.cpp:KEY=VALUE ...]

``--completions`` sends text completions (a GGUF without a chat template, as Gemma 3's);
``--option`` goes to both eliza servers (e.g. ``llama.cpp:kv_unified=true``). llama-server is
found as bench_server.py finds it (``ELIZA_BENCH_CACHE``); without it that row is skipped.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import httpx

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))
from batch_agreement import PROMPTS
from bench_server import find_llama_server, start_llama_server, wait_ready
from server_process import ServerProcess

MAX_TOKENS = 32
PARALLEL = len(PROMPTS)


def ask(url: str, prompt: str, completions: bool) -> str:
    """One greedy reply of ``MAX_TOKENS`` tokens from the server at ``url`` (its /v1 base)."""
    body: dict[str, object] = {"max_tokens": MAX_TOKENS, "ignore_eos": True, "temperature": 0}
    if completions:
        reply = httpx.post(url + "/completions", timeout=600, json={**body, "prompt": prompt})
        return str(reply.json()["choices"][0]["text"])
    reply = httpx.post(url + "/chat/completions", timeout=600, json={
        **body, "messages": [{"role": "user", "content": prompt}]})
    return str(reply.json()["choices"][0]["message"]["content"])


def agreement(url: str, completions: bool, bursts: int) -> tuple[list[int], float]:
    """Replies equal to the solo ones per burst, and the bursts' median tokens/s."""
    alone = [ask(url, p, completions) for p in PROMPTS]
    same, rates = [], []
    for _ in range(bursts):
        start = time.perf_counter()
        with ThreadPoolExecutor(PARALLEL) as pool:
            together = list(pool.map(lambda p: ask(url, p, completions), PROMPTS))
        rates.append(PARALLEL * MAX_TOKENS / (time.perf_counter() - start))
        same.append(sum(a == b for a, b in zip(alone, together, strict=True)))
    return same, statistics.median(rates)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("model")
    ap.add_argument("--completions", action="store_true")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--bursts", type=int, default=3)
    ap.add_argument("--llama-server")
    ap.add_argument("--option", action="append", default=[])
    args = ap.parse_args()
    flags = ["--parallel", str(PARALLEL), "--threads", str(args.threads)]
    for option in args.option:
        flags += ["--option", option]
    rows: dict[str, tuple[list[int], float]] = {}
    for name, extra in [("eliza serve, batch_invariant=true (one sequence per llama_decode)",
                         ["--option", "llama.cpp:batch_invariant=true"]),
                        ("eliza serve, batch_invariant=false (shared steps)",
                         ["--option", "llama.cpp:batch_invariant=false"])]:
        with ServerProcess(args.model, *flags, *extra) as server:
            rows[name] = agreement(server.url, args.completions, args.bursts)
    binary = find_llama_server(args.llama_server)
    if binary is None:
        print("llama-server: not built (ELIZA_BENCH_CACHE=... bash benchmarks/"
              "build_llama_bench.sh llama-server), skipped", file=sys.stderr)
    else:
        llama = start_llama_server(binary, Path(args.model), PARALLEL, args.threads)
        try:
            wait_ready(llama)
            rows[f"llama-server -np {PARALLEL}"] = agreement(llama.url, args.completions,
                                                             args.bursts)
        finally:
            llama.stop()
    print(f"{Path(args.model).name}, {'completions' if args.completions else 'chat'}, "
          f"--threads {args.threads}, load average {os.getloadavg()[0]:.1f}")
    for name, (same, rate) in rows.items():
        print(f"  {name}: equal to alone per burst {same}, total {sum(same)}/"
              f"{len(same) * PARALLEL}; burst tok/s median {rate:.1f}")


if __name__ == "__main__":
    main()
