#!/usr/bin/env python
"""MTP acceptance of a bundle's assistant through the seam (llama.cpp, ``drafter="mtp"``)
beside llama-server's own MTP driver (``-md ASSISTANT --spec-type draft-mtp``) on the same
files, prompts (token ids) and draft length, greedy, both stopping at the model's end tokens.

Usage:
    .venv/bin/python tools/mtp_server_acceptance.py BUNDLE --server PATH/llama-server
        [--k 3] [--gen 64] [--port 8731]

Prints one JSON object: per prompt the seam's and the server's drafted / accepted counts and
whether their tokens are equal; the totals and the two acceptances (accepted / drafted).
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import time
import urllib.request
from pathlib import Path
from typing import Any

from eliza_backends import open_stream
from eliza_backends.testing import generated_tokens, run_to_end

#: plain prompts of the tiny Gemma 4 family's training text, and two chats
PROMPTS: list[str | list[dict[str, str]]] = [
    "We hold these truths to be self-evident,",
    "Four score and seven years ago",
    "The river does not hurry",
    "Ships that passed in the dark",
    [{"role": "user", "content": "Hello!"}],
    [{"role": "user", "content": "Name three colors."}],
]


def seam(bundle: Path, prompt: str | list[dict[str, str]], k: int, n: int) -> dict[str, Any]:
    """Prompt ids, generated ids, drafted, accepted through the seam."""
    with open_stream(bundle, backend="llama.cpp", threads=1, context_size=1024,
                     max_tokens=n, temperature=0.0, drafter="mtp", draft_length=k,
                     draft_policy="fixed") as s:
        if isinstance(prompt, str):
            s.prefill(prompt)
        else:
            s.prefill_messages(prompt)
        ids = list(s.session.history)
        steps = run_to_end(s.session)
        return {"prompt_ids": ids, "ids": generated_tokens(steps),
                "drafted": sum(st.drafted for st in steps),
                "accepted": sum(st.accepted for st in steps)}


def post(port: int, body: dict[str, Any]) -> dict[str, Any]:
    req = urllib.request.Request(f"http://127.0.0.1:{port}/completion",
                                 data=json.dumps(body).encode(),
                                 headers={"Content-Type": "application/json"})
    with urllib.request.urlopen(req, timeout=300) as r:
        data: dict[str, Any] = json.loads(r.read())
        return data


def wait_ready(port: int, proc: subprocess.Popen[bytes]) -> None:
    for _ in range(600):
        if proc.poll() is not None:
            raise SystemExit(f"llama-server exited with {proc.returncode}")
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{port}/health", timeout=2) as r:
                if r.status == 200:
                    return
        except OSError:
            pass
        time.sleep(0.5)
    raise SystemExit("llama-server did not become ready")


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("bundle", type=Path)
    ap.add_argument("--server", type=Path, required=True)
    ap.add_argument("--k", type=int, default=3)
    ap.add_argument("--gen", type=int, default=64)
    ap.add_argument("--port", type=int, default=8731)
    args = ap.parse_args(argv)
    target = next((args.bundle / "text").glob("*.gguf"))
    assistant = next((args.bundle / "text" / "draft" / "mtp").glob("*.gguf"))
    rows = [seam(args.bundle, p, args.k, args.gen) for p in PROMPTS]
    cmd = [str(args.server), "-m", str(target), "-md", str(assistant), "--spec-type",
           "draft-mtp", "--spec-draft-n-max", str(args.k), "--spec-draft-n-min", "0",
           "--spec-draft-p-min", "0", "-t", "1", "-c", "1024", "-np", "1", "--port",
           str(args.port), "--no-webui"]
    proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        wait_ready(args.port, proc)
        for row in rows:
            got = post(args.port, {"prompt": row["prompt_ids"], "n_predict": args.gen,
                                   "temperature": 0.0, "top_k": 1, "cache_prompt": False,
                                   "return_tokens": True})
            t = got.get("timings", {})
            row["server"] = {"drafted": int(t.get("draft_n", 0)),
                             "accepted": int(t.get("draft_n_accepted", 0)),
                             "same_tokens": list(got.get("tokens", [])) == row["ids"]}
    finally:
        proc.terminate()
        proc.wait(timeout=30)
    sd, sa = sum(r["drafted"] for r in rows), sum(r["accepted"] for r in rows)
    vd, va = sum(r["server"]["drafted"] for r in rows), sum(r["server"]["accepted"] for r in rows)
    print(json.dumps({
        "k": args.k, "gen": args.gen,
        "seam": {"drafted": sd, "accepted": sa, "acceptance": round(sa / max(1, sd), 4)},
        "llama_server": {"drafted": vd, "accepted": va, "acceptance": round(va / max(1, vd), 4)},
        "per_prompt": [{"prompt": p if isinstance(p, str) else p[-1]["content"],
                        "seam": [r["drafted"], r["accepted"]],
                        "server": [r["server"]["drafted"], r["server"]["accepted"]],
                        "same_tokens": r["server"]["same_tokens"]}
                       for p, r in zip(PROMPTS, rows, strict=True)]}, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
