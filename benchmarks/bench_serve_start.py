"""Server start-up: from spawning a server process to its first answered request (issue 42).

    python benchmarks/bench_serve_start.py [--gguf PATH] [--repeat 5] [--threads 1]
        [--llama-server PATH] [--max-tokens 1] [--baseline CHECKOUT] [--json OUT.json]

Contenders, all on the same GGUF (greedy, a 2048-token context, ``--threads`` threads):

- ``eliza serve --parallel 1``: ``eliza-backends serve BUNDLE --parallel 1`` (one sequence,
  as the two below), its warm-up included (the default: the first request is then not the
  one that pays for the first decode's allocations);
- ``eliza serve``: the same with the default ``--parallel`` (8 sequences in one context on
  llama.cpp);
- ``llama-server -np 1``: llama.cpp's own server (``benchmarks/build_llama_bench.sh
  llama-server``; ``--llama-server`` or found in ``$ELIZA_BENCH_CACHE`` / ``.bench-cache``),
  when built;
- ``eliza serve --parallel 1 @baseline``: the first one on another checkout's core and plugins
  (``--baseline``, e.g. ``git archive main src plugins``; run from ``PYTHONPATH``), for a
  before / after in the same interleaved run;
- ``minimal``: ``llama_cpp.Llama`` behind the standard library's ``http.server``: load, then
  listen; a ``POST`` tokenizes, evaluates and samples greedily (the least a Python server of
  this model can do; no OpenAI shapes, no validation, no streaming).

Each run spawns the server, then sends ``POST /v1/completions`` (a one-token completion of a
33-token prompt) every 10 ms until one is answered with 200 (connection refused and 503 while
loading are retried); the time from the spawn to that answer is the run's wall time, and the
server's CPU time (user + system, from ``wait4`` after it is killed) is taken beside it. Runs
are interleaved with rotation (``harness.interleave``), medians with min-max, ratios against
``minimal`` and, where present, ``llama-server``. The load average is recorded per run.
"""

from __future__ import annotations

import argparse
import http.client
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))

from bench_cold_start import PROMPT, plain_bundle, source_path  # noqa: E402
from bench_server import find_llama_server, free_port  # noqa: E402
from harness import ROOT, cell, format_table, interleave, summarize  # noqa: E402

MINIMAL_SERVER = r"""
import json, sys
from http.server import BaseHTTPRequestHandler, HTTPServer
import llama_cpp

gguf, threads, port, extra = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), sys.argv[4] == "1"
defaults = llama_cpp.llama_model_default_params

def patched():  # the plugin's extra-buffer-type choice on this host, as bench_cold_start.py
    params = defaults()
    params.use_extra_bufts = extra
    return params

llama_cpp.llama_model_default_params = patched
llama_cpp.llama_cpp.llama_model_default_params = patched
llm = llama_cpp.Llama(gguf, n_ctx=2048, n_threads=threads, n_threads_batch=threads,
                      verbose=False)

class Handler(BaseHTTPRequestHandler):
    def do_POST(self):
        body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
        llm.reset()
        llm.eval(llm.tokenize(body["prompt"].encode("utf-8")))
        out = []
        for _ in range(int(body.get("max_tokens", 16))):
            token = llm.sample(temp=0.0)
            if token == llm.token_eos():
                break
            out.append(token)
            llm.eval([token])
        text = llm.detokenize(out).decode("utf-8", errors="replace")
        reply = json.dumps({"choices": [{"index": 0, "text": text}]}).encode()
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(reply)))
        self.end_headers()
        self.wfile.write(reply)

    def log_message(self, *args):
        pass

HTTPServer(("127.0.0.1", port), Handler).serve_forever()
"""


def command(name: str, bundle: Path, gguf: Path, threads: int, port: int,
            llama_server: str | None) -> list[str]:
    """The command line that starts contender ``name`` on ``port``."""
    if name.startswith("eliza"):
        cli = [str(Path(sys.executable).with_name("eliza-backends"))]
        if name.endswith("@baseline"):  # the console script's code, from PYTHONPATH
            cli = [sys.executable, "-m", "eliza_backends"]
        extra = ["--parallel", "1"] if "--parallel 1" in name else []
        return [*cli, "serve", str(bundle), "--port", str(port), "--threads", str(threads),
                "--backend", "llama.cpp", "--context-size", "2048", "--model-name", "bench",
                "--log-level", "warning", *extra]
    if name.startswith("llama-server"):
        assert llama_server is not None
        return [llama_server, "-m", str(gguf), "--host", "127.0.0.1", "--port", str(port),
                "-c", "2048", "-np", "1", "-t", str(threads), "-tb", str(threads), "-b", "512",
                "--no-webui", "--log-disable"]
    from bench_cold_start import _seam_extra_buffers

    return [sys.executable, "-c", MINIMAL_SERVER, str(gguf), str(threads), str(port),
            "1" if _seam_extra_buffers() else "0"]


