"""The MLX backend through the seam against mlx-lm's own ``stream_generate``, in one run.

    python benchmarks/bench_mlx.py                      # tiny bundle
    python benchmarks/bench_mlx.py --realistic 0.85b    # + a random-weight 0.85 B llama
    python benchmarks/bench_mlx.py --json               # machine-readable

For each model the paths run interleaved (``benchmarks/harness.py``: who goes first rotates
each round, a 50 ms pause between runs) on one loaded model, so drift in a shared machine's load
hits both alike, and the table reports medians:

* **seam**: ``open_stream(bundle, backend="mlx")``: ``reset()``, ``prefill(ids)``, then
  ``next()`` one token at a time (the streaming case; ``--step`` for multi-token steps);
* **stream_generate**: ``mlx_lm.stream_generate(model, tokenizer, ids, sampler=argmax)`` on the
  same weights, with eos never ending it (``tokenizer.eos_token_ids = ()``).

Time to first token (TTFT) runs from before the prefill to the first token (with ``--step k``
the seam's first step holds k tokens, so its TTFT is not comparable then); decode tok/s is
``(n - first) / (t_last - t_first)``. Ratios are seam / stream_generate (decode: higher is better;
TTFT: the seam's TTFT speed, i.e. stream_generate TTFT / seam TTFT). The target is >= 0.97.

``--llama`` adds llama.cpp through the seam on a GGUF of the same shape (the tiny bundle's own
F16 file; for ``--realistic`` a random-weight F16 GGUF from tools/make_random_gguf.py), which is
the evidence behind the MLX factory's host-aware rank (-10 without Metal).

The realistic model is random-weight (a llama of the preset's shape, fp16, written once to
``--cache-dir``); its vocabulary is the tiny tokenizer's 384 ids (the layers, not the 32 k
LM head, dominate its compute), so its output is gibberish but the compute is that of the shape.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import shutil
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

from harness import ROOT, TINY, interleave

PRESETS = {  # as tools/make_random_gguf.py
    "0.85b": dict(hidden=2048, layers=16, heads=16, kv_heads=4, ffn=5632),
    "small": dict(hidden=256, layers=4, heads=4, kv_heads=2, ffn=688),
}


def make_random_mlx_bundle(preset: str, cache_dir: Path, llama: bool,
                           template: Path = TINY / "text" / "tiny-mlx") -> Path:
    """A bundle with a random-weight MLX llama folder of ``preset``'s shape (and a GGUF of the
    same shape when ``llama``), made once and reused."""
    import mlx.core as mx
    from mlx.utils import tree_flatten
    from mlx_lm.models import llama as mlx_llama

    shape = PRESETS[preset]
    bundle = cache_dir / f"random-{preset}"
    folder = bundle / "text" / f"random-{preset}-mlx"
    if not (folder / "model.safetensors").is_file():
        folder.mkdir(parents=True, exist_ok=True)
        config = json.loads((template / "config.json").read_text())
        config.update(hidden_size=shape["hidden"], num_hidden_layers=shape["layers"],
                      num_attention_heads=shape["heads"], num_key_value_heads=shape["kv_heads"],
                      intermediate_size=shape["ffn"], head_dim=shape["hidden"] // shape["heads"],
                      max_position_embeddings=4096)
        mx.random.seed(0)
        model = mlx_llama.Model(mlx_llama.ModelArgs.from_dict(config))
        weights = {k: (v * 0.02).astype(mx.float16) if v.ndim > 1 else v.astype(mx.float16)
                   for k, v in tree_flatten(model.parameters())}
        mx.save_safetensors(str(folder / "model.safetensors"), weights)
        (folder / "config.json").write_text(json.dumps(config, indent=2))
        for name in ("tokenizer.json", "tokenizer_config.json", "generation_config.json"):
            shutil.copy(template / name, folder / name)
    gguf = bundle / "text" / f"random-{preset}-f16.gguf"
    if llama and not gguf.is_file():
        subprocess.run([sys.executable, str(ROOT / "tools" / "make_random_gguf.py"), str(gguf),
                        "--preset", preset, "--type", "f16"], check=True,
                       stdout=subprocess.DEVNULL)
    return bundle


def seam_run(stream: Any, ids: list[int], n: int, step: int) -> tuple[float, float]:
    """One generation through the seam: (ttft seconds, decode tok/s)."""
    stream.reset()
    t0 = time.perf_counter()
    stream.prefill(ids)
    got, first, t_first, t_last = 0, 0, 0.0, 0.0
    while got < n:
        s = stream.next(min(step, n - got))
        now = time.perf_counter()
        if got == 0:
            t_first, first = now, len(s.tokens)
        got += len(s.tokens)
        t_last = now
        if s.final:
            break
    assert got == n, (got, n)
    # TTFT: until the first step returned (with step > 1 that step holds `first` tokens)
    return t_first - t0, (got - first) / max(t_last - t_first, 1e-9)


def direct_run(model: Any, tokenizer: Any, ids: list[int], n: int,
               prefill_step: int) -> tuple[float, float]:
    """One generation with mlx-lm's stream_generate: (ttft seconds, decode tok/s)."""
    import mlx.core as mx
    from mlx_lm import stream_generate

    def argmax(x: Any) -> Any:
        return mx.argmax(x, axis=-1)

    t0 = time.perf_counter()
    got, t_first, t_last = 0, 0.0, 0.0
    for _ in stream_generate(model, tokenizer, ids, max_tokens=n, sampler=argmax,
                             prefill_step_size=prefill_step):
        now = time.perf_counter()
        if got == 0:
            t_first = now
        got += 1
        t_last = now
    assert got == n, (got, n)
    return t_first - t0, (got - 1) / max(t_last - t_first, 1e-9)


