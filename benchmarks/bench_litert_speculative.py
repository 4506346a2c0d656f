#!/usr/bin/env python
"""The LiteRT token-exact session with the n-gram drafter vs without, in one run.

    python benchmarks/bench_litert_speculative.py [--repeat 5] [--gen 96] [--threads 1] [--json]

The tiny bundle, greedy, ``ignore_eos``, interleaved (plain, then each variant, per
repetition), medians of decode tokens/s (tokens / time from the first ``next()`` to the end).
Prompts: the oracle's training-text prompts (``kind == "train"``) and, as the best case, the
first of them followed by its own greedy continuation and the prompt again (the drafter then
proposes the continuation). Both runtimes of the session (Interpreter, CompiledModel).

Verification goes through the export's one-token ``decode`` signature (its prefill signatures
return no logits), one position at a time: only accepted drafts are fed, so a round costs one
``decode`` per produced token, as without a drafter. Every row checks the drafted output equals
the plain greedy output.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path
from typing import Any

from eliza_backends import InferenceContext, open_stream

ROOT = Path(__file__).resolve().parent.parent
TINY = ROOT / "examples" / "bundles" / "tiny"
RUNTIMES = {"interpreter": {"litert-lm": {"session": "interpreter", "runtime": "interpreter"}},
            "compiled": {"litert-lm": {"session": "interpreter", "runtime": "compiled"}}}


def run(ctx: InferenceContext, prompt: list[int], n_gen: int, threads: int,
        options: dict[str, Any], **cfg: Any) -> dict[str, Any]:
    with open_stream(ctx, backend="litert-lm", threads=threads, max_tokens=n_gen,
                     ignore_eos=True, options=options, **cfg) as s:
        s.prefill(prompt)
        t0 = time.perf_counter()
        tokens = [t for step in s for t in step.tokens]
        dt = time.perf_counter() - t0
        m = s.metrics
        return {"tokens": tokens, "tps": len(tokens) / dt, "drafted": m.drafted,
                "accepted": m.accepted}


def compare(ctx: InferenceContext, prompt: list[int], n_gen: int, threads: int, repeat: int,
            options: dict[str, Any], variants: dict[str, dict[str, Any]]) -> dict[str, Any]:
    runs: dict[str, list[dict[str, Any]]] = {"plain": [], **{v: [] for v in variants}}
    for _ in range(repeat):
        runs["plain"].append(run(ctx, prompt, n_gen, threads, options))
        for name, cfg in variants.items():
            runs[name].append(run(ctx, prompt, n_gen, threads, options, **cfg))
    base = statistics.median(r["tps"] for r in runs["plain"])
    expected = runs["plain"][0]["tokens"]
    rows = {}
    for name, rs in runs.items():
        tps = statistics.median(r["tps"] for r in rs)
        drafted = sum(r["drafted"] for r in rs)
        rows[name] = {
            "decode_tps": tps, "speedup": tps / base,
            "drafted_per_run": drafted / len(rs),
            "acceptance": (sum(r["accepted"] for r in rs) / drafted) if drafted else None,
            "identical_to_greedy": all(r["tokens"] == expected for r in rs),
        }
    return rows


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--repeat", type=int, default=5)
    ap.add_argument("--gen", type=int, default=96)
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args(argv)
    oracle = json.loads((TINY / "oracle.json").read_text())
    train = [c for c in oracle["prompts"] if c["kind"] == "train"]
    variants = {f"ngram k={k}": {"drafter": "ngram", "draft_length": k} for k in (4, 8)}
    report: dict[str, Any] = {}
    with InferenceContext(TINY) as ctx:
        for rt, options in RUNTIMES.items():
            first = train[0]["prompt_ids"]
            cont = run(ctx, first, args.gen, args.threads, options)["tokens"]
            prompts = {c["name"]: c["prompt_ids"] for c in train}
            prompts["best case (prompt+greedy+prompt)"] = first + cont + first[1:]
            report[rt] = {name: compare(ctx, ids, args.gen, args.threads, args.repeat, options,
                                        variants) for name, ids in prompts.items()}
    if args.json:
        print(json.dumps(report, indent=2))
        return 0
    for rt, groups in report.items():
        print(f"\n{rt}  (gen {args.gen}, threads {args.threads}, medians of {args.repeat})")
        for group, rows in groups.items():
            for name, r in rows.items():
                acc = "-" if r["acceptance"] is None else f"{100 * r['acceptance']:.0f}%"
                print(f"  {group[:34]:<35}{name:<11}{r['decode_tps']:>8.0f} tok/s  "
                      f"x{r['speedup']:.2f}  drafted {r['drafted_per_run']:>5.1f}  "
                      f"accept {acc:>5}  identical={r['identical_to_greedy']}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
