#!/usr/bin/env python
"""The MLX session with each speculative drafter vs without one, in one run.

    python benchmarks/bench_mlx_speculative.py [--repeat 7] [--gen 96] [--json]

The tiny bundle (MLX fp16; on Linux the mlx CPU backend), greedy, ``ignore_eos``, one loaded
model (one :class:`InferenceContext`). Prompts: the oracle's training-text prompts
(``kind == "train"``) and, as the best case, a training prompt followed by its own greedy
continuation (``--best-gen`` tokens) and the prompt again, the first for which greedy decoding
then reproduces that continuation, so the n-gram drafter proposes exactly the greedy output
(the tiny model derails on repeated context for some prompts and lengths), and 64 random
token ids (nothing to look up; with a 384-token vocabulary the n-gram drafter still finds
1-gram matches and proposes, so this is its worst case: drafts that are almost always wrong).
Variants: no drafter, the n-gram drafter (k = 4, 8) and the bundle's draft model
(``text/draft/tiny-draft-mlx``, k = 2, 4). Each repetition runs every variant once, the order
rotating between repetitions, so drift on a shared host hits all alike; medians.

``decode tok/s``: generated tokens / time from the first ``next()`` to the end of the stream.
``e2e tok/s``: generated tokens / time from before ``prefill()`` (a drafter session keeps the
prompt's last token for the first verification, so its prefill does one forward pass less and
its first step one more: e2e is the fairer number). Every row checks that the drafted output
equals the plain greedy output token for token. ``--probes`` adds two drafters StreamConfig
cannot name, on sessions built directly: one that never proposes (the cost of a drafter with
nothing to say) and the core's ``NgramDrafter`` with ``min_n=2`` (no 1-gram lookups).
"""

from __future__ import annotations

import argparse
import json
import platform
import random
import statistics
import sys
import time
from pathlib import Path
from typing import Any

from bench_speculative import Variant, compare
from bench_speculative import run as run_spec
from harness import TINY, emit

from eliza_backends import InferenceContext

VARIANTS: dict[str, dict[str, Any]] = {
    "plain": {},
    "ngram k=4": {"drafter": "ngram", "draft_length": 4},
    "ngram k=8": {"drafter": "ngram", "draft_length": 8},
    "draft model k=2": {"drafter": "model", "draft_length": 2},
    "draft model k=4": {"drafter": "model", "draft_length": 4},
}


def run(ctx: InferenceContext, prompt: list[int], n_gen: int, **cfg: Any) -> dict[str, Any]:
    """One MLX generation (:func:`bench_speculative.run` with this script's context size)."""
    return run_spec(ctx, prompt, n_gen, None, backend="mlx",
                    context_size=max(512, 2 * (len(prompt) + n_gen)), **cfg)


class _Silent:
    """A drafter that never proposes (what a drafter with nothing to look up costs)."""

    def propose(self, history: Any, k: int) -> list[int]:
        return []

    def truncate(self, n: int) -> None:
        pass

    def close(self) -> None:
        pass


def run_with(ctx: InferenceContext, prompt: list[int], n_gen: int, drafter: str,
             draft_length: int = 4) -> dict[str, Any]:
    """Like :func:`run`, on an MLX session built directly with a drafter StreamConfig cannot
    name: "silent" (never proposes) or "ngram-min2" (the core's NgramDrafter with min_n=2)."""
    from eliza_mlx.model import shared_weights
    from eliza_mlx.session import MLXSession

    from eliza_backends import StreamConfig
    from eliza_backends.runtime.speculative import NgramDrafter

    loaded = shared_weights(ctx, mlx_folder(ctx))
    cfg = StreamConfig(max_tokens=n_gen, ignore_eos=True, drafter="ngram",
                       draft_length=draft_length,
                       context_size=max(512, 2 * (len(prompt) + n_gen)))
    d: Any = _Silent() if drafter == "silent" else NgramDrafter(max_n=cfg.ngram_size, min_n=2)
    s = MLXSession(loaded, cfg, ctx, d)
    try:
        t0 = time.perf_counter()
        s.prefill(prompt)
        t1 = time.perf_counter()
        tokens: list[int] = []
        drafted = accepted = 0
        while True:
            st = s.next()
            tokens += st.tokens
            drafted += st.drafted
            accepted += st.accepted
            if st.final:
                break
        t2 = time.perf_counter()
    finally:
        s.close()
    return {"tokens": tokens, "tps": len(tokens) / (t2 - t1), "e2e_tps": len(tokens) / (t2 - t0),
            "drafted": drafted, "accepted": accepted}


def mlx_folder(ctx: InferenceContext) -> Path:
    """The MLX folder the factory opens for this bundle."""
    from eliza_mlx import MLX_FORMATS, MLXFactory

    return MLXFactory().artifact(ctx.bundle_dir, formats=MLX_FORMATS)


def compare_mlx(ctx: InferenceContext, prompt: list[int], n_gen: int, repeat: int,
                variants: dict[str, dict[str, Any]]) -> dict[str, Any]:
    """Every variant interleaved with rotation (:func:`bench_speculative.compare`)."""
    run(ctx, prompt, 8)  # warm-up, not measured
    spec: dict[str, Variant] = {}
    for name, cfg in variants.items():
        if name == "plain":
            continue
        custom = cfg.get("custom")
        spec[name] = (lambda c=custom: run_with(ctx, prompt, n_gen, c)) if custom else cfg
    return compare(ctx, prompt, n_gen, None, repeat, spec, pause=0.02, backend="mlx",
                   context_size=max(512, 2 * (len(prompt) + n_gen)))


