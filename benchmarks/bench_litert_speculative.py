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
import sys
from pathlib import Path
from typing import Any

from bench_speculative import compare, format_row, run

from eliza_backends import InferenceContext

ROOT = Path(__file__).resolve().parent.parent
TINY = ROOT / "examples" / "bundles" / "tiny"
RUNTIMES = {"interpreter": {"litert-lm": {"session": "interpreter", "runtime": "interpreter"}},
            "compiled": {"litert-lm": {"session": "interpreter", "runtime": "compiled"}}}


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
            cont = run(ctx, first, args.gen, args.threads, backend="litert-lm",
                       options=options)["tokens"]
            prompts = {c["name"]: c["prompt_ids"] for c in train}
            prompts["best case (prompt+greedy+prompt)"] = first + cont + first[1:]
            report[rt] = {name: compare(ctx, ids, args.gen, args.threads, args.repeat, variants,
                                        backend="litert-lm", options=options)
                          for name, ids in prompts.items()}
    if args.json:
        print(json.dumps(report, indent=2))
        return 0
    for rt, groups in report.items():
        print(f"\n{rt}  (gen {args.gen}, threads {args.threads}, medians of {args.repeat})")
        for group, rows in groups.items():
            for name, r in rows.items():
                print(format_row(group, name, r))
    return 0


if __name__ == "__main__":
    sys.exit(main())
