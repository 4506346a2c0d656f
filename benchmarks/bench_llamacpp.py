"""llama.cpp through the seam vs llama-cpp-python used directly, side by side in one run.

    python benchmarks/bench_llamacpp.py [--models tiny,q4_0,q8_0,PATH.gguf] [--repeat 3] [--gen 128]
                                        [--contenders seam,seam8,minimal,highlevel,llama-bench]
                                        [--json]

Contenders, each run in a fresh process (so peak RSS and load time are its own), interleaved
with rotation (A B C, B C A, ...: ``benchmarks/harness.py``) so that machine noise hits all of
them alike:

- ``seam``: ``eliza_backends.open_stream(..., backend="llama.cpp")``, prefill + ``next()``;
- ``minimal``: a minimal ctypes loop on llama-cpp-python's low-level API (batch, decode, greedy
  sampler) — the floor any wrapper pays;
- ``highlevel``: ``Llama.create_completion(stream=True)``;
- ``seam8``: the seam with multi-token steps (``next(8)``: one call, eight tokens);
- ``llama-bench``: llama.cpp's own ``llama-bench`` (built from the pinned sdist's vendored
  llama.cpp by ``benchmarks/build_llama_bench.sh``; skipped when not built), ``pp<prompt>`` for
  prefill and ``tg<gen>`` at depth ``<prompt>`` for decode (the positions the others decode at),
  ``--repack`` matching the seam's extra-buffer setting on this host and ``-fa auto`` its flash
  attention (every contender runs llama.cpp's flash attention as the seam does by default).

Each worker loads, warms up on the prompt itself (as llama-bench does: the first pass of a
batch shape pays costs that are not prefill speed), resets, then measures. Reported per
contender: load time, time to first token (from the start of prefill), prefill and decode
tokens/s (median, min-max), peak RSS, and the decode rate per position bucket (flat is good);
ratios (against ``minimal`` and
llama-bench) are medians of per-round ratios. Models: the tiny bundle's GGUF and a random-weight
~0.85 B llama (Q4_0 / Q8_0) made by ``tools/make_random_gguf.py`` into ``.bench-cache/``, or
any GGUF path (the real models: ``benchmarks/real_models.py`` finds them).
"""

from __future__ import annotations

import argparse
import itertools
import json
import os
import resource
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

from harness import ROOT, TINY, interleave, spawn, summarize

from eliza_backends.bench import peak_rss_mb

CACHE = ROOT / ".bench-cache"
CONTENDERS = ("seam", "seam8", "minimal", "highlevel", "llama-bench")
LLAMA_BENCH = CACHE / "llama-bench-{version}" / "build" / "bin" / "llama-bench"
PROMPT = ("The history of the lighthouse begins on a rocky coast where sailors needed a light "
          "to guide them home through storms and fog. ")


def model_bundle(name: str) -> Path:
    """A bundle directory for a model name: ``tiny`` or a random 0.85 B quantization."""
    if name == "tiny":
        return TINY
    if name.endswith(".gguf"):  # a GGUF file: a one-file bundle around a link to it
        gguf = Path(name).resolve()
        bundle = CACHE / f"gguf-{gguf.stem}"
        link = bundle / "text" / gguf.name
        if not link.exists():
            link.parent.mkdir(parents=True, exist_ok=True)
            link.symlink_to(gguf)
        return bundle
    sys.path.insert(0, str(ROOT / "tools"))
    from make_random_gguf import make

    bundle = CACHE / f"random-0.85b-{name}"
    make(bundle / "text" / f"model-{name}.gguf", preset="0.85b", qtype=name)
    return bundle


def model_label(name: str) -> str:
    """The table's name for a model argument (a GGUF path: its file stem)."""
    return Path(name).stem if name.endswith(".gguf") else name


def _gguf(bundle: Path) -> Path:
    return sorted((bundle / "text").glob("*.gguf"))[0]


