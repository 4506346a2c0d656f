"""Gemma 4's MTP assistant through the seam (``drafter="mtp"``) beside plain decoding, the n-gram
drafter and llama.cpp's own MTP driver, on a target + assistant pair (the tiny Gemma 4 family).

    python benchmarks/bench_mtp.py --bundle DIR [--repeat 3] [--gen 64] [--threads 1]
                                   [--draft-length 3] [--spec-simple PATH] [--json]

Per prompt (llama.cpp through the seam, greedy, one inference context, contenders interleaved
with rotation, medians): ``none``, ``ngram`` (fixed k), ``mtp`` (fixed k) and ``mtp-auto``
(``draft_policy="auto"``, at most k). Reported: decode tok/s and the paired ratio to ``none``
(median of per-round ratios, min-max), acceptance as llama.cpp counts it (accepted / drafted
at fixed k), the target's batch cost curve and the MTP drafting cost per token (in one-token
target decodes; each the fastest of many timings, :func:`clean_costs`: the policy's own running
estimates follow whole rounds on a shared machine and are noisier) and the speed-up bound
``max_k yield(a, k) / (cost(k + 1) + k * draft_cost)``
(:func:`eliza_backends.runtime.draft_policy.speedup_bound`, ``a`` the per-position acceptance); the
bound leaves out the per-round Python work (acceptance, staging, the loop). Every run's tokens
are compared with the plain greedy ones (``same``: every
drafted contender gave them; a batched verify pass can round a near-tie differently from a
one-token pass, which random weights hit and trained ones rarely).

``--spec-simple``: llama.cpp's own ``llama-speculative-simple`` (built from the sdist's vendored
tree against the installed libllama) run with ``--spec-type draft-mtp`` on the same files and
prompts, at the same draft length, greedy, ``--spec-draft-p-min 0``: its ``n_drafted`` /
``n_accept`` and decode speed, beside the seam's MTP acceptance on the same run to the end token
(llama.cpp's ``--ignore-eos`` would bias the end tokens away, so neither side ignores them).
"""

from __future__ import annotations

import argparse
import re
import statistics
import subprocess
import time
from pathlib import Path
from typing import Any

from bench_llamacpp import paired_ratio
from harness import cell, emit, format_table, interleave, summarize

from eliza_backends import InferenceContext, open_stream
from eliza_backends.runtime.draft_policy import speedup_bound

PROMPTS = [
    "Once upon a time there was a little robot who wanted to learn",
    "The quick brown fox jumps over the lazy dog. The quick brown fox",
    "Water boils at one hundred degrees. Ice melts at",
    "The capital of France is Paris. The capital of Italy is",
]
CONTENDERS = {"none": {}, "ngram": {"drafter": "ngram", "draft_policy": "fixed"},
              "mtp": {"drafter": "mtp", "draft_policy": "fixed"},
              "mtp-auto": {"drafter": "mtp", "draft_policy": "auto"}}


def run(ctx: InferenceContext, prompt: str, n_gen: int, threads: int, k: int,
        cfg: dict[str, Any]) -> dict[str, Any]:
    """One greedy generation: tokens, decode tok/s, counts, the policy's curve."""
    cfg = {"ignore_eos": True, **cfg}
    with open_stream(ctx, backend="llama.cpp", threads=threads, max_tokens=n_gen,
                     context_size=1024, draft_length=k, **cfg) as s:
        s.prefill(prompt)
        t0 = time.perf_counter()
        steps = list(s)
        dt = time.perf_counter() - t0
        policy = s.session.draft_policy
        ok = sum(st.accepted for st in steps)
        drafted = sum(st.drafted for st in steps)
        rejected = sum(1 for st in steps if st.accepted < st.drafted)
        return {"tokens": [t for st in steps for t in st.tokens],
                "tps": sum(len(st.tokens) for st in steps) / dt,
                "drafted": drafted, "accepted": ok,
                "acceptance": ok / drafted if drafted else None,
                "per_position": ok / (ok + rejected) if ok + rejected else None,
                "cost": policy.cost if policy else None,
                "draft_cost": policy.draft_cost if policy else None}


