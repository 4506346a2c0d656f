"""Multi-turn chat: time to first token per turn with prefix reuse vs re-prefilling everything.

    python benchmarks/bench_chat.py [--backend llama.cpp] [--turns 8] [--threads 1] [--json]

Each turn appends a user message; the reusing stream (``prefill_messages``) prefills only the
new tokens, the fresh stream prefills the whole conversation. Reported per turn: conversation
length, tokens prefilled, and time to first token (median of ``--repeat`` runs interleaved with
rotation by ``benchmarks/harness.py``).
"""

from __future__ import annotations

import argparse
import json
import statistics
import time
from pathlib import Path
from typing import Any

from harness import TINY, interleave

from eliza_backends import InferenceContext, open_stream

QUESTIONS = ["What is two plus two?", "Name three colors.", "Where do fish live?",
             "What is four plus four?", "Tell me about the river.", "And the lighthouse?",
             "What is two plus two?", "Name three colors."]


def conversation(ctx: InferenceContext, backend: str, turns: int, threads: int,
                 reuse: bool) -> list[dict[str, float]]:
    rows = []
    msgs: list[dict[str, str]] = []
    stream = open_stream(ctx, backend=backend, threads=threads, max_tokens=24,
                         context_size=2048)
    with stream:
        for turn in range(turns):
            msgs.append({"role": "user", "content": QUESTIONS[turn % len(QUESTIONS)]})
            if not reuse:
                stream.reset()
            t0 = time.perf_counter()
            fed = stream.prefill_messages(msgs)
            first = stream.next(1)
            ttft = time.perf_counter() - t0
            reply = first.text + ("" if first.final else stream.text())
            msgs.append({"role": "assistant", "content": reply})
            rows.append({"turn": turn + 1, "context": stream.session.n_past, "prefilled": fed,
                         "ttft_ms": 1000 * ttft})
    return rows


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--backend", default="llama.cpp")
    ap.add_argument("--turns", type=int, default=8)
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--repeat", type=int, default=5)
    ap.add_argument("--bundle", type=Path, default=TINY)
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args(argv)
    with InferenceContext(args.bundle) as ctx:
        by_name = interleave(["reuse", "fresh"], args.repeat, lambda name: conversation(
            ctx, args.backend, args.turns, args.threads, name == "reuse"))
    runs = {True: by_name["reuse"], False: by_name["fresh"]}
    table: list[dict[str, Any]] = []
    for t in range(args.turns):
        row: dict[str, Any] = {"turn": t + 1, "context": runs[True][0][t]["context"]}
        for reuse, label in ((True, "reuse"), (False, "fresh")):
            row[f"{label}_prefilled"] = runs[reuse][0][t]["prefilled"]
            row[f"{label}_ttft_ms"] = statistics.median(r[t]["ttft_ms"] for r in runs[reuse])
        table.append(row)
    if args.json:
        print(json.dumps({"backend": args.backend, "turns": table}, indent=2))
    else:
        print(f"{args.backend}: turn, context tokens, prefilled (reuse / fresh), "
              "first token ms (reuse / fresh)")
        for r in table:
            print(f"  {r['turn']:>2} {r['context']:>5}  {r['reuse_prefilled']:>4} / "
                  f"{r['fresh_prefilled']:>4}   {r['reuse_ttft_ms']:6.2f} / "
                  f"{r['fresh_ttft_ms']:6.2f}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