def llama_bench_binary() -> Path | None:
    """The llama-bench that ``benchmarks/build_llama_bench.sh`` built, if it did."""
    import importlib.metadata

    path = Path(str(LLAMA_BENCH).format(version=importlib.metadata.version("llama_cpp_python")))
    return path if os.access(path, os.X_OK) else None


def _extra_buffers() -> bool:
    """The same llama.cpp buffer setting the seam uses on this host (see eliza_llamacpp)."""
    from eliza_llamacpp import LlamaCppOptions
    from eliza_llamacpp.model import use_extra_buffers

    return use_extra_buffers(LlamaCppOptions())


# ---------------------------------------------------------------------------- workers


def run_seam(bundle: Path, n_prompt: int, n_gen: int, threads: int, step: int = 1
             ) -> dict[str, Any]:
    """The seam, ``step`` tokens per ``next()`` after the first (each token of a step is
    stamped when the step returns)."""
    from eliza_backends import open_stream

    t0 = time.perf_counter()
    stream = open_stream(bundle, backend="llama.cpp", threads=threads, context_size=2048,
                         max_tokens=n_gen, ignore_eos=True)
    ids = (stream.session.tokenize(PROMPT * 200))[:n_prompt]
    load = time.perf_counter() - t0
    stream.prefill(ids)  # warm-up on the same shape, as every contender does
    stream.next(2)
    stream.reset()
    stamps = []
    t_start = time.perf_counter()
    stream.prefill(ids)
    t_prefill = time.perf_counter()
    session = stream.session
    while len(stamps) < n_gen:
        out = session.next(1 if not stamps else min(step, n_gen - len(stamps)))
        stamps += [time.perf_counter()] * len(out.tokens)
        if out.final:
            break
    stream.close()
    return _result(load, t_start, t_prefill, stamps, n_prompt)


def run_minimal(bundle: Path, n_prompt: int, n_gen: int, threads: int) -> dict[str, Any]:
    import ctypes

    import llama_cpp as lc

    quiet = lc.llama_log_callback(lambda *a: None)  # keep a reference while llama.cpp runs
    lc.llama_log_set(quiet, ctypes.c_void_p(0))
    t0 = time.perf_counter()
    lc.llama_backend_init()
    mp = lc.llama_model_default_params()
    mp.use_extra_bufts = _extra_buffers()
    model = lc.llama_model_load_from_file(str(_gguf(bundle)).encode(), mp)
    cp = lc.llama_context_default_params()
    cp.n_ctx, cp.n_batch, cp.n_ubatch = 2048, 512, 512
    cp.n_threads = cp.n_threads_batch = threads
    cp.no_perf = True
    ctx = lc.llama_init_from_model(model, cp)
    vocab = lc.llama_model_get_vocab(model)
    text = (PROMPT * 200).encode()
    n = -lc.llama_tokenize(vocab, text, len(text), None, 0, True, True)  # size query
    buf = (lc.llama_token * n)()
    n = lc.llama_tokenize(vocab, text, len(text), buf, n, True, True)
    ids = list(buf[:n])[:n_prompt]
    smpl = lc.llama_sampler_chain_init(lc.llama_sampler_chain_default_params())
    lc.llama_sampler_chain_add(smpl, lc.llama_sampler_init_greedy())
    batch = lc.llama_batch_init(512, 0, 1)
    load = time.perf_counter() - t0

    def prefill(tokens: list[int]) -> None:
        for off in range(0, len(tokens), 512):
            chunk = tokens[off:off + 512]
            for i, tok in enumerate(chunk):
                batch.token[i], batch.pos[i], batch.n_seq_id[i] = tok, off + i, 1
                batch.seq_id[i][0], batch.logits[i] = 0, 0
            batch.logits[len(chunk) - 1] = 1
            batch.n_tokens = len(chunk)
            assert lc.llama_decode(ctx, batch) == 0

    prefill(ids)  # warm-up on the same shape, then forget it
    lc.llama_sampler_sample(smpl, ctx, -1)
    lc.llama_memory_clear(lc.llama_get_memory(ctx), True)
    lc.llama_sampler_reset(smpl)
    t_start = time.perf_counter()
    prefill(ids)
    t_prefill = time.perf_counter()
    one = lc.llama_batch_init(1, 0, 1)
    one.n_tokens, one.n_seq_id[0], one.logits[0] = 1, 1, 1
    one.seq_id[0][0] = 0
    pos = len(ids)
    stamps = []
    tok = lc.llama_sampler_sample(smpl, ctx, -1)
    stamps.append(time.perf_counter())
    for _ in range(n_gen - 1):
        one.token[0], one.pos[0] = tok, pos
        pos += 1
        assert lc.llama_decode(ctx, one) == 0
        tok = lc.llama_sampler_sample(smpl, ctx, -1)
        stamps.append(time.perf_counter())
    return _result(load, t_start, t_prefill, stamps, len(ids))


