#!/usr/bin/env python
"""llama.cpp's own vectors for the tiny embedding bundle: run ``llama-server --embeddings``
(built from the llama.cpp tree vendored in the pinned llama-cpp-python sdist, by
benchmarks/build_llama_bench.sh) on the bundle's GGUF, send :data:`N_INPUTS` texts in ONE
``POST /v1/embeddings`` request, and write the answer to
``BUNDLE/reference-llama-server.json`` (tests/test_embeddings.py compares eliza-backends'
vectors with it: cosine >= 0.9999).

Usage:
    SERVER=$(ELIZA_BENCH_CACHE=/work/bench-cache bash benchmarks/build_llama_bench.sh llama-server)
    python tools/embedding_server_reference.py examples/bundles/embedding-tiny --server "$SERVER"

llama-server runs with its defaults for embeddings (the model's pooling, euclidean
normalisation, flash attention auto) on one thread; only the port is chosen.
"""

from __future__ import annotations

import argparse
import json
import socket
import subprocess
import sys
import time
import urllib.request
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
CORPUS = ROOT / "tools" / "tiny_corpus"
#: Inputs in the one request (the issue asks for a batch of 64).
N_INPUTS = 72


def texts(reference: dict[str, Any]) -> list[str]:
    """The bundle's reference texts, then lines of the tiny corpus (at most 40 words each,
    in file order) up to :data:`N_INPUTS`: deterministic."""
    out = list(reference["texts"])
    for path in sorted(CORPUS.glob("*.txt")):
        for line in path.read_text(encoding="utf-8").splitlines():
            words = line.split()
            if len(words) >= 3 and len(out) < N_INPUTS:
                out.append(" ".join(words[:40]))
    return out


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def post(url: str, body: dict[str, Any]) -> Any:
    request = urllib.request.Request(url, data=json.dumps(body).encode(),
                                     headers={"Content-Type": "application/json"})
    with urllib.request.urlopen(request, timeout=300) as answer:
        return json.loads(answer.read())


def wait_ready(base: str, proc: subprocess.Popen[bytes], timeout: float = 120) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise SystemExit(f"llama-server exited with {proc.returncode}")
        try:
            with urllib.request.urlopen(base + "/health", timeout=5) as answer:
                if answer.status == 200:
                    return
        except OSError:
            time.sleep(0.2)
    raise SystemExit("llama-server did not become ready")


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("bundle", type=Path)
    ap.add_argument("--server", type=Path, required=True, help="the llama-server binary")
    args = ap.parse_args(argv)
    reference = json.loads((args.bundle / "reference.json").read_text())
    gguf = next((args.bundle / "text").glob("*.gguf"))
    port = free_port()
    cmd = [str(args.server), "-m", str(gguf), "--embeddings", "--host", "127.0.0.1",
           "--port", str(port), "-t", "1", "-tb", "1", "--no-webui"]
    proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        base = f"http://127.0.0.1:{port}"
        wait_ready(base, proc)
        inputs = texts(reference)
        answer = post(base + "/v1/embeddings", {"input": inputs, "model": "embedding-tiny",
                                                "encoding_format": "float"})
        version = json.loads(urllib.request.urlopen(base + "/props", timeout=10).read()).get(
            "build_info", "")
    finally:
        proc.terminate()
        proc.wait(30)
    vectors = [item["embedding"] for item in sorted(answer["data"], key=lambda d: d["index"])]
    shown = ["llama-server", *cmd[1:]]
    shown[shown.index("--port") + 1] = "PORT"
    source = next((p.name for p in args.server.resolve().parents
                   if p.name.startswith("llama-bench-")), "?")
    out = {"command": " ".join(shown).replace(str(ROOT) + "/", ""),
           "llama_server_build": version, "llama_cpp_tree": source, "requests": 1,
           "texts": inputs,
           "usage": answer.get("usage"), "vectors": vectors}
    (args.bundle / "reference-llama-server.json").write_text(json.dumps(out, indent=1) + "\n")
    print(f"{len(vectors)} vectors from one request -> "
          f"{args.bundle / 'reference-llama-server.json'}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