def first_answer(port: int, proc: subprocess.Popen[bytes], max_tokens: int,
                 timeout: float = 600) -> str:
    """Send the completion request every 10 ms until one is answered with 200; its text."""
    body = json.dumps({"model": "bench", "prompt": PROMPT, "max_tokens": max_tokens,
                       "temperature": 0}).encode()
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"the server exited with {proc.returncode}")
        conn = http.client.HTTPConnection("127.0.0.1", port, timeout=timeout)
        try:
            conn.request("POST", "/v1/completions", body,
                         {"Content-Type": "application/json"})
            resp = conn.getresponse()
            data = resp.read()
            if resp.status == 200:
                return str(json.loads(data)["choices"][0]["text"])
        except (ConnectionError, http.client.HTTPException, OSError):
            pass
        finally:
            conn.close()
        time.sleep(0.01)
    raise RuntimeError(f"no answer in {timeout} s")


def run_once(name: str, bundle: Path, gguf: Path, threads: int, max_tokens: int,
             llama_server: str | None, baseline: Path | None = None) -> dict[str, Any]:
    """One start: wall time from the spawn to the first answer, the server's CPU time
    (``baseline``: the checkout a ``@baseline`` contender runs)."""
    port = free_port()
    load = os.getloadavg()[0]
    env = dict(os.environ)
    if name.endswith("@baseline") and baseline is not None:
        env["PYTHONPATH"] = source_path(baseline)
    t0 = time.perf_counter()
    proc = subprocess.Popen(command(name, bundle, gguf, threads, port, llama_server),
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, cwd=ROOT,
                            env=env)
    try:
        text = first_answer(port, proc, max_tokens)
        wall = time.perf_counter() - t0
    finally:
        proc.send_signal(signal.SIGKILL)
        _, _, usage = os.wait4(proc.pid, 0)
        proc.returncode = -9
    return {"wall": wall, "cpu": usage.ru_utime + usage.ru_stime, "load": load, "text": text}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--gguf", type=Path, help="the GGUF (default: the first real model, "
                    "see benchmarks/real_models.py)")
    ap.add_argument("--repeat", type=int, default=5)
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--max-tokens", type=int, default=1)
    ap.add_argument("--llama-server", help="llama-server binary (default: the cached build)")
    ap.add_argument("--baseline", type=Path, help="another checkout (`git archive main src "
                    "plugins | tar -x -C DIR`): also start its `serve --parallel 1`")
    ap.add_argument("--json", type=Path, help="also write the report here")
    args = ap.parse_args(argv)
    os.environ.pop("PYTHONDONTWRITEBYTECODE", None)  # as after a pip install
    if args.gguf is None:
        from real_models import HINT, real_ggufs

        found = real_ggufs(None)
        if not found:
            print(HINT, file=sys.stderr)
            return 1
        args.gguf = found[0]
    args.gguf = args.gguf.resolve()  # the servers run in the repository's root
    cache = ROOT / ".bench-cache" / "cold-start"
    cache.mkdir(parents=True, exist_ok=True)
    bundle = plain_bundle(args.gguf, cache)
    server = find_llama_server(args.llama_server)
    names = ["eliza serve --parallel 1", "eliza serve", "minimal"]
    if args.baseline is not None:
        names.insert(1, "eliza serve --parallel 1 @baseline")
    if server:
        names.append("llama-server -np 1")

    def run(name: str) -> dict[str, Any]:
        return run_once(name, bundle, args.gguf, args.threads, args.max_tokens, server,
                        args.baseline)

    for name in names:  # warm-up: bytecode caches, the page cache
        run(name)
    runs = interleave(names, args.repeat, run)
    report: dict[str, Any] = {"gguf": str(args.gguf), "repeat": args.repeat,
                              "threads": args.threads, "max_tokens": args.max_tokens,
                              "llama_server": server, "contenders": {}, "samples": runs,
                              "baseline": None if args.baseline is None else
                              str(args.baseline)}
    for name, samples in runs.items():
        report["contenders"][name] = {k: summarize(s[k] for s in samples)
                                      for k in ("wall", "cpu", "load")}
    report["answers"] = sorted({s["text"] for samples in runs.values() for s in samples})
    print(render(report))
    if args.json:
        args.json.write_text(json.dumps(report, indent=2) + "\n", encoding="utf-8")
    return 0


def render(report: dict[str, Any]) -> str:
    """The table: wall and CPU medians (min-max), each against the references."""
    con = report["contenders"]
    refs = [r for r in ("minimal", "llama-server -np 1") if r in con]
    rows = []
    for name, s in con.items():
        ratios = [f"{s['wall']['median'] / con[r]['wall']['median']:.2f} / "
                  f"{s['cpu']['median'] / con[r]['cpu']['median']:.2f}" for r in refs]
        rows.append([name, cell(s["wall"], 1000, ".0f"), cell(s["cpu"], 1000, ".0f"), *ratios,
                     cell(s["load"], 1, ".1f")])
    head = [f"{report['repeat']} interleaved starts, threads {report['threads']}, ms: median "
            "(min-max); spawn to the first answered request; cpu: the server's"]
    if len(report["answers"]) != 1:
        head.append(f"WARNING: the servers answered differently: {report['answers']}")
    return "\n".join([*head, format_table(
        ["contender", "wall", "cpu", *(f"wall / cpu vs {r}" for r in refs), "load avg"],
        rows)])


if __name__ == "__main__":
    sys.exit(main())