def ids_bos(oracle: dict[str, Any]) -> int:
    """The tokenizer's BOS id (what every oracle prompt starts with)."""
    return int(oracle["prompts"][0]["prompt_ids"][0])


def best_case(ctx: InferenceContext, train: list[dict[str, Any]],
              n: int) -> tuple[str, list[int]] | None:
    """The first training prompt p whose greedy continuation c (n tokens) comes out again after
    p + c + p (the tiny model is not robust to repeated context: on some prompts it derails),
    so the n-gram drafter's proposals are the exact greedy output: (name, p + c + p)."""
    for case in train:
        p = case["prompt_ids"]
        c = run(ctx, p, n)["tokens"]
        ids = p + c + p[1:]
        if run(ctx, ids, n)["tokens"] == c:
            return case["name"], ids
    return None


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--repeat", type=int, default=7)
    ap.add_argument("--gen", type=int, default=96)
    ap.add_argument("--best-gen", type=int, default=32,
                    help="tokens generated in the best-case row (default 32)")
    ap.add_argument("--bundle", type=Path, default=TINY)
    ap.add_argument("--prompts", type=int, default=0, help="only the first N training prompts")
    ap.add_argument("--probes", action="store_true",
                    help="also a drafter that never proposes and NgramDrafter(min_n=2), on "
                    "MLX sessions built directly (StreamConfig cannot name them)")
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args(argv)
    variants = dict(VARIANTS)
    if args.probes:
        variants["silent drafter"] = {"custom": "silent"}
        variants["ngram min_n=2 k=4"] = {"custom": "ngram-min2"}
    oracle = json.loads((args.bundle / "oracle.json").read_text())
    train = [c for c in oracle["prompts"] if c["kind"] == "train"]
    if args.prompts:
        train = train[:args.prompts]
    report: dict[str, Any] = {"host": f"{platform.system()} {platform.machine()}",
                              "gen": args.gen, "repeat": args.repeat, "prompts": {}}
    with InferenceContext(args.bundle) as ctx:
        prompts = {c["name"]: (c["prompt_ids"], args.gen) for c in train}
        best = best_case(ctx, [c for c in oracle["prompts"] if c["kind"] == "train"],
                         args.best_gen)
        if best is not None:
            name, ids = best
            prompts[f"best case: {name} + its greedy {args.best_gen} + {name}"] = \
                (ids, args.best_gen)
        report["best_case_found"] = best is not None
        rng = random.Random(0)  # worst case for prompt lookup: text with no structure
        prompts["noise: 64 random token ids"] = \
            ([ids_bos(oracle)] + [rng.randrange(3, 384) for _ in range(63)], args.gen)
        for name, (ids, n) in prompts.items():
            report["prompts"][name] = compare_mlx(ctx, ids, n, args.repeat, variants)
    groups = report["prompts"]
    totals: dict[str, dict[str, list[float]]] = {}
    for group, rows in groups.items():
        if group not in {c["name"] for c in train}:
            continue  # training prompts only
        for variant, r in rows.items():
            t = totals.setdefault(variant, {"speedup": [], "e2e": [], "acc": []})
            t["speedup"].append(r["speedup"])
            t["e2e"].append(r["e2e_speedup"])
            if r["acceptance"] is not None:
                t["acc"].append(r["acceptance"])
    report["training_prompts_median"] = {
        name: {"speedup": statistics.median(t["speedup"]),
               "e2e_speedup": statistics.median(t["e2e"]),
               "acceptance": statistics.median(t["acc"]) if t["acc"] else None}
        for name, t in totals.items()}
    emit(report, args.json, render)
    return 0


def render(report: dict[str, Any]) -> str:
    """The report's tables: one line per variant and prompt, then the medians over prompts."""
    lines = [f"{report['host']}  gen {report['gen']}, medians of {report['repeat']} "
             "interleaved runs"]
    for group, rows in report["prompts"].items():
        lines.append(f"\n{group}")
        for name, r in rows.items():
            acc = "-" if r["acceptance"] is None else f"{100 * r['acceptance']:.0f}%"
            lines.append(f"  {name:<16}{r['decode_tps']:>8.0f} tok/s ({r['min']:.0f}-"
                         f"{r['max']:.0f})  x{r['speedup']:.2f}  e2e {r['e2e_tps']:>6.0f} "
                         f"x{r['e2e_speedup']:.2f}  drafted {r['drafted_per_run']:>5.1f}  "
                         f"accept {acc:>5}  identical={r['identical_to_greedy']}")
    lines.append("\ntraining prompts, median over prompts")
    for name, t in report["training_prompts_median"].items():
        acc = "-" if t["acceptance"] is None else f"{100 * t['acceptance']:.0f}%"
        lines.append(f"  {name:<16} x{t['speedup']:.2f}  e2e x{t['e2e_speedup']:.2f}  "
                     f"accept {acc:>5}")
    return "\n".join(lines)


if __name__ == "__main__":
    sys.exit(main())
