#!/usr/bin/env python
"""LiteRT through the seam vs LiteRT used directly (and llama.cpp for the rank rule).

    python benchmarks/bench_litert.py [--bundle examples/bundles/tiny] [--reps 7]
                                      [--tokens 64] [--threads 1] [--json]

One run, interleaved repetitions (each repetition runs every contestant once, in a rotated
order: ``benchmarks/harness.py``), medians. For each contestant: time to first token (from the
start of prefill to the first generated token) and decode tokens/s (tokens after the first /
time after the first).

Contestants:
  seam/interpreter   open_stream(backend="litert-lm") token-exact session (ai-edge-litert)
  seam/compiled      the same session on the CompiledModel runtime (KV updated in place)
  seam/engine        open_stream(backend="litert-lm", options session=engine)
  direct/interpreter a minimal numpy loop over the same .tflite signatures (no eliza code)
  direct/engine      litert_lm.Engine used directly (text in, text chunks out)
  seam/llama.cpp     open_stream(backend="llama.cpp") on the bundle's .gguf (rank evidence)

Ratios: seam/X over direct/X (1.0 = the seam costs nothing), and LiteRT over llama.cpp.
Loading is outside the timings (every contestant is loaded once before the first repetition).
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from harness import ROOT, interleave

Timing = tuple[float, float, int]  # ttft seconds, decode tok/s, tokens


def _rates(t0: float, stamps: list[float]) -> Timing:
    if not stamps:
        return float("nan"), float("nan"), 0
    ttft = stamps[0] - t0
    n = len(stamps)
    span = stamps[-1] - stamps[0]
    decode = (n - 1) / span if n > 1 and span > 0 else float("nan")
    return ttft, decode, n


def seam(bundle: Path, prompt: list[int], n: int, threads: int, backend: str,
         options: dict[str, Any] | None = None) -> tuple[Callable[[], Timing], Callable[[], None]]:
    import eliza_backends as eb

    engine = (options or {}).get("litert-lm", {}).get("session") == "engine"
    # the LiteRT-LM engine ends a turn at its stop tokens itself and refuses ignore_eos; its
    # decode rate is per token produced, so a turn that ends early still measures it
    stream = eb.open_stream(bundle, backend=backend, max_tokens=n, ignore_eos=not engine,
                            threads=threads, options=options or {})

    def run() -> Timing:
        stream.reset()
        stamps: list[float] = []
        t0 = time.perf_counter()
        stream.prefill(prompt)
        for step in stream:
            if step.tokens:
                now = time.perf_counter()
                stamps.extend([now] * len(step.tokens))
        return _rates(t0, stamps)

    return run, stream.close


def direct_interpreter(tflite: Path, prompt: list[int], n: int,
                       threads: int) -> tuple[Callable[[], Timing], Callable[[], None]]:
    import numpy as np
    from ai_edge_litert.interpreter import Interpreter

    it = Interpreter(model_path=str(tflite), num_threads=threads)
    sigs = it.get_signature_list()
    prefill = {int(k.split("_")[1]): it.get_signature_runner(k) for k in sigs
               if k.startswith("prefill_")}
    decode = it.get_signature_runner("decode")
    details = decode.get_input_details()
    specs = {k: (v["shape"], v["dtype"]) for k, v in details.items() if k.startswith("kv_cache_")}
    cache_len = int(details["mask"]["shape"][-1])
    keys = np.arange(cache_len)
    masks = np.where(keys[None, :] <= keys[:, None], 0.0,
                     np.finfo(np.float32).min).astype(np.float32)

    def run() -> Timing:
        cache = {k: np.zeros(s, dtype=d) for k, (s, d) in specs.items()}
        t0 = time.perf_counter()
        head = prompt[:-1]
        size = min(length for length in prefill if len(head) <= length)
        toks = np.zeros((1, size), dtype=np.int32)
        toks[0, :len(head)] = head
        pos = np.arange(size, dtype=np.int32)
        cache = prefill[size](tokens=toks, input_pos=pos, mask=masks[:size][None, None], **cache)
        p, cur = len(head), prompt[-1]
        stamps = []
        for _ in range(n):
            out = decode(tokens=np.array([[cur]], dtype=np.int32),
                         input_pos=np.array([p], dtype=np.int32),
                         mask=masks[p][None, None, None], **cache)
            cur = int(out.pop("logits")[0, -1].argmax())
            cache = out
            p += 1
            stamps.append(time.perf_counter())
        return _rates(t0, stamps)

    return run, lambda: None


def direct_engine(litertlm: Path, text: str, n: int,
                  threads: int) -> tuple[Callable[[], Timing], Callable[[], None]]:
    import litert_lm

    cache = tempfile.mkdtemp(prefix="bench-litert-")
    engine = litert_lm.Engine(str(litertlm), backend=litert_lm.Backend.CPU(thread_count=threads),
                              cache_dir=cache)

    def run() -> Timing:
        session = engine.create_session(
            apply_prompt_template=False, max_output_tokens=n,
            sampler_config=litert_lm.SamplerConfig(top_k=1, temperature=0.0, seed=0))
        stamps: list[float] = []
        t0 = time.perf_counter()
        session.run_prefill([text])
        for resp in session.run_decode_async():
            now = time.perf_counter()
            k = sum(len(engine.tokenize(t)) for t in resp.texts if t)
            stamps.extend([now] * max(k, 1))
        session.close()
        return _rates(t0, stamps)

    def close() -> None:
        engine.close()
        import shutil

        shutil.rmtree(cache, ignore_errors=True)

    return run, close


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--bundle", type=Path, default=ROOT / "examples" / "bundles" / "tiny")
    ap.add_argument("--reps", type=int, default=7)
    ap.add_argument("--tokens", type=int, default=64)
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--prompt", default="Four score and seven years ago")
    ap.add_argument("--no-llamacpp", action="store_true")
    ap.add_argument("--json", action="store_true", help="print JSON instead of a table")
    args = ap.parse_args(argv)

    import eliza_backends as eb

    bundle = args.bundle.resolve()
    with eb.open_stream(bundle, backend="litert-lm", threads=args.threads) as s:
        prompt = s.session.tokenize(args.prompt, add_special=True)
    text = bundle / "text"
    tflite = next(iter(sorted(text.glob("*.tflite"))), None)
    litertlm = next(iter(sorted(text.glob("*.litertlm"))), None)
    n, th = args.tokens, args.threads
    contestants: dict[str, tuple[Callable[[], Timing], Callable[[], None]]] = {}
    contestants["seam/interpreter"] = seam(bundle, prompt, n, th, "litert-lm",
                                           {"litert-lm": {"session": "interpreter"}})
    contestants["seam/compiled"] = seam(bundle, prompt, n, th, "litert-lm", {
        "litert-lm": {"session": "interpreter", "runtime": "compiled"}})
    if tflite is not None:
        contestants["direct/interpreter"] = direct_interpreter(tflite, prompt, n, th)
    if litertlm is not None:
        contestants["seam/engine"] = seam(bundle, prompt, n, th, "litert-lm",
                                          {"litert-lm": {"session": "engine"}})
        contestants["direct/engine"] = direct_engine(litertlm, args.prompt, n, th)
    if not args.no_llamacpp and list(text.glob("*.gguf")):
        contestants["seam/llama.cpp"] = seam(bundle, prompt, n, th, "llama.cpp")

    results = interleave(list(contestants), args.reps, lambda name: contestants[name][0](),
                         warmup=True)
    for _, close in contestants.values():
        close()

    summary: dict[str, dict[str, float]] = {}
    for name, runs in results.items():
        summary[name] = {
            "ttft_ms": statistics.median(r[0] for r in runs) * 1e3,
            "decode_tok_s": statistics.median(r[1] for r in runs),
            "tokens": statistics.median(r[2] for r in runs),
        }
    ratios: dict[str, float] = {}

    def ratio(key: str, a: str, b: str, field: str) -> None:
        if a in summary and b in summary and summary[b][field]:
            ratios[key] = summary[a][field] / summary[b][field]

    ratio("seam/direct interpreter decode", "seam/interpreter", "direct/interpreter",
          "decode_tok_s")
    ratio("seam/direct interpreter ttft", "seam/interpreter", "direct/interpreter", "ttft_ms")
    ratio("seam/direct engine decode", "seam/engine", "direct/engine", "decode_tok_s")
    ratio("seam/direct engine ttft", "seam/engine", "direct/engine", "ttft_ms")
    ratio("litert interpreter/llama.cpp decode", "seam/interpreter", "seam/llama.cpp",
          "decode_tok_s")
    ratio("compiled/interpreter decode (seam)", "seam/compiled", "seam/interpreter",
          "decode_tok_s")
    ratio("litert compiled/llama.cpp decode", "seam/compiled", "seam/llama.cpp", "decode_tok_s")
    ratio("litert engine/llama.cpp decode", "seam/engine", "seam/llama.cpp", "decode_tok_s")
    ratio("litert interpreter/llama.cpp ttft", "seam/interpreter", "seam/llama.cpp", "ttft_ms")

    report = {"bundle": str(bundle), "reps": args.reps, "tokens": n, "threads": th,
              "prompt_tokens": len(prompt), "results": summary, "ratios": ratios}
    if args.json:
        print(json.dumps(report, indent=2))
        return 0
    print(f"bundle {bundle}  prompt {len(prompt)} tokens  decode {n} tokens  threads {th}  "
          f"reps {args.reps} (medians)")
    print(f"{'contestant':<22}{'TTFT ms':>10}{'decode tok/s':>15}{'tokens':>8}")
    for name, row in summary.items():
        print(f"{name:<22}{row['ttft_ms']:>10.2f}{row['decode_tok_s']:>15.0f}{row['tokens']:>8.0f}")
    print()
    for key, value in ratios.items():
        print(f"{key:<40}{value:>8.2f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
