"""``generate_batch`` against llama.cpp's own ``llama-batched-bench``: aggregate decode speed
(S_TG) at the same batch sizes, prompt and generation lengths, threads and GGUF.

    python benchmarks/bench_batch.py GGUF [--batches 1,2,4,8] [--prompt-tokens 128]
        [--gen-tokens 64] [--threads N] [--repeat 2] [--batched-bench PATH] [--out FILE] [--json]

- ``llama-batched-bench`` (built from the vendored llama.cpp of the pinned llama-cpp-python:
  ``bash benchmarks/build_llama_bench.sh llama-batched-bench``; ``--batched-bench`` or found in
  ``.bench-cache``) with ``-npp P -ntg G -npl B``: B sequences of P prompt tokens, G generated
  each; its S_TG is ``B * G / T_TG``, the decode phase alone.
- ``generate_batch``: B prompts of P token ids (distinct, so nothing is shared), greedy with
  ``ignore_eos``, ``parallel=B``, in a fresh process per measurement (its own model load, as
  batched-bench's). Its decode phase is isolated the same way: the batch run with G tokens and
  with 1 token (prefill plus the first token), ``S_TG = B * (G - 1) / (wall_G - wall_1)``; the
  report also has the whole batch's rate (``B * G / wall_G``, prefill included).

Contenders alternate (A B, B A, ...) ``--repeat`` times per batch size; medians with min-max,
the ratio generate_batch / batched-bench, and the load average before and after.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

from harness import ROOT, rotated, spawn


def find_batched_bench(given: str | None) -> str | None:
    """The llama-batched-bench binary: ``given``, else the one build_llama_bench.sh cached
    (None, with a note, when there is none: generate_batch is measured alone)."""
    if given:
        return given
    cache = Path(os.environ.get("ELIZA_BENCH_CACHE", ROOT / ".bench-cache"))
    found = sorted(cache.glob("llama-bench-*/build/bin/llama-batched-bench"))
    if not found:
        print("no llama-batched-bench (bash benchmarks/build_llama_bench.sh llama-batched-bench, "
              "or --batched-bench): measuring generate_batch alone", file=sys.stderr)
        return None
    return str(found[-1])


def batched_bench(binary: str, gguf: str, batch: int, args: argparse.Namespace) -> float:
    """llama-batched-bench's S_TG (tokens/s) for one batch size."""
    ctx = batch * (args.prompt_tokens + args.gen_tokens) + 64
    out = subprocess.run(
        [binary, "-m", gguf, "-c", str(ctx), "-b", "512", "-ub", "512", "-t", str(args.threads),
         "-tb", str(args.threads), "-npp", str(args.prompt_tokens), "-ntg", str(args.gen_tokens),
         "-npl", str(batch), "--output-format", "jsonl"],
        capture_output=True, text=True, timeout=1800, check=True)
    rows = [json.loads(line) for line in out.stdout.splitlines() if line.startswith("{")]
    return float(rows[-1]["speed_tg"])


def worker(gguf: str, batch: int, prompt_tokens: int, gen_tokens: int, threads: int) -> None:
    """In a fresh process: the batch with gen_tokens and with 1 token; prints the walls."""
    from eliza_backends import InferenceContext, generate_batch

    window = prompt_tokens + gen_tokens + 16
    config = {"threads": threads, "context_size": window, "batch_size": min(512, window),
              "ignore_eos": True}
    # distinct prompts: token ids 100.. shifted per sequence (nothing shared between them)
    prompts = [[100 + (i * 7 + j) % 2000 for j in range(prompt_tokens)] for i in range(batch)]
    with InferenceContext(gguf, parallel=batch) as context:
        generate_batch(context, prompts[:1], backend="llama.cpp", config=config, max_tokens=4)
        walls = {}
        for tokens in (1, gen_tokens):
            t0 = time.perf_counter()
            out = generate_batch(context, prompts, parallel=batch, backend="llama.cpp",
                                 config=config, max_tokens=tokens)
            walls[tokens] = time.perf_counter() - t0
            out.raise_for_errors()
            assert out.stats.completion_tokens == batch * tokens, out.stats
    print(json.dumps({"wall_1": walls[1], "wall_g": walls[gen_tokens],
                      "batched": out.stats.batched, "parallel": out.stats.parallel}))


