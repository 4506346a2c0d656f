"""The draft policy on real models: n-gram drafting with ``draft_policy="auto"`` vs a fixed draft
length vs no drafter, beside the bound that acceptance and the batch cost curve allow.

    python benchmarks/bench_draft_policy.py --models A.gguf,B.gguf [--repeat 3] [--gen 64]
                                            [--threads 1] [--json]

Per model (llama.cpp through the seam, greedy, one inference context, contenders interleaved
with rotation, medians) and per workload:

- input-grounded: ``repeat`` (copy a paragraph), ``edit`` (the paragraph with a word changed),
  ``quote`` (summarise with quotations): the continuation is mostly in the prompt;
- ``no-match``: random in-vocabulary token ids (nothing for the n-gram drafter to find).

Contenders: ``none`` (no drafter), ``ngram-fixed`` (``draft_policy="fixed"``, k=4) and
``ngram-auto`` (the policy, at most k=4). Reported: decode tok/s and its ratio to ``none``, the
per-position acceptance of the fixed rounds, the policy's batch cost curve (a forward pass over
n tokens relative to one) and the bound ``max_k yield(a, k) / cost(k + 1)``
(:func:`eliza_backends.draft_policy.speedup_bound`); ``auto / bound`` is the share of the bound
the policy reached. Every run checks that its tokens equal the plain greedy ones.
"""

from __future__ import annotations

import argparse
import random
import statistics
import time
from typing import Any

from bench_llamacpp import model_bundle, model_label
from harness import cell, emit, format_table, interleave, summarize

from eliza_backends import InferenceContext, open_stream
from eliza_backends.draft_policy import speedup_bound

PARAGRAPH = ("The lighthouse stood on the northern cliff for two hundred years. Every night the "
             "keeper climbed the ninety steps, trimmed the wick and wound the clockwork that "
             "turned the lens, and every morning he wrote the weather in a leather book.")
WORKLOADS = {
    "repeat": f"Repeat this paragraph exactly.\n\n{PARAGRAPH}\n\nRepeated:\n",
    "edit": f"Rewrite the paragraph with 'keeper' replaced by 'guardian'.\n\n{PARAGRAPH}\n\n"
            "Rewritten:\n",
    "quote": f"Summarise the paragraph, quoting its sentences.\n\n{PARAGRAPH}\n\nSummary with "
             "quotes: \"",
}
CONTENDERS = {"none": {}, "ngram-fixed": {"drafter": "ngram", "draft_policy": "fixed"},
              "ngram-auto": {"drafter": "ngram", "draft_policy": "auto"}}
K = 4


def prompt_ids(ctx: InferenceContext, workload: str, threads: int) -> list[int]:
    """The workload's prompt as token ids (``no-match``: 96 seeded random ids)."""
    with open_stream(ctx, backend="llama.cpp", threads=threads) as s:
        if workload == "no-match":
            rng = random.Random(7)
            n = s.session.vocab_size
            return [rng.randrange(n // 8, n) for _ in range(96)]
        return s.session.tokenize(WORKLOADS[workload])


def run(ctx: InferenceContext, prompt: list[int], n_gen: int, threads: int,
        cfg: dict[str, Any]) -> dict[str, Any]:
    """One greedy generation: tokens, decode tok/s, per-round counts, the policy's curve."""
    with open_stream(ctx, backend="llama.cpp", threads=threads, max_tokens=n_gen,
                     ignore_eos=True, context_size=1024, draft_length=K, **cfg) as s:
        s.prefill(prompt)
        t0 = time.perf_counter()
        steps = list(s)
        dt = time.perf_counter() - t0
        policy = s.session.draft_policy
        ok = sum(st.accepted for st in steps)
        rejected = sum(1 for st in steps if st.accepted < st.drafted)
        return {"tokens": [t for st in steps for t in st.tokens],
                "tps": sum(len(st.tokens) for st in steps) / dt,
                "drafted": sum(st.drafted for st in steps), "accepted": ok,
                "acceptance": ok / (ok + rejected) if ok + rejected else None,
                "cost": policy.cost if policy else None,
                "final_k": policy.k if policy else None}


def bench_model(name: str, repeat: int, n_gen: int, threads: int) -> dict[str, Any]:
    """Every workload on one model."""
    out: dict[str, Any] = {}
    with InferenceContext(model_bundle(name)) as ctx:
        for workload in (*WORKLOADS, "no-match"):
            prompt = prompt_ids(ctx, workload, threads)
            runs = interleave(list(CONTENDERS), repeat,
                              lambda c, p=prompt: run(ctx, p, n_gen, threads, CONTENDERS[c]),
                              warmup=True)
            plain = runs["none"][0]["tokens"]
            for c, rs in runs.items():
                if any(r["tokens"] != plain for r in rs):
                    raise SystemExit(f"{name} {workload} {c}: output differs from plain greedy")
            rows = {c: {"tps": summarize(r["tps"] for r in rs),
                        "acceptance": summarize(r["acceptance"] for r in rs),
                        "drafted": statistics.median(r["drafted"] for r in rs),
                        "final_k": rs[-1]["final_k"]} for c, rs in runs.items()}
            base = rows["none"]["tps"]["median"]
            for r in rows.values():
                r["ratio"] = r["tps"]["median"] / base
            cost = next((r["cost"] for r in runs["ngram-auto"] if r["cost"]), None)
            a = rows["ngram-fixed"]["acceptance"]
            bound = None
            if cost and a:
                bound = max([1.0, *(speedup_bound(a["median"], k, cost)
                                    for k in range(1, len(cost)))])
            out[workload] = {"rows": rows, "cost": cost, "bound": bound,
                             "auto_share_of_bound": rows["ngram-auto"]["ratio"] / bound
                             if bound else None}
    return out


def render(report: dict[str, Any]) -> str:
    """One table per model."""
    parts = [f"{report['threads']} thread(s), {report['gen']} tokens, {report['repeat']} "
             "interleaved repeats, median (min-max)"]
    for model, workloads in report["models"].items():
        head = ["workload", "none tok/s", "fixed k=4 x", "auto x", "acceptance", "bound x",
                "auto / bound", "cost(1..5)"]
        body = []
        for w, d in workloads.items():
            r = d["rows"]
            body.append([w, cell(r["none"]["tps"]), f"{r['ngram-fixed']['ratio']:.3f}",
                         f"{r['ngram-auto']['ratio']:.3f}",
                         cell(r["ngram-fixed"]["acceptance"], fmt=".2f"),
                         f"{d['bound']:.2f}" if d["bound"] else "-",
                         f"{d['auto_share_of_bound']:.2f}" if d["auto_share_of_bound"] else "-",
                         " ".join(f"{c:.2f}" for c in d["cost"]) if d["cost"] else "-"])
        parts += ["", model, format_table(head, body)]
    return "\n".join(parts)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--models", default="tiny")
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--gen", type=int, default=64)
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args(argv)
    report = {"threads": args.threads, "gen": args.gen, "repeat": args.repeat,
              "models": {model_label(m): bench_model(m, args.repeat, args.gen, args.threads)
                         for m in args.models.split(",")}}
    emit(report, args.json, render)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
