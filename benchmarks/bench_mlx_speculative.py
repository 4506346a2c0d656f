#!/usr/bin/env python
"""The MLX session with each speculative drafter vs without one, in one run.

    python benchmarks/bench_mlx_speculative.py [--repeat 7] [--gen 96] [--json]

The tiny bundle (MLX fp16; on Linux the mlx CPU backend), greedy, ``ignore_eos``, one loaded
model (one :class:`InferenceContext`). Prompts: the oracle's training-text prompts
(``kind == "train"``) and, as the best case, the first of them followed by its own greedy
continuation and the prompt again (the n-gram drafter then proposes the continuation).
Variants: no drafter, the n-gram drafter (k = 4, 8) and the bundle's draft model
(``text/draft/tiny-draft-mlx``, k = 2, 4). Each repetition runs every variant once, the order
rotating between repetitions, so drift on a shared host hits all alike; medians.

``decode tok/s``: generated tokens / time from the first ``next()`` to the end of the stream.
``e2e tok/s``: generated tokens / time from before ``prefill()`` (a drafter session keeps the
prompt's last token for the first verification, so its prefill does one forward pass less and
its first step one more: e2e is the fairer number). Every row checks that the drafted output
equals the plain greedy output token for token.
"""

from __future__ import annotations

import argparse
import json
import platform
import statistics
import sys
import time
from pathlib import Path
from typing import Any

from eliza_backends import InferenceContext, open_stream

ROOT = Path(__file__).resolve().parent.parent
TINY = ROOT / "examples" / "bundles" / "tiny"
VARIANTS: dict[str, dict[str, Any]] = {
    "plain": {},
    "ngram k=4": {"drafter": "ngram", "draft_length": 4},
    "ngram k=8": {"drafter": "ngram", "draft_length": 8},
    "draft model k=2": {"drafter": "model", "draft_length": 2},
    "draft model k=4": {"drafter": "model", "draft_length": 4},
}


def run(ctx: InferenceContext, prompt: list[int], n_gen: int, **cfg: Any) -> dict[str, Any]:
    """One generation: tokens, decode and end-to-end tok/s, drafted / accepted."""
    with open_stream(ctx, backend="mlx", max_tokens=n_gen, ignore_eos=True,
                     context_size=max(512, 2 * (len(prompt) + n_gen)), **cfg) as s:
        t0 = time.perf_counter()
        s.prefill(prompt)
        t1 = time.perf_counter()
        tokens = [t for step in s for t in step.tokens]
        t2 = time.perf_counter()
        m = s.metrics
        return {"tokens": tokens, "tps": len(tokens) / (t2 - t1),
                "e2e_tps": len(tokens) / (t2 - t0), "drafted": m.drafted,
                "accepted": m.accepted}


def compare(ctx: InferenceContext, prompt: list[int], n_gen: int, repeat: int,
            variants: dict[str, dict[str, Any]]) -> dict[str, Any]:
    """Interleave every variant ``repeat`` times; medians, speed-up, acceptance, parity."""
    names = list(variants)
    runs: dict[str, list[dict[str, Any]]] = {v: [] for v in names}
    run(ctx, prompt, 8)  # warm-up, not measured
    for i in range(repeat):
        for name in names[i % len(names):] + names[:i % len(names)]:
            time.sleep(0.02)
            runs[name].append(run(ctx, prompt, n_gen, **variants[name]))
        print(".", end="", file=sys.stderr, flush=True)
    base = statistics.median(r["tps"] for r in runs["plain"])
    base_e2e = statistics.median(r["e2e_tps"] for r in runs["plain"])
    expected = runs["plain"][0]["tokens"]
    rows = {}
    for name, rs in runs.items():
        tps = statistics.median(r["tps"] for r in rs)
        e2e = statistics.median(r["e2e_tps"] for r in rs)
        drafted = sum(r["drafted"] for r in rs)
        rows[name] = {
            "decode_tps": tps, "min": min(r["tps"] for r in rs), "max": max(r["tps"] for r in rs),
            "speedup": tps / base, "e2e_tps": e2e, "e2e_speedup": e2e / base_e2e,
            "drafted_per_run": drafted / len(rs),
            "acceptance": (sum(r["accepted"] for r in rs) / drafted) if drafted else None,
            "identical_to_greedy": all(r["tokens"] == expected for r in rs),
        }
    return rows


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--repeat", type=int, default=7)
    ap.add_argument("--gen", type=int, default=96)
    ap.add_argument("--bundle", type=Path, default=TINY)
    ap.add_argument("--prompts", type=int, default=0, help="only the first N training prompts")
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args(argv)
    oracle = json.loads((args.bundle / "oracle.json").read_text())
    train = [c for c in oracle["prompts"] if c["kind"] == "train"]
    if args.prompts:
        train = train[:args.prompts]
    report: dict[str, Any] = {"host": f"{platform.system()} {platform.machine()}",
                              "gen": args.gen, "repeat": args.repeat, "prompts": {}}
    with InferenceContext(args.bundle) as ctx:
        first = train[0]["prompt_ids"]
        cont = run(ctx, first, args.gen)["tokens"]
        prompts = {c["name"]: c["prompt_ids"] for c in train}
        prompts["best case (prompt+greedy+prompt)"] = first + cont + first[1:]
        for name, ids in prompts.items():
            report["prompts"][name] = compare(ctx, ids, args.gen, args.repeat, VARIANTS)
    print(file=sys.stderr)
    groups = report["prompts"]
    totals: dict[str, dict[str, list[float]]] = {}
    for rows in list(groups.values())[:-1]:  # training prompts only
        for name, r in rows.items():
            t = totals.setdefault(name, {"speedup": [], "e2e": [], "acc": []})
            t["speedup"].append(r["speedup"])
            t["e2e"].append(r["e2e_speedup"])
            if r["acceptance"] is not None:
                t["acc"].append(r["acceptance"])
    report["training_prompts_median"] = {
        name: {"speedup": statistics.median(t["speedup"]),
               "e2e_speedup": statistics.median(t["e2e"]),
               "acceptance": statistics.median(t["acc"]) if t["acc"] else None}
        for name, t in totals.items()}
    if args.json:
        print(json.dumps(report, indent=2))
        return 0
    print(f"{report['host']}  gen {args.gen}, medians of {args.repeat} interleaved runs")
    for group, rows in groups.items():
        print(f"\n{group}")
        for name, r in rows.items():
            acc = "-" if r["acceptance"] is None else f"{100 * r['acceptance']:.0f}%"
            print(f"  {name:<16}{r['decode_tps']:>8.0f} tok/s ({r['min']:.0f}-{r['max']:.0f})"
                  f"  x{r['speedup']:.2f}  e2e {r['e2e_tps']:>6.0f} x{r['e2e_speedup']:.2f}"
                  f"  drafted {r['drafted_per_run']:>5.1f}  accept {acc:>5}"
                  f"  identical={r['identical_to_greedy']}")
    print("\ntraining prompts, median over prompts")
    for name, t in report["training_prompts_median"].items():
        acc = "-" if t["acceptance"] is None else f"{100 * t['acceptance']:.0f}%"
        print(f"  {name:<16} x{t['speedup']:.2f}  e2e x{t['e2e_speedup']:.2f}  accept {acc:>5}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