def load() -> str:
    return " ".join(f"{x:.2f}" for x in os.getloadavg())


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("gguf", nargs="?")
    parser.add_argument("--batches", default="1,2,4,8")
    parser.add_argument("--prompt-tokens", type=int, default=128)
    parser.add_argument("--gen-tokens", type=int, default=64)
    parser.add_argument("--threads", type=int, default=len(os.sched_getaffinity(0)))
    parser.add_argument("--repeat", type=int, default=2)
    parser.add_argument("--batched-bench")
    parser.add_argument("--out", type=Path)
    parser.add_argument("--json", action="store_true")
    parser.add_argument("--worker", nargs=5, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.worker:
        gguf, *numbers = args.worker
        worker(gguf, *(int(n) for n in numbers))
        return 0
    if not args.gguf:
        parser.error("GGUF is required")
    binary = find_batched_bench(args.batched_bench)
    report: dict[str, Any] = {"gguf": Path(args.gguf).name, "threads": args.threads,
                              "prompt_tokens": args.prompt_tokens,
                              "gen_tokens": args.gen_tokens, "repeat": args.repeat,
                              "load_before": load(), "date": time.strftime("%Y-%m-%d %H:%M"),
                              "results": {}}
    for batch in [int(b) for b in args.batches.split(",")]:
        names = ["batched-bench", "generate_batch"] if binary else ["generate_batch"]
        runs: dict[str, list[float]] = {name: [] for name in names}
        runs["generate_batch_whole"] = []
        info: dict[str, Any] = {}
        for rep in range(args.repeat):
            for name in rotated(names, rep):
                if name == "batched-bench":
                    assert binary is not None
                    runs[name].append(batched_bench(binary, args.gguf, batch, args))
                else:
                    info = spawn(Path(__file__), args.gguf, str(batch), str(args.prompt_tokens),
                                 str(args.gen_tokens), str(args.threads))
                    decode = info["wall_g"] - info["wall_1"]
                    runs[name].append(batch * (args.gen_tokens - 1) / decode)
                    runs["generate_batch_whole"].append(batch * args.gen_tokens / info["wall_g"])
                print(f"batch {batch} {name}: {runs[name][-1]:.1f} tok/s (load {load()})",
                      file=sys.stderr, flush=True)
        med = {k: statistics.median(v) for k, v in runs.items()}
        report["results"][str(batch)] = {
            **{f"{k}_s_tg" if k != "generate_batch_whole" else "generate_batch_whole_tok_s":
               {"median": m, "min": min(runs[k]), "max": max(runs[k])} for k, m in med.items()},
            "ratio": med["generate_batch"] / med["batched-bench"] if binary else None,
            "batched": info.get("batched"), "parallel": info.get("parallel")}
    report["load_after"] = load()
    if args.out:
        args.out.write_text(json.dumps(report, indent=2) + "\n")
    if args.json:
        print(json.dumps(report, indent=2))
    else:
        print(table(report))
    return 0


def table(report: dict[str, Any]) -> str:
    lines = [f"{report['gguf']}, {report['threads']} threads, {report['prompt_tokens']} prompt "
             f"+ {report['gen_tokens']} generated tokens per sequence, load "
             f"{report['load_before']} -> {report['load_after']}", "",
             "| batch | llama-batched-bench S_TG | generate_batch S_TG | ratio | generate_batch "
             "whole batch tok/s | batched |", "|---|---|---|---|---|---|"]
    for batch, r in report["results"].items():
        gb, whole = r["generate_batch_s_tg"], r["generate_batch_whole_tok_s"]
        bb = r.get("batched-bench_s_tg")
        ref = f"{bb['median']:.1f} ({bb['min']:.1f}-{bb['max']:.1f})" if bb else "-"
        ratio = f"{r['ratio']:.2f}x" if r["ratio"] is not None else "-"
        lines.append(f"| {batch} | {ref} | {gb['median']:.1f} ({gb['min']:.1f}-{gb['max']:.1f}) "
                     f"| {ratio} | {whole['median']:.1f} | {r['batched']} |")
    return "\n".join(lines)


if __name__ == "__main__":
    raise SystemExit(main())
