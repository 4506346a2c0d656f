"""Two checkouts of eliza-backends side by side: did a change move the seam's speed?

    python benchmarks/bench_versions.py --base /path/to/other/checkout [--repeat 5] [--json]

Each workload runs in a fresh process with each checkout's own ``.venv/bin/python`` (so each
imports its own eliza_backends and plugins), the two interleaved with rotation
(``benchmarks/harness.py``); medians with min-max and the ratio this checkout / base. The
workers use only the public API (``open_stream``), so any two versions can be compared.
Workloads (greedy, ``ignore_eos``; decode tok/s from the first token to the last, time to first
token from before the prefill):

* ``llama.cpp tiny`` / ``llama.cpp 0.85b q4_0``: one token per ``next()``;
* ``llama.cpp 0.85b ngram`` (prompt + its greedy continuation + prompt: the n-gram drafter's best
  case) and ``llama.cpp tiny draft model``;
* ``litert interpreter`` / ``litert compiled`` (+ ``ngram``) and ``mlx`` (+ ``ngram``, ``draft
  model``) on the tiny bundle.

The 0.85 B model is ``.bench-cache/random-0.85b-q4_0`` of this checkout
(tools/make_random_gguf.py), made once if missing. (Workers import nothing from this checkout
but the bundle paths: the harness is imported by the driver only.)
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
TINY = ROOT / "examples" / "bundles" / "tiny"
BIG = ROOT / ".bench-cache" / "random-0.85b-q4_0"
#: name -> (bundle, backend, threads, tokens, extra StreamConfig fields, best-case prompt)
WORKLOADS: dict[str, tuple[Path, str, int, int, dict[str, Any], bool]] = {
    "llama.cpp tiny": (TINY, "llama.cpp", 1, 128, {}, False),
    "llama.cpp tiny draft model": (TINY, "llama.cpp", 1, 96, {"drafter": "model"}, False),
    "llama.cpp 0.85b q4_0": (BIG, "llama.cpp", 2, 32, {}, False),
    "llama.cpp 0.85b ngram": (BIG, "llama.cpp", 2, 32, {"drafter": "ngram"}, True),
    "litert interpreter": (TINY, "litert-lm", 1, 128,
                           {"options": {"litert-lm": {"runtime": "interpreter"}}}, False),
    "litert compiled": (TINY, "litert-lm", 1, 128,
                        {"options": {"litert-lm": {"runtime": "compiled"}}}, False),
    "litert compiled ngram": (TINY, "litert-lm", 1, 128, {
        "options": {"litert-lm": {"runtime": "compiled"}}, "drafter": "ngram"}, True),
    "mlx": (TINY, "mlx", 1, 96, {}, False),
    "mlx ngram": (TINY, "mlx", 1, 96, {"drafter": "ngram"}, True),
    "mlx draft model": (TINY, "mlx", 1, 96, {"drafter": "model"}, False),
}
PROMPT = "The river ran past the old mill and the mill wheel turned all day in the sun."


def run_workload(name: str) -> dict[str, Any]:
    """One measurement of workload ``name`` in this process (a worker)."""
    from eliza_backends import open_stream

    bundle, backend, threads, n, extra, best = WORKLOADS[name]
    with open_stream(bundle, backend=backend, threads=threads, max_tokens=n, ignore_eos=True,
                     context_size=1024, **{k: v for k, v in extra.items()
                                           if k == "options"}) as plain:
        ids = plain.session.tokenize(PROMPT)
        if best:  # what the n-gram drafter can look up: the greedy continuation itself
            plain.prefill(ids)
            ids = ids + [t for s in plain for t in s.tokens] + ids[1:]
    with open_stream(bundle, backend=backend, threads=threads, max_tokens=n, ignore_eos=True,
                     context_size=1024, **extra) as stream:
        stream.prefill(ids[:8])  # warm-up: first-call costs are no part of the measurement
        stream.next(2)
        stream.reset()
        t0 = time.perf_counter()
        stream.prefill(ids)
        stamps = []
        for step in stream:
            stamps += [time.perf_counter()] * len(step.tokens)
    return {"ttft_ms": 1000 * (stamps[0] - t0),
            "decode_tps": (len(stamps) - 1) / (stamps[-1] - stamps[0]),
            "drafted": stream.metrics.drafted, "accepted": stream.metrics.accepted}


def render(report: dict[str, Any]) -> str:
    """One row per workload: this checkout vs the base, decode tok/s and first token."""
    from harness import cell, format_table

    head = ["workload", "decode tok/s (this)", "decode tok/s (base)", "ratio",
            "first token ms (this)", "first token ms (base)"]
    rows = []
    for name, r in report["workloads"].items():
        if "error" in r:
            rows.append([name, r["error"], "", "", "", ""])
            continue
        rows.append([name, cell(r["this"]["decode_tps"]), cell(r["base"]["decode_tps"]),
                     f"{r['decode_ratio']:.3f}", cell(r["this"]["ttft_ms"], fmt=".2f"),
                     cell(r["base"]["ttft_ms"], fmt=".2f")])
    return (f"this: {report['this']}\nbase: {report['base']}\n{report['repeat']} rounds, "
            "fresh process per run, interleaved with rotation; medians (min-max)\n"
            + format_table(head, rows))


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--base", type=Path, help="the other checkout (with its own .venv)")
    ap.add_argument("--repeat", type=int, default=5)
    ap.add_argument("--only", default="", help="comma list of workload names (default: all)")
    ap.add_argument("--json", action="store_true")
    ap.add_argument("--worker", help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    if args.worker:
        print(json.dumps(run_workload(args.worker)))
        return 0
    if args.base is None:
        ap.error("--base is required")
    from harness import emit, interleave, spawn, summarize

    sys.path.insert(0, str(ROOT / "tools"))
    from make_random_gguf import make

    make(BIG / "text" / "model-q4_0.gguf", preset="0.85b", qtype="q4_0")
    trees = {"this": ROOT, "base": args.base.resolve()}
    names = [n for n in WORKLOADS if not args.only or n in args.only.split(",")]
    report: dict[str, Any] = {"this": str(ROOT), "base": str(trees["base"]),
                              "repeat": args.repeat, "workloads": {}}
    for name in names:
        try:
            runs = interleave(list(trees), args.repeat, lambda tree, name=name: spawn(
                __file__, name, python=str(trees[tree] / ".venv" / "bin" / "python"),
                cwd=str(trees[tree])))
        except RuntimeError as exc:
            report["workloads"][name] = {"error": str(exc)}
            continue
        row = {tree: {k: summarize(r[k] for r in rs) for k in ("decode_tps", "ttft_ms")}
               for tree, rs in runs.items()}
        row["decode_ratio"] = row["this"]["decode_tps"]["median"] / \
            row["base"]["decode_tps"]["median"]
        row["drafted"] = {tree: rs[0]["drafted"] for tree, rs in runs.items()}
        report["workloads"][name] = row
    emit(report, args.json, render)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