def clean_costs(ctx: InferenceContext, prompt: str, threads: int, k: int,
                reps: int = 200) -> dict[str, Any]:
    """The costs the bound needs, each the fastest of ``reps`` (the rest is other work on a
    shared machine): the target's forward pass over 1..k+1 tokens (the session's own
    ``_batch_cost``, relative to one token) and one MTP draft (the drafter's ``propose``
    per token, in one-token target decodes)."""
    with open_stream(ctx, backend="llama.cpp", threads=threads, max_tokens=8, ignore_eos=True,
                     context_size=1024, drafter="mtp", draft_length=k,
                     draft_policy="fixed") as s:
        s.prefill(prompt)
        s.session.next(k + 1)
        session = s.session
        curves = [session._batch_cost(k + 1) or [] for _ in range(reps // 20)]
        raw = [min(c[i] for c in curves) for i in range(k + 1)]
        drafter, history = session._drafter, list(session.history)
        assert drafter is not None
        per = min(_timed(lambda: drafter.propose(history, k)) for _ in range(reps)) / k
    return {"cost": [c / raw[0] for c in raw], "draft_cost": per / raw[0],
            "one_token_us": raw[0] * 1e6, "draft_us": per * 1e6}


def _timed(fn: Any) -> float:
    t0 = time.perf_counter()
    fn()
    return time.perf_counter() - t0


def spec_simple(binary: Path, bundle: Path, prompt: str, n_gen: int, threads: int,
                k: int) -> dict[str, Any]:
    """llama.cpp's own MTP driver on the same files: drafted, accepted, decode tok/s."""
    target = sorted((bundle / "text").glob("*.gguf"))[0]
    assistant = sorted((bundle / "text" / "draft").rglob("*.gguf"))[0]
    cmd = [str(binary), "-m", str(target), "-md", str(assistant), "--spec-type", "draft-mtp",
           "--spec-draft-n-max", str(k), "--spec-draft-p-min", "0", "-p", prompt,
           "-n", str(n_gen), "--temp", "0", "--top-k", "1", "-t", str(threads), "-c", "1024"]
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=600)
    text = proc.stdout + proc.stderr
    found = {key: re.search(rf"{key}\s*=\s*(\d+)", text) for key in ("n_drafted", "n_accept")}
    speed = re.search(r"decoded\s+\d+ tokens in\s+[\d.]+ seconds, speed:\s+([\d.]+)", text)
    if proc.returncode != 0 or not all(found.values()):
        return {"error": f"exit {proc.returncode}: {text.strip().splitlines()[-3:]}"}
    drafted = int(found["n_drafted"].group(1))  # type: ignore[union-attr]
    accepted = int(found["n_accept"].group(1))  # type: ignore[union-attr]
    return {"drafted": drafted, "accepted": accepted,
            "acceptance": accepted / drafted if drafted else None,
            "tps": float(speed.group(1)) if speed else None}


def bench(bundle: Path, prompts: list[str], repeat: int, n_gen: int, threads: int, k: int,
          binary: Path | None) -> dict[str, Any]:
    """Every prompt: the contenders interleaved, and llama.cpp's driver if given."""
    out: dict[str, Any] = {}
    with InferenceContext(bundle) as ctx:
        for prompt in prompts:
            runs = interleave(list(CONTENDERS), repeat,
                              lambda c, p=prompt: run(ctx, p, n_gen, threads, k, CONTENDERS[c]),
                              warmup=True)
            plain = runs["none"][0]["tokens"]
            rows: dict[str, Any] = {}
            for c, rs in runs.items():
                rows[c] = {"identical": all(r["tokens"] == plain for r in rs),
                           "tps": summarize(r["tps"] for r in rs),
                           "ratio": paired_ratio(rs, runs["none"], "tps"),
                           "ratio_range": summarize(a["tps"] / b["tps"] for a, b in
                                                    zip(rs, runs["none"], strict=True)),
                           "acceptance": rs[0]["acceptance"],
                           "per_position": rs[0]["per_position"],
                           "drafted": statistics.median(r["drafted"] for r in rs)}
            clean = clean_costs(ctx, prompt, threads, k)
            cost, dc = clean["cost"], clean["draft_cost"]
            a = rows["mtp"]["per_position"]
            bound = max([1.0, *(speedup_bound(a, j, cost, dc) for j in range(1, len(cost)))]) \
                if a is not None else None
            auto = runs["mtp-auto"][-1]
            entry: dict[str, Any] = {"rows": rows, "cost": cost, "draft_cost": dc,
                                     "bound": bound, "clean": clean,
                                     "policy_cost": auto["cost"],
                                     "policy_draft_cost": auto["draft_cost"]}
            if binary is not None:  # (it stops at an end token: so does this pass)
                entry["llama.cpp"] = spec_simple(binary, bundle, prompt, n_gen, threads, k)
                seam = run(ctx, prompt, n_gen, threads, k, {**CONTENDERS["mtp"],
                                                             "ignore_eos": False})
                entry["llama.cpp"]["seam_acceptance"] = seam["acceptance"]
                entry["llama.cpp"]["seam_tokens"] = len(seam["tokens"])
            out[prompt] = entry
    return out


def render(report: dict[str, Any]) -> str:
    """One table: a row per prompt."""
    k = report["draft_length"]
    parts = [f"{report['bundle']}: {report['threads']} thread(s), {report['gen']} tokens, "
             f"k = {k}, {report['repeat']} interleaved repeats, median (min-max); ratios: "
             "median (min-max) of per-round ratios to none; acceptance = accepted / drafted"]
    head = ["prompt", "same", "none tok/s", "ngram x", "mtp x", "mtp-auto x", "mtp accept",
            "to eos: seam / llama.cpp", "draft cost", "bound x", f"cost(1..{k + 1})"]
    body = []
    for prompt, d in report["prompts"].items():
        r = d["rows"]
        ref = d.get("llama.cpp") or {}
        same = all(row["identical"] for row in r.values())
        body.append([prompt[:28], "yes" if same else "NO", cell(r["none"]["tps"]),
                     cell(r["ngram"]["ratio_range"], fmt=".2f"),
                     cell(r["mtp"]["ratio_range"], fmt=".2f"),
                     cell(r["mtp-auto"]["ratio_range"], fmt=".2f"),
                     f"{r['mtp']['acceptance']:.3f}" if r["mtp"]["acceptance"] is not None
                     else "-",
                     f"{_num(ref.get('seam_acceptance'))} / {_num(ref.get('acceptance'))}"
                     if "error" not in ref and ref else str(ref.get("error", "-"))[:20],
                     f"{d['draft_cost']:.2f}" if d["draft_cost"] else "-",
                     f"{d['bound']:.2f}" if d["bound"] else "-",
                     " ".join(f"{c:.2f}" for c in d["cost"]) if d["cost"] else "-"])
    parts += ["", format_table(head, body)]
    return "\n".join(parts)


def _num(x: float | None) -> str:
    return "-" if x is None else f"{x:.3f}"


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--bundle", required=True, type=Path)
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--gen", type=int, default=64)
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--draft-length", type=int, default=3)
    ap.add_argument("--spec-simple", type=Path, default=None,
                    help="llama.cpp's llama-speculative-simple binary")
    ap.add_argument("--prompts", default=None, help="prompts separated by '|'")
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args(argv)
    prompts = args.prompts.split("|") if args.prompts else PROMPTS
    report = {"bundle": str(args.bundle), "threads": args.threads, "gen": args.gen,
              "repeat": args.repeat, "draft_length": args.draft_length,
              "prompts": bench(args.bundle, prompts, args.repeat, args.gen, args.threads,
                               args.draft_length, args.spec_simple)}
    emit(report, args.json, render)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