def run_highlevel(bundle: Path, n_prompt: int, n_gen: int, threads: int) -> dict[str, Any]:
    import llama_cpp as lc

    defaults = lc.llama_model_default_params

    def patched() -> Any:  # the high-level class has no switch for extra buffer types
        params = defaults()
        params.use_extra_bufts = _extra_buffers()
        return params

    lc.llama_model_default_params = patched
    lc.llama_cpp.llama_model_default_params = patched
    t0 = time.perf_counter()
    llm = lc.Llama(str(_gguf(bundle)), n_ctx=2048, n_batch=512, n_threads=threads,
                   flash_attn=True, verbose=False)  # the seam's default (auto) is on on a CPU
    ids = llm.tokenize((PROMPT * 200).encode())[:n_prompt]
    load = time.perf_counter() - t0
    for _ in llm.create_completion(ids, max_tokens=2, temperature=0.0, stream=True):
        pass  # warm-up on the same shape, then forget the cached prefix
    llm.reset()
    stamps = []
    t_start = time.perf_counter()
    for _ in llm.create_completion(ids, max_tokens=n_gen, temperature=0.0, stream=True,
                                   logit_bias=None):
        stamps.append(time.perf_counter())
    # the first chunk arrives after the prefill: treat its arrival as both
    return _result(load, t_start, None, stamps, len(ids))


def run_llama_bench(bundle: Path, n_prompt: int, n_gen: int, threads: int) -> dict[str, Any]:
    """llama.cpp's own llama-bench: ``pp<n_prompt>`` (depth 0) and ``tg<n_gen>`` at depth
    ``n_prompt``, one repetition each (the driver repeats), as one JSON result."""
    binary = llama_bench_binary()
    if binary is None:
        raise SystemExit("llama-bench is not built: bash benchmarks/build_llama_bench.sh")
    common = [str(binary), "-m", str(_gguf(bundle)), "-t", str(threads), "-r", "1",
              "--repack", "1" if _extra_buffers() else "0", "-fa", "auto", "-o", "json"]
    tests = {"prefill_tps": ["-p", str(n_prompt), "-n", "0"],
             "decode_tps": ["-p", "0", "-n", str(n_gen), "-d", str(n_prompt)]}
    out: dict[str, Any] = {"load_s": None, "ttft_s": None, "prefill_s": None,
                           "per_position_tps": {}}
    for key, test in tests.items():
        proc = subprocess.run([*common, *test], capture_output=True, text=True, check=True)
        out[key] = json.loads(proc.stdout)[0]["avg_ts"]
    out["prefill_s"] = n_prompt / out["prefill_tps"]
    # the largest child's ru_maxrss (not VmHWM, the processes are gone): it includes this small
    # worker's own peak, inherited at exec, which is far below llama-bench's
    out["peak_rss_mb"] = resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss / 1024
    return out


