"""Aggregate chat throughput of ``serve --parallel 1`` and ``--parallel 8`` in its modes: the
default (one KV cache per sequence, one sequence per ``llama_decode``), shared steps
(``batch_invariant=false``), and shared steps with one unified KV cache: 8 concurrent greedy
32-token chat requests per burst, 2 bursts per server start, the servers one after another and
rotated per round; medians and ratios to ``--parallel 1``, with the load average.

    python benchmarks/server_kv_layout.py MODEL.gguf [ROUNDS] [THREADS]
"""

from __future__ import annotations

import os
import statistics
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import httpx

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))
from batch_agreement import PROMPTS
from server_process import ServerProcess

MAX_TOKENS = 32
SHARED = ["--option", "llama.cpp:batch_invariant=false"]
CONFIGS = {"parallel 1": ["--parallel", "1", "--queue", "16"],
           "parallel 8 (default: one sequence per step)": ["--parallel", "8"],
           "parallel 8, shared steps": ["--parallel", "8", *SHARED],
           "parallel 8, shared steps, unified KV": ["--parallel", "8", *SHARED, "--option",
                                                    "llama.cpp:kv_unified=true"]}


def ask(server: ServerProcess, prompt: str) -> None:
    """One greedy chat reply of ``MAX_TOKENS`` tokens."""
    httpx.post(server.url + "/chat/completions", timeout=600, json={
        "messages": [{"role": "user", "content": prompt}], "max_tokens": MAX_TOKENS,
        "ignore_eos": True}).raise_for_status()


def main() -> None:
    if len(sys.argv) < 2:
        raise SystemExit(__doc__)
    model = sys.argv[1]
    rounds = int(sys.argv[2]) if len(sys.argv) > 2 else 1
    threads = sys.argv[3] if len(sys.argv) > 3 else "1"
    rates: dict[str, list[float]] = {name: [] for name in CONFIGS}
    for r in range(rounds):
        for name in list(CONFIGS)[::1 if r % 2 == 0 else -1]:
            with ServerProcess(model, "--threads", threads, *CONFIGS[name]) as server:
                ask(server, "Hello")
                for _ in range(2):
                    start = time.perf_counter()
                    with ThreadPoolExecutor(len(PROMPTS)) as pool:
                        list(pool.map(lambda p: ask(server, p), PROMPTS))
                    rates[name].append(len(PROMPTS) * MAX_TOKENS / (time.perf_counter() - start))
    base = statistics.median(rates["parallel 1"])
    print(f"load average {os.getloadavg()[0]:.1f} after the run")
    for name, values in rates.items():
        median = statistics.median(values)
        print(f"{name}: median {median:.1f} tok/s ({len(values)} bursts), "
              f"{median / base:.2f}x parallel 1")


if __name__ == "__main__":
    main()
