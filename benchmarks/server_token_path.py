"""Where one client's token time goes (issue 39, item 6): per generated token, the median ms of
``llama_decode`` in a bare C-level loop, ``Stream`` on a lone context, ``Stream`` on a
``parallel=8`` context from its own thread and with its loop on the scheduler's stepping thread
as ``serve`` runs it (each with its scheduler's own ``llama_decode`` time), and the gap between
streamed chunks at the socket for one client of ``serve --parallel 8``, ``serve --parallel 1``
and ``llama-server -np 8`` (when built); the rounds interleave every path.

    python benchmarks/server_token_path.py MODEL.gguf [--rounds 3] [--threads 1]
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time
from pathlib import Path
from typing import Any

import httpx
import llama_cpp as lc

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))
from bench_server import find_llama_server, start_llama_server, wait_ready
from server_process import ServerProcess

from eliza_backends import InferenceContext, open_stream

N = 64
SKIP = 8  # the first tokens' times (warm-up) are left out
PROMPT = "Tell me about the sea."


def bare_loop(model_path: str, threads: int) -> float:
    """ms per one-token ``llama_decode`` (with its logits read) on a fresh context."""
    model = lc.llama_model_load_from_file(model_path.encode(), lc.llama_model_default_params())
    params = lc.llama_context_default_params()
    params.n_ctx, params.n_threads, params.n_threads_batch = 512, threads, threads
    ctx = lc.llama_init_from_model(model, params)
    batch = lc.llama_batch_init(1, 0, 1)
    times = []
    for k in range(N):
        batch.token[0], batch.pos[0], batch.n_seq_id[0] = 1000 + k, k, 1
        batch.seq_id[0][0], batch.logits[0], batch.n_tokens = 0, 1, 1
        start = time.perf_counter()
        lc.llama_decode(ctx, batch)
        lc.llama_get_logits_ith(ctx, 0)
        times.append(time.perf_counter() - start)
    lc.llama_batch_free(batch)
    lc.llama_free(ctx)
    lc.llama_model_free(model)
    return statistics.median(times[SKIP:]) * 1e3


def in_process(model_path: str, threads: int, parallel: int, adopt: bool = False
               ) -> tuple[float, float | None]:
    """ms per token through ``Stream`` (and the scheduler's median decode time, batched);
    ``adopt``: the loop runs on the scheduler's stepping thread, as ``serve`` runs a streamed
    answer (no hop between threads per token)."""
    config: dict[str, Any] = {"backend": "llama.cpp", "max_tokens": N, "ignore_eos": True,
                              "threads": threads, "context_size": 512}
    with InferenceContext(model_path, parallel=parallel) as ctx, \
            open_stream(ctx, **config) as stream:
        scheduler = getattr(stream.session, "scheduler", None)

        def loop() -> list[float]:
            stream.prefill(PROMPT)
            gaps, last = [], time.perf_counter()
            for _step in stream:
                now = time.perf_counter()
                gaps.append(now - last)
                last = now
            return gaps

        adopted = scheduler.adopt(loop) if adopt and scheduler is not None else None
        gaps = loop() if adopted is None else adopted.result()
        decode = None if scheduler is None else statistics.median(
            r.decode_s for r in list(scheduler.records)[SKIP:]) * 1e3
    return statistics.median(gaps[SKIP:]) * 1e3, decode


def at_socket(url: str) -> float:
    """ms between streamed content chunks of one greedy chat request to ``url`` (/v1 base)."""
    gaps: list[float] = []
    last: float | None = None
    with httpx.stream("POST", url + "/chat/completions", timeout=600, json={
            "messages": [{"role": "user", "content": PROMPT}], "max_tokens": N,
            "ignore_eos": True, "temperature": 0, "stream": True}) as reply:
        for line in reply.iter_lines():
            if line.startswith("data:") and '"content"' in line:
                now = time.perf_counter()
                if last is not None:
                    gaps.append(now - last)
                last = now
    return statistics.median(gaps[SKIP:]) * 1e3


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("model")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--threads", type=int, default=1)
    args = ap.parse_args()
    threads = str(args.threads)
    rows: dict[str, list[float]] = {}

    def add(name: str, value: float | None) -> None:
        if value is not None:
            rows.setdefault(name, []).append(value)

    binary = find_llama_server(None)
    llama = start_llama_server(binary, Path(args.model), 8, args.threads) if binary else None
    with ServerProcess(args.model, "--parallel", "8", "--threads", threads) as p8, \
            ServerProcess(args.model, "--parallel", "1", "--threads", threads) as p1:
        servers = {"serve --parallel 8": p8.url, "serve --parallel 1": p1.url}
        if llama is not None:
            wait_ready(llama)
            servers["llama-server -np 8"] = llama.url
        for url in servers.values():
            at_socket(url)  # warm
        try:
            for _ in range(args.rounds):
                add("llama_decode, bare loop", bare_loop(args.model, args.threads))
                add("Stream, lone context", in_process(args.model, args.threads, 1)[0])
                per_token, decode = in_process(args.model, args.threads, 8)
                add("Stream, parallel=8 context", per_token)
                add("  its steps' llama_decode", decode)
                per_token, decode = in_process(args.model, args.threads, 8, adopt=True)
                add("Stream, parallel=8 context, loop on the stepping thread", per_token)
                add("  its steps' llama_decode (stepping thread)", decode)
                for name, url in servers.items():
                    add(f"{name}, one client, at the socket", at_socket(url))
        finally:
            if llama is not None:
                llama.stop()
    print(f"{Path(args.model).name}, --threads {args.threads}, {N} tokens, "
          f"load average {os.getloadavg()[0]:.1f}")
    for name, values in rows.items():
        print(f"  {name}: {statistics.median(values):.2f} ms/token "
              f"(rounds {', '.join(f'{v:.2f}' for v in values)})")


if __name__ == "__main__":
    main()
