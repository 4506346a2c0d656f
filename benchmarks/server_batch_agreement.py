"""Batch invariance through the server: 8 greedy chat requests (32 tokens each) sent alone, then
in bursts of 8 at once to one ``eliza-backends serve`` (extra flags passed through); prints how
many burst replies equal the solo ones and each burst's aggregate tokens/s.

    python benchmarks/server_batch_agreement.py MODEL.gguf --parallel 8 --threads 2 \\
        [--option llama.cpp:kv_unified=true]
"""

from __future__ import annotations

import statistics
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import httpx

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))
from batch_agreement import PROMPTS
from server_process import ServerProcess

BURSTS = 3
MAX_TOKENS = 32


def ask(server: ServerProcess, prompt: str) -> str:
    """One greedy chat reply of ``MAX_TOKENS`` tokens."""
    reply = httpx.post(server.url + "/chat/completions", timeout=600, json={
        "messages": [{"role": "user", "content": prompt}], "max_tokens": MAX_TOKENS,
        "ignore_eos": True}).json()
    return str(reply["choices"][0]["message"]["content"])


def main() -> None:
    if len(sys.argv) < 2:
        raise SystemExit(__doc__)
    model, flags = sys.argv[1], sys.argv[2:]
    with ServerProcess(model, *flags) as server:
        alone = [ask(server, p) for p in PROMPTS]
        same, rates = [], []
        for _ in range(BURSTS):
            start = time.perf_counter()
            with ThreadPoolExecutor(len(PROMPTS)) as pool:
                together = list(pool.map(lambda p: ask(server, p), PROMPTS))
            rates.append(len(PROMPTS) * MAX_TOKENS / (time.perf_counter() - start))
            same.append(sum(a == b for a, b in zip(alone, together, strict=True)))
    print(f"{' '.join(flags)}: equal to alone per burst {same}, total {sum(same)}/"
          f"{BURSTS * len(PROMPTS)}; burst tok/s median {statistics.median(rates):.1f}")


if __name__ == "__main__":
    main()
