"""Time to first token of the first request after a start against the later ones: fresh
``serve --parallel 1 --threads 1`` starts, with and without the warm-up, interleaved; 5 chat
requests of ~90 words each (``max_tokens`` 1), the server's own ``ttft_ms`` from its access log.

    python benchmarks/server_warmup.py BUNDLE STARTS
"""

import statistics
import sys
import time
from pathlib import Path

import httpx

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))
from server_process import ServerProcess

PROMPT_FILE = Path(__file__).resolve().parents[1] / "src/eliza_backends/convert/long_prompt.txt"


def first_and_later(bundle: str, warm: bool) -> tuple[float, float, int]:
    """One fresh server: the first request's TTFT (ms), the later ones' median, prompt size."""
    words = PROMPT_FILE.read_text().split()
    prompts = [" ".join(words[i * 90:(i + 1) * 90]) for i in range(5)]
    flags = ["--parallel", "1", "--threads", "1"] + ([] if warm else ["--no-warmup"])
    ttfts: list[float] = []
    with ServerProcess(bundle, *flags) as server:
        for prompt in prompts:
            httpx.post(server.url + "/chat/completions", timeout=120, json={
                "messages": [{"role": "user", "content": prompt}],
                "max_tokens": 1}).raise_for_status()
            time.sleep(0.3)  # the access record is written after the response
            records = [r for r in server.access_records()
                       if r["path"] == "/v1/chat/completions"]
            ttfts.append(records[-1]["ttft_ms"])
    return ttfts[0], statistics.median(ttfts[1:]), records[-1]["prompt_tokens"]


def main() -> None:
    if len(sys.argv) < 3:
        raise SystemExit(__doc__)
    bundle, starts = sys.argv[1], int(sys.argv[2])
    results: dict[str, list[tuple[float, float, int]]] = {"warm-up": [], "--no-warmup": []}
    for n in range(starts):
        for mode in list(results)[::1 if n % 2 == 0 else -1]:
            results[mode].append(first_and_later(bundle, mode == "warm-up"))
    for mode, rows in results.items():
        first = statistics.median(r[0] for r in rows)
        later = statistics.median(r[1] for r in rows)
        print(f"{mode}: first request {first:.1f} ms, later {later:.1f} ms, ratio "
              f"{first / later:.2f} ({len(rows)} starts, {rows[0][2]} prompt tokens)")


if __name__ == "__main__":
    main()