def bench_model(label: str, bundle: Path, prompt: list[int], n: int, rounds: int, step: int,
                llama: bool, llama_threads: int | None = 1) -> dict[str, Any]:
    """Interleave seam / stream_generate (/ llama.cpp) ``rounds`` times; medians."""
    from mlx_lm.tokenizer_utils import TokenizerWrapper
    from transformers import PreTrainedTokenizerFast

    import eliza_backends as eb

    cfg = dict(max_tokens=n, ignore_eos=True, context_size=max(512, len(prompt) + n + 16),
               batch_size=512)
    seam = eb.open_stream(bundle, backend="mlx", **cfg)
    session: Any = seam.session
    model = session._model  # the very weights the seam uses
    folder = session._loaded.folder.path
    tokenizer = TokenizerWrapper(PreTrainedTokenizerFast(
        tokenizer_file=str(folder / "tokenizer.json")))
    tokenizer.eos_token_ids = ()  # never stop early: both paths make exactly n tokens
    lcpp = eb.open_stream(bundle, backend="llama.cpp", threads=llama_threads, **cfg) \
        if llama else None
    # warm-up (compile caches, allocator), not measured
    seam_run(seam, prompt, min(n, 4), step)
    direct_run(model, tokenizer, prompt, min(n, 4), 512)

    def one(path: str) -> tuple[float, float]:
        if path == "stream_generate":
            return direct_run(model, tokenizer, prompt, n, 512)
        return seam_run(seam if path == "seam" else lcpp, prompt, n, step)

    paths = ["seam", "stream_generate", *(["llama.cpp"] if lcpp is not None else [])]
    # who goes first rotates; the pause lets the previous path's worker threads go idle
    runs = interleave(paths, rounds, one, pause=0.05, progress=False)
    seam.close()
    if lcpp is not None:
        lcpp.close()
    out: dict[str, Any] = {"model": label, "bundle": str(bundle), "prompt_tokens": len(prompt),
                           "llama_threads": llama_threads,
                           "generated_tokens": n, "rounds": rounds, "step": step, "paths": {}}
    for path, vals in runs.items():
        out["paths"][path] = {
            "ttft_ms": statistics.median(v[0] for v in vals) * 1e3,
            "decode_tok_s": statistics.median(v[1] for v in vals),
            "ttft_ms_all": [round(v[0] * 1e3, 3) for v in vals],
            "decode_tok_s_all": [round(v[1], 2) for v in vals]}
    p = out["paths"]
    out["ratio_decode"] = p["seam"]["decode_tok_s"] / p["stream_generate"]["decode_tok_s"]
    out["ratio_ttft"] = p["stream_generate"]["ttft_ms"] / p["seam"]["ttft_ms"]
    if "llama.cpp" in p:
        out["llama_over_mlx_decode"] = p["llama.cpp"]["decode_tok_s"] / p["seam"]["decode_tok_s"]
    return out


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--rounds", type=int, default=5, help="A/B rounds per model (default 5)")
    ap.add_argument("--tokens", type=int, default=128, help="tokens per tiny-model run")
    ap.add_argument("--step", type=int, default=1, help="tokens per next() call on the seam")
    ap.add_argument("--realistic", choices=sorted(PRESETS), help="also a random-weight model")
    ap.add_argument("--realistic-tokens", type=int, default=8)
    ap.add_argument("--realistic-rounds", type=int, default=2)
    ap.add_argument("--bundle", type=Path, default=TINY, help="the tiny bundle (default: "
                    "examples/bundles/tiny)")
    ap.add_argument("--no-tiny", action="store_true", help="skip the tiny bundle")
    ap.add_argument("--template", type=Path, help="config/tokenizer folder for the random "
                    "model (default: the tiny bundle's MLX folder)")
    ap.add_argument("--llama", action="store_true", help="also llama.cpp through the seam")
    ap.add_argument("--llama-threads", type=int, default=1,
                    help="llama.cpp threads (default 1: on a small shared host more threads "
                    "mostly wait on each other; 0 = llama.cpp's default, all cores)")
    ap.add_argument("--cache-dir", type=Path, default=Path(os.environ.get(
        "ELIZA_BENCH_CACHE", "/tmp/eliza-bench-mlx")))
    ap.add_argument("--json", action="store_true", help="print JSON instead of a table")
    args = ap.parse_args(argv)

    oracle = args.bundle / "oracle.json"
    prompt = json.loads(oracle.read_text())["prompts"][0]["prompt_ids"] if oracle.is_file() \
        else [0, *range(40, 59)]  # 20 ids, as the oracle's first prompt
    results = []
    if not args.no_tiny:
        results.append(bench_model("tiny", args.bundle, prompt, args.tokens, args.rounds, args.step,
                                   args.llama, args.llama_threads or None))
    if args.realistic:
        bundle = make_random_mlx_bundle(args.realistic, args.cache_dir, args.llama,
                                        args.template or args.bundle / "text" / "tiny-mlx")
        results.append(bench_model(f"random-{args.realistic}", bundle, prompt,
                                   args.realistic_tokens, args.realistic_rounds, args.step,
                                   args.llama, args.llama_threads or None))
    import eliza_mlx

    report = {"host": {"platform": platform.platform(), "machine": platform.machine(),
                       "cpus": os.cpu_count(), "python": platform.python_version(),
                       "mlx_backend": eliza_mlx.host_summary(),
                       "mlx_rank": eliza_mlx.MLXFactory().preference_rank()},
              "results": results}
    if args.json:
        print(json.dumps(report, indent=2))
        return 0
    print(f"host: {report['host']['platform']}, {report['host']['cpus']} cpus; "
          f"{report['host']['mlx_backend']}; mlx rank {report['host']['mlx_rank']}")
    print(f"{'model':<14} {'path':<16} {'TTFT ms':>9} {'decode tok/s':>13} {'ratio':>14}")
    for r in results:
        for path, v in r["paths"].items():
            ratio = ""
            if path == "seam":
                ratio = f"dec {r['ratio_decode']:.3f}x ttft {r['ratio_ttft']:.3f}x"
            elif path == "llama.cpp":
                ratio = f"{r['llama_over_mlx_decode']:.2f}x mlx decode"
            print(f"{r['model']:<14} {path:<16} {v['ttft_ms']:>9.2f} {v['decode_tok_s']:>13.1f}"
                  f"  {ratio}")
        print(f"{'':<14} ({r['prompt_tokens']} prompt tokens, {r['generated_tokens']} generated, "
              f"median of {r['rounds']} interleaved rounds, seam step {r['step']})")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
