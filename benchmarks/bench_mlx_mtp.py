#!/usr/bin/env python
"""Gemma 4's MTP assistant on MLX (mlx-vlm's drafter, the core's loop) beside the llama.cpp
seam's, on the same prompts and draft length, in one run.

    python benchmarks/bench_mlx_mtp.py [--bundle DIR] [--k 3] [--repeat 5] [--gen 64]
                                       [--threads 1] [--json]

The tiny Gemma 4 family (``examples/bundles/gemma4-tiny``: target + assistant, f32, the MLX
folders and the GGUFs made from the same weights), greedy, ``ignore_eos``, one
:class:`InferenceContext`.

Acceptance: every oracle prompt (``oracle.json``, its 32-token continuations), once per
backend with ``drafter="mtp"``, ``draft_policy="fixed"``, ``draft_length=k``: drafted and
accepted as each step reports them (the same count on both backends), and whether the output
equals that backend's plain greedy output and the oracle's.

Speed: the oracle's training-text prompts, ``--gen`` tokens, plain vs MTP per backend,
interleaved with rotation (:func:`bench_speculative.compare`), medians of decode tok/s and
the ratio to plain. The tiny pair cannot show a speed-up on a CPU: its forward passes cost
little next to the per-round Python work and the assistant's own passes.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any

from bench_speculative import compare
from harness import ROOT, emit

from eliza_backends import InferenceContext, open_stream

BACKENDS = ("llama.cpp", "mlx")


def greedy(ctx: InferenceContext, backend: str, prompt: list[int], n: int, threads: int,
           **cfg: Any) -> tuple[list[int], int, int]:
    """(tokens, drafted, accepted) of one greedy generation of ``n`` tokens."""
    with open_stream(ctx, backend=backend, threads=threads, max_tokens=n, ignore_eos=True,
                     context_size=1024, **cfg) as s:
        s.prefill(prompt)
        steps = list(s)
    return ([t for st in steps for t in st.tokens], sum(st.drafted for st in steps),
            sum(st.accepted for st in steps))


def acceptance(ctx: InferenceContext, cases: list[dict[str, Any]], k: int,
               threads: int) -> dict[str, Any]:
    """Per backend: drafted, accepted, acceptance, prompts equal to plain greedy / oracle."""
    mtp = {"drafter": "mtp", "draft_length": k, "draft_policy": "fixed"}
    out: dict[str, Any] = {}
    for backend in BACKENDS:
        rows, drafted, accepted, same, oracle = {}, 0, 0, 0, 0
        for case in cases:
            n = len(case["continuation_ids"])
            plain, _, _ = greedy(ctx, backend, case["prompt_ids"], n, threads)
            toks, d, a = greedy(ctx, backend, case["prompt_ids"], n, threads, **mtp)
            rows[case["name"]] = {"drafted": d, "accepted": a, "equals_plain": toks == plain}
            drafted, accepted = drafted + d, accepted + a
            same += toks == plain
            oracle += toks == case["continuation_ids"]
        out[backend] = {"drafted": drafted, "accepted": accepted,
                        "acceptance": round(accepted / max(1, drafted), 4),
                        "equal_to_plain": f"{same}/{len(cases)}",
                        "equal_to_oracle": f"{oracle}/{len(cases)}", "per_prompt": rows}
    out["difference"] = round(out["mlx"]["acceptance"] - out["llama.cpp"]["acceptance"], 4)
    return out


def speed(ctx: InferenceContext, cases: list[dict[str, Any]], k: int, n_gen: int, repeat: int,
          threads: int) -> dict[str, Any]:
    """Per backend and prompt: plain vs MTP decode tok/s (medians), ratio, acceptance."""
    mtp = {"drafter": "mtp", "draft_length": k, "draft_policy": "fixed"}
    return {backend: {case["name"]: compare(ctx, case["prompt_ids"], n_gen, threads, repeat,
                                            {"mtp": mtp}, backend=backend, context_size=1024)
                      for case in cases} for backend in BACKENDS}


def render(report: dict[str, Any]) -> str:
    acc = report["acceptance"]
    lines = [f"MTP acceptance, k={report['k']}, {report['prompts']} oracle prompts x 32 tokens:"]
    for backend in BACKENDS:
        r = acc[backend]
        lines.append(f"  {backend:<10} drafted {r['drafted']:>4}  accepted {r['accepted']:>4}  "
                     f"acceptance {r['acceptance']:.4f}  equal to plain {r['equal_to_plain']}"
                     f"  to oracle {r['equal_to_oracle']}")
    lines.append(f"  difference (mlx - llama.cpp): {acc['difference']:+.4f}")
    lines.append(f"decode tok/s, {report['gen']} tokens, medians of {report['repeat']}:")
    for backend, per in report["speed"].items():
        for name, rows in per.items():
            plain, mtp = rows["plain"], rows["mtp"]
            lines.append(f"  {backend:<10} {name:<12} plain {plain['decode_tps']:>7.1f}  mtp "
                         f"{mtp['decode_tps']:>7.1f}  x{mtp['speedup']:.2f}  accept "
                         f"{100 * (mtp['acceptance'] or 0):.0f}%  identical "
                         f"{mtp['identical_to_greedy']}")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--bundle", type=Path, default=ROOT / "examples" / "bundles" / "gemma4-tiny")
    ap.add_argument("--k", type=int, default=3)
    ap.add_argument("--repeat", type=int, default=5)
    ap.add_argument("--gen", type=int, default=64)
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args(argv)
    cases = json.loads((args.bundle / "oracle.json").read_text())["prompts"]
    train = [c for c in cases if c["kind"] == "train"][:3]
    with InferenceContext(args.bundle) as ctx:
        report = {"k": args.k, "prompts": len(cases), "gen": args.gen, "repeat": args.repeat,
                  "acceptance": acceptance(ctx, cases, args.k, args.threads),
                  "speed": speed(ctx, train, args.k, args.gen, args.repeat, args.threads)}
    emit(report, args.json, render)
    return 0


if __name__ == "__main__":
    sys.exit(main())