def _result(load: float, t_start: float, t_prefill: float | None, stamps: list[float],
            n_prompt: int) -> dict[str, Any]:
    first = stamps[0]
    gaps = [b - a for a, b in itertools.pairwise(stamps)]
    decode = (len(stamps) - 1) / (stamps[-1] - first) if len(stamps) > 1 else 0.0
    buckets = {}
    for lo in range(0, len(gaps), 64):
        chunk = gaps[lo:lo + 64]
        buckets[f"{lo + 1}-{lo + len(chunk)}"] = len(chunk) / sum(chunk)
    return {
        "load_s": load,
        "ttft_s": first - t_start,
        "prefill_s": (t_prefill - t_start) if t_prefill else None,
        "prefill_tps": n_prompt / (t_prefill - t_start) if t_prefill else None,
        "decode_tps": decode,
        "tokens": len(stamps),
        "per_position_tps": buckets,
        "peak_rss_mb": peak_rss_mb(),
    }


WORKERS = {"seam": run_seam, "minimal": run_minimal, "highlevel": run_highlevel,
           "seam8": lambda *a: run_seam(*a, step=8), "llama-bench": run_llama_bench}


# ---------------------------------------------------------------------------- driver


def available_contenders(wanted: tuple[str, ...] = CONTENDERS) -> tuple[str, ...]:
    """``wanted`` less llama-bench when it is not built (said on stderr)."""
    if "llama-bench" in wanted and llama_bench_binary() is None:
        print("llama-bench not built (bash benchmarks/build_llama_bench.sh): left out",
              file=sys.stderr)
        return tuple(c for c in wanted if c != "llama-bench")
    return wanted


def bench(models: list[str], repeat: int, n_prompt: int, n_gen: int, threads: int,
          contenders: tuple[str, ...] = CONTENDERS) -> dict[str, Any]:
    """Run every contender on every model, interleaved; return the summary. Ratios: decode
    and prefill against ``minimal`` (``decode_ratio_vs_minimal``, ``prefill_ratio_vs_minimal``),
    time to first token as a speed (``ttft_speed_vs_minimal``: minimal's time over the
    contender's, >= 1 when the contender is as fast) and, when it ran, decode and prefill
    against llama-bench (``*_ratio_vs_llama_bench``)."""
    contenders = available_contenders(contenders)
    report: dict[str, Any] = {"threads": threads, "repeat": repeat, "prompt_tokens": n_prompt,
                              "gen_tokens": n_gen, "contenders": list(contenders), "models": {}}
    for name in models:
        bundle = model_bundle(name)
        args = ("--bundle", str(bundle), "--prompt-tokens", str(n_prompt), "--gen", str(n_gen),
                "--threads", str(threads))
        runs = interleave(contenders, repeat,
                          lambda c, args=args: spawn(__file__, c, *args))
        rows: dict[str, dict[str, Any]] = {}
        for c in contenders:
            rows[c] = {k: summarize(r.get(k) for r in runs[c]) for k in
                       ("load_s", "ttft_s", "prefill_s", "prefill_tps", "decode_tps",
                        "peak_rss_mb")}
            rows[c]["samples"] = {k: [r.get(k) for r in runs[c]]
                                  for k in ("prefill_tps", "decode_tps", "ttft_s")}
            buckets = runs[c][0]["per_position_tps"].keys()
            rows[c]["per_position_tps"] = {  # median over the repeats, bucket by bucket
                b: statistics.median(r["per_position_tps"][b] for r in runs[c]
                                     if b in r["per_position_tps"]) for b in buckets}
        for ref, metric, key in (("minimal", "decode_tps", "decode_ratio_vs_minimal"),
                                 ("minimal", "prefill_tps", "prefill_ratio_vs_minimal"),
                                 ("llama-bench", "decode_tps", "decode_ratio_vs_llama_bench"),
                                 ("llama-bench", "prefill_tps", "prefill_ratio_vs_llama_bench")):
            if ref in runs:
                for c in contenders:
                    ratio = paired_ratio(runs[c], runs[ref], metric)
                    if ratio is not None:
                        rows[c][key] = ratio
        if "minimal" in runs:  # time to first token as a speed: minimal's time / the contender's
            for c in contenders:
                ratio = paired_ratio(runs["minimal"], runs[c], "ttft_s")
                if ratio is not None:
                    rows[c]["ttft_speed_vs_minimal"] = ratio
        if "seam" in rows and rows["seam"]["prefill_s"]:
            rows["seam"]["ttft_minus_prefill_ms"] = 1000 * (
                rows["seam"]["ttft_s"]["median"] - rows["seam"]["prefill_s"]["median"])
        report["models"][model_label(name)] = rows
    return report


