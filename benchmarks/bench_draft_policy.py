"""The draft policy on real models: n-gram drafting with ``draft_policy="auto"`` vs a fixed draft
length vs no drafter, beside the bound that acceptance and the batch cost curve allow.

    python benchmarks/bench_draft_policy.py --models A.gguf,B.gguf [--repeat 3] [--gen 64]
                                            [--threads 1] [--draft-length 4]
                                            [--workloads repeat,edit,...] [--json]

Per model (llama.cpp through the seam, greedy, one inference context, contenders interleaved
with rotation, medians) and per workload:

- input-grounded: ``repeat`` (copy a paragraph), ``edit`` (the paragraph with a word changed),
  ``quote`` (summarise with quotations): the continuation is mostly in the prompt;
- ``loop``: random in-vocabulary token ids as the prompt; greedy decoding of these small models
  falls into a loop after them, which the drafter matches;
- ``no-match``: the same prompt sampled at temperature 1 (seeded): the drafter's proposals
  rarely match, so this is the row where the policy must cost nothing (its output is a sample,
  not compared with the others').

Contenders: ``none`` (no drafter), ``ngram-fixed`` (``draft_policy="fixed"``, k = draft length)
and ``ngram-auto`` (the policy, at most that k). Reported: decode tok/s and its ratio to ``none``
(the median of per-round ratios, with their min-max: the contenders of a round run back to back,
so a round's ratio cancels the drift of a shared machine), the per-position acceptance of the
fixed rounds, the policy's batch cost curve (a forward pass over n tokens relative to one) and
the bound ``max_k yield(a, k) / cost(k + 1)``
(:func:`eliza_backends.runtime.draft_policy.speedup_bound`); ``auto / bound`` is the share of the
bound the policy reached. Every greedy run checks that its tokens equal the plain greedy ones.
"""

from __future__ import annotations

import argparse
import random
import statistics
import time
from typing import Any

from bench_llamacpp import model_bundle, model_label, paired_ratio
from harness import cell, emit, format_table, interleave, summarize

from eliza_backends import InferenceContext, open_stream
from eliza_backends.runtime.draft_policy import speedup_bound

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


#: per workload, how the stream samples (greedy where absent)
SAMPLING = {"no-match": {"temperature": 1.0, "seed": 7}}


def prompt_ids(ctx: InferenceContext, workload: str, threads: int) -> list[int]:
    """The workload's prompt as token ids (``loop``, ``no-match``: 96 seeded random ids)."""
    with open_stream(ctx, backend="llama.cpp", threads=threads) as s:
        if workload not in WORKLOADS:
            rng = random.Random(7)
            n = s.session.vocab_size
            return [rng.randrange(n // 8, n) for _ in range(96)]
        return s.session.tokenize(WORKLOADS[workload])


def run(ctx: InferenceContext, prompt: list[int], n_gen: int, threads: int, k: int,
        cfg: dict[str, Any]) -> dict[str, Any]:
    """One greedy generation: tokens, decode tok/s, per-round counts, the policy's curve."""
    with open_stream(ctx, backend="llama.cpp", threads=threads, max_tokens=n_gen,
                     ignore_eos=True, context_size=1024, draft_length=k, **cfg) as s:
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


ALL_WORKLOADS = (*WORKLOADS, "loop", "no-match")


def bench_model(name: str, repeat: int, n_gen: int, threads: int, draft_length: int,
                workloads: tuple[str, ...] = ALL_WORKLOADS) -> dict[str, Any]:
    """The workloads on one model."""
    out: dict[str, Any] = {}
    with InferenceContext(model_bundle(name)) as ctx:
        for workload in workloads:
            prompt = prompt_ids(ctx, workload, threads)
            sampling = SAMPLING.get(workload, {})
            runs = interleave(list(CONTENDERS), repeat,
                              lambda c, p=prompt, sp=sampling: run(ctx, p, n_gen, threads,
                                                                   draft_length,
                                                                   {**CONTENDERS[c], **sp}),
                              warmup=True)
            plain = runs["none"][0]["tokens"]
            for c, rs in runs.items():
                if not sampling and any(r["tokens"] != plain for r in rs):
                    raise SystemExit(f"{name} {workload} {c}: output differs from plain greedy")
            rows = {c: {"tps": summarize(r["tps"] for r in rs),
                        "acceptance": summarize(r["acceptance"] for r in rs),
                        "drafted": statistics.median(r["drafted"] for r in rs),
                        "final_k": rs[-1]["final_k"]} for c, rs in runs.items()}
            for c, r in rows.items():
                r["ratio"] = paired_ratio(runs[c], runs["none"], "tps")
                r["ratio_range"] = summarize(a["tps"] / b["tps"]
                                             for a, b in zip(runs[c], runs["none"], strict=True))
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
    parts = [f"{report['threads']} thread(s), {report['gen']} tokens, at most "
             f"{report['draft_length']} drafts, {report['repeat']} interleaved repeats, median "
             "(min-max); ratios: median (min-max) of per-round ratios to none"]
    for model, workloads in report["models"].items():
        k = report["draft_length"]
        head = ["workload", "none tok/s", f"fixed k={k} x", "auto x", "acceptance", "bound x",
                "auto / bound", f"cost(1..{k + 1})"]
        body = []
        for w, d in workloads.items():
            r = d["rows"]
            body.append([w, cell(r["none"]["tps"]), cell(r["ngram-fixed"]["ratio_range"],
                                                          fmt=".3f"),
                         cell(r["ngram-auto"]["ratio_range"], fmt=".3f"),
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
    ap.add_argument("--draft-length", type=int, default=4)
    ap.add_argument("--workloads", default=",".join(ALL_WORKLOADS))
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args(argv)
    workloads = tuple(args.workloads.split(","))
    unknown = set(workloads) - set(ALL_WORKLOADS)
    if unknown:
        raise SystemExit(f"unknown workloads {sorted(unknown)}; choose from {ALL_WORKLOADS}")
    report = {"threads": args.threads, "gen": args.gen, "repeat": args.repeat,
              "draft_length": args.draft_length,
              "models": {model_label(m): bench_model(m, args.repeat, args.gen, args.threads,
                                                     args.draft_length, workloads)
                         for m in args.models.split(",")}}
    emit(report, args.json, render)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
