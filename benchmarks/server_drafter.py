"""``serve --drafter mtp`` against the undrafted server on the tiny Gemma 4 pair: 4 prompts x 64
greedy completion tokens per round, the three servers up together and rotated per round; prints
each server's median tokens/s, drafted / accepted totals and whether its replies equal the
plain server's.

    python benchmarks/server_drafter.py [ROUNDS]
"""

from __future__ import annotations

import statistics
import sys
import time
from pathlib import Path

import httpx

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))
from server_process import ServerProcess

ROOT = Path(__file__).resolve().parents[1]
BUNDLE = ROOT / "examples" / "bundles" / "gemma4-tiny"
PROMPTS = ["We hold these truths to be self-evident,", "Ships that passed in the dark",
           "The river does not hurry", "Four score and seven years ago"]
COMMON = ("--threads", "2", "--context-size", "512")
SERVERS = {"plain": ("--sessions", "1"),
           "mtp-auto": ("--drafter", "mtp", "--draft-length", "3"),
           "mtp-fixed3": ("--drafter", "mtp", "--draft-length", "3", "--draft-policy", "fixed")}
TOKENS = 64


def main() -> None:
    rounds = int(sys.argv[1]) if len(sys.argv) > 1 else 3
    servers = {name: ServerProcess(BUNDLE, *flags, *COMMON) for name, flags in SERVERS.items()}
    rates: dict[str, list[float]] = {name: [] for name in servers}
    texts: dict[str, list[str]] = {name: [] for name in servers}
    counts = {name: [0, 0] for name in servers}
    try:
        for r in range(rounds):
            for prompt in PROMPTS:
                for name in list(servers)[::1 if r % 2 == 0 else -1]:
                    start = time.perf_counter()
                    reply = httpx.post(servers[name].url + "/completions", timeout=300, json={
                        "prompt": prompt, "max_tokens": TOKENS, "ignore_eos": True}).json()
                    rates[name].append(TOKENS / (time.perf_counter() - start))
                    texts[name].append(reply["choices"][0]["text"])
                    usage = reply["usage"]
                    counts[name][0] += usage.get("drafted_tokens", 0)
                    counts[name][1] += usage.get("accepted_tokens", 0)
    finally:
        for server in servers.values():
            server.stop()
    base = statistics.median(rates["plain"])
    for name in servers:
        median = statistics.median(rates[name])
        print(f"{name}: median {median:.1f} tok/s ({median / base:.2f}x plain), drafted/accepted "
              f"{counts[name][0]}/{counts[name][1]}, replies equal to plain: "
              f"{texts[name] == texts['plain']}")


if __name__ == "__main__":
    main()