def paired_ratio(runs: list[dict[str, Any]], ref: list[dict[str, Any]], metric: str
                 ) -> float | None:
    """The median over rounds of ``runs[i][metric] / ref[i][metric]``: each round's contenders
    ran back to back, so a ratio within a round cancels the drift of a shared machine that a
    ratio of two medians keeps (on this 2-core VM the same llama-bench run swings 86-134 tok/s
    within a minute)."""
    pairs = [a[metric] / b[metric] for a, b in zip(runs, ref, strict=True)
             if a.get(metric) and b.get(metric)]
    return statistics.median(pairs) if pairs else None


def _median(r: dict[str, Any], key: str, scale: float = 1.0) -> float:
    s = r.get(key)
    return s["median"] * scale if s else float("nan")


def print_table(report: dict[str, Any]) -> None:
    """Human-readable table of :func:`bench`'s report."""
    print(f"threads={report['threads']} repeat={report['repeat']} "
          f"prompt={report['prompt_tokens']} gen={report['gen_tokens']}")
    for model, rows in report["models"].items():
        print(f"\n{model}")
        print(f"  {'contender':<11} {'decode tok/s (min-max)':>26} {'/min':>6} {'/bench':>6} "
              f"{'prefill tok/s':>13} {'/bench':>6} {'ttft ms':>8} {'load s':>7} "
              f"{'RSS MB':>7}")
        for c, r in rows.items():
            d = r["decode_tps"]
            print(f"  {c:<11} {d['median']:>10.1f} ({d['min']:>6.1f}-{d['max']:>6.1f}) "
                  f"{r.get('decode_ratio_vs_minimal', float('nan')):>6.3f} "
                  f"{r.get('decode_ratio_vs_llama_bench', float('nan')):>6.3f} "
                  f"{_median(r, 'prefill_tps'):>13.1f} "
                  f"{r.get('prefill_ratio_vs_llama_bench', float('nan')):>6.3f} "
                  f"{_median(r, 'ttft_s', 1000):>8.1f} {_median(r, 'load_s'):>7.2f} "
                  f"{_median(r, 'peak_rss_mb'):>7.0f}")
        seam = rows.get("seam", {})
        if "ttft_speed_vs_minimal" in seam:
            print(f"  seam: time to first token as fast as minimal's x"
                  f"{seam['ttft_speed_vs_minimal']:.3f}, prefill x"
                  f"{seam.get('prefill_ratio_vs_minimal', float('nan')):.3f} (per-round medians)")
        if "ttft_minus_prefill_ms" in seam:
            print(f"  seam: first token {seam['ttft_minus_prefill_ms']:.2f} ms after prefill")
            pos = seam["per_position_tps"]
            print("  seam decode tok/s by position: " +
                  ", ".join(f"{k}: {v:.0f}" for k, v in pos.items()))


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--models", default="tiny,q4_0")
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--prompt-tokens", type=int, default=128)
    ap.add_argument("--gen", type=int, default=128)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--contenders", default=",".join(CONTENDERS))
    ap.add_argument("--json", action="store_true")
    ap.add_argument("--worker", choices=CONTENDERS, help=argparse.SUPPRESS)
    ap.add_argument("--bundle", type=Path, help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    if args.worker:
        result = WORKERS[args.worker](args.bundle, args.prompt_tokens, args.gen, args.threads)
        print(json.dumps(result))
        return 0
    report = bench(args.models.split(","), args.repeat, args.prompt_tokens, args.gen,
                   args.threads, tuple(args.contenders.split(",")))
    if args.json:
        print(json.dumps(report, indent=2))
    else:
        print_table(report)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
