"""Speculative decoding through the seam vs the same backend without a drafter, in one run.

    python benchmarks/bench_speculative.py [--repeat 3] [--gen 128] [--threads 2] [--json]

Four tables (llama.cpp, greedy, interleaved with rotation by ``benchmarks/harness.py``, medians):

(a) best case: n-gram lookup on the ~0.85 B random Q4_0 model with a prompt that already holds
    the exact greedy continuation (prompt + continuation + prompt), draft lengths 4 and 8;
(b) worst case: n-gram lookup on text with nothing to look up (random token ids);
(c) a draft model: the random ``small`` preset (same 32 000-token vocabulary) drafting for the
    0.85 B target: acceptance and speed-up reported as they are;
(d) the tiny bundle on prompts from its own training text, n-gram and its draft model.

Every row checks that the drafted output equals the plain greedy output.
"""

from __future__ import annotations

import argparse
import json
import random
import statistics
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from bench_llamacpp import model_bundle
from harness import ROOT, TINY, emit, interleave

from eliza_backends import InferenceContext, open_stream

sys.path.insert(0, str(ROOT / "tools"))


def big_bundle_with_draft() -> Path:
    """The 0.85 B Q4_0 bundle with the random ``small`` model under text/draft/."""
    from make_random_gguf import make

    bundle = model_bundle("q4_0")
    make(bundle / "text" / "draft" / "small-f16.gguf", preset="small", qtype="f16", seed=1)
    return bundle


def run(ctx: InferenceContext, prompt: list[int], n_gen: int, threads: int | None, *,
        backend: str = "llama.cpp", **cfg: Any) -> dict[str, Any]:
    """One greedy generation of ``n_gen`` tokens: its tokens, decode tok/s (from the first
    ``next()``), end-to-end tok/s (from before the prefill) and the drafter's counts."""
    cfg.setdefault("context_size", 4096)
    with open_stream(ctx, backend=backend, threads=threads, max_tokens=n_gen,
                     ignore_eos=True, **cfg) as s:
        t_start = time.perf_counter()
        s.prefill(prompt)
        t0 = time.perf_counter()
        tokens = [t for step in s for t in step.tokens]
        t1 = time.perf_counter()
        m = s.metrics
        return {"tokens": tokens, "tps": len(tokens) / (t1 - t0),
                "e2e_tps": len(tokens) / (t1 - t_start), "drafted": m.drafted,
                "accepted": m.accepted}


Variant = dict[str, Any] | Callable[[], dict[str, Any]]


def compare(ctx: InferenceContext, prompt: list[int], n_gen: int, threads: int | None,
            repeat: int, variants: dict[str, Variant], *, pause: float = 0.0,
            **common: Any) -> dict[str, Any]:
    """Interleave the plain run with every variant (a config for :func:`run`, or a function
    doing its own run); medians, speed-up, acceptance, parity. ``common`` goes to every
    :func:`run` (e.g. ``backend=``, ``options=``)."""
    configs: dict[str, Variant] = {"plain": {}, **variants}

    def one(name: str) -> dict[str, Any]:
        cfg = configs[name]
        return cfg() if callable(cfg) else run(ctx, prompt, n_gen, threads, **common, **cfg)

    runs = interleave(list(configs), repeat, one, pause=pause)
    base = statistics.median(r["tps"] for r in runs["plain"])
    base_e2e = statistics.median(r["e2e_tps"] for r in runs["plain"])
    expected = runs["plain"][0]["tokens"]
    rows = {}
    for name, rs in runs.items():
        tps = statistics.median(r["tps"] for r in rs)
        e2e = statistics.median(r["e2e_tps"] for r in rs)
        drafted = sum(r["drafted"] for r in rs)
        rows[name] = {
            "decode_tps": tps, "min": min(r["tps"] for r in rs),
            "max": max(r["tps"] for r in rs), "speedup": tps / base,
            "e2e_tps": e2e, "e2e_speedup": e2e / base_e2e,
            "drafted_per_run": drafted / len(rs),
            "acceptance": (sum(r["accepted"] for r in rs) / drafted) if drafted else None,
            "identical_to_greedy": all(r["tokens"] == expected for r in rs),
        }
    return rows


def format_row(group: str, name: str, r: dict[str, Any]) -> str:
    """One table line of a :func:`compare` row."""
    acc = "-" if r["acceptance"] is None else f"{100 * r['acceptance']:.0f}%"
    return (f"  {group[:34]:<35}{name:<18}{r['decode_tps']:>9.1f} tok/s "
            f"({r['min']:.1f}-{r['max']:.1f})  x{r['speedup']:.2f}  "
            f"drafted/run {r['drafted_per_run']:>5.1f}  accept {acc:>5}  "
            f"identical={r['identical_to_greedy']}")


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--gen", type=int, default=128)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--json", action="store_true")
    ap.add_argument("--tables", default="abcd")
    args = ap.parse_args(argv)
    report: dict[str, Any] = {"threads": args.threads, "gen": args.gen, "repeat": args.repeat}
    if set(args.tables) & set("abc"):
        bundle = big_bundle_with_draft()
        with InferenceContext(bundle) as ctx:
            with open_stream(ctx, backend="llama.cpp", threads=args.threads,
                             max_tokens=args.gen, ignore_eos=True) as s:
                prompt = s.session.tokenize("The river ran past the old mill and the mill "
                                            "wheel turned all day in the sun.")
                s.prefill(prompt)
                continuation = [t for step in s for t in step.tokens]
            if "a" in args.tables:
                best = prompt + continuation + prompt[1:]
                report["a_best_case_ngram"] = compare(
                    ctx, best, args.gen, args.threads, args.repeat,
                    {f"ngram k={k}": {"drafter": "ngram", "draft_length": k} for k in (4, 8)})
            if "b" in args.tables:
                rng = random.Random(0)
                noise = [1] + [rng.randrange(3, 32000) for _ in range(200)]
                report["b_worst_case_ngram"] = compare(
                    ctx, noise, args.gen, args.threads, args.repeat,
                    {"ngram k=4": {"drafter": "ngram", "draft_length": 4}})
            if "c" in args.tables:
                report["c_draft_model"] = compare(
                    ctx, prompt, args.gen, args.threads, args.repeat,
                    {f"draft model k={k}": {"drafter": "model", "draft_length": k}
                     for k in (2, 4)})
    if "d" in args.tables:
        oracle = json.loads((TINY / "oracle.json").read_text())
        train = [c for c in oracle["prompts"] if c["kind"] == "train"]
        with InferenceContext(TINY) as ctx:
            rows: dict[str, Any] = {}
            for case in train:
                rows[case["name"]] = compare(
                    ctx, case["prompt_ids"], 96, 1, args.repeat,
                    {"ngram k=4": {"drafter": "ngram", "draft_length": 4},
                     "draft model k=4": {"drafter": "model", "draft_length": 4}})
            report["d_tiny_training_text"] = rows
    emit(report, args.json, render)
    return 0


def render(report: dict[str, Any]) -> str:
    """The tables of a report: one line per variant (:func:`format_row`)."""
    lines = []
    for table, rows in report.items():
        if not isinstance(rows, dict):
            continue
        lines.append(f"\n{table}")
        nested = rows if all(isinstance(v, dict) and "decode_tps" not in v
                             for v in rows.values()) else {"": rows}
        for group, variants in nested.items():
            lines += [format_row(group, name, r) for name, r in variants.items()]
    return "\n".join(lines)


if __name__ == "__main__":
    raise SystemExit(main())
