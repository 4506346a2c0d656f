"""The side-by-side benchmark suite: every backend through the seam vs its runtime used directly.

    python benchmarks/suite.py [--quick] [--real [--gguf A.gguf,B.gguf] [--converted BUNDLE]]
                               [--out benchmarks/results]

Runs, in one go, each per-backend script (each interleaves its contenders A B A B and reports
medians and ratios) plus the machine's memory-read bandwidth, and writes to ``--out``:

- ``latest.json``: every script's JSON, the bandwidth, the machine;
- ``latest.md``: the tables (pasted into docs/benchmarks.md);
- ``decode_by_position.png``: llama.cpp decode tok/s per position bucket, seam vs direct.

The decode ceiling printed beside llama.cpp's figures is bandwidth / weight bytes (the GGUF's
size, a slight over-count of what a token reads): every decoded token reads every weight once,
so no backend can beat it on this machine.

``--real`` adds the real models (``benchmarks/real_models.py`` finds them) to the llama.cpp table
with llama-bench (when ``benchmarks/build_llama_bench.sh`` built it), ``llama_cpp.Llama`` and
multi-token steps beside the seam, runs the draft policy on them
(``benchmarks/bench_draft_policy.py``), and with ``--converted BUNDLE`` (a bundle that ``bundle
convert`` made: f32 GGUF, ``.litertlm``, MLX) the memory table (``benchmarks/bench_memory.py``).
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import threading
import time
from pathlib import Path
from typing import Any

from harness import HERE, ROOT, cell, run_script
from real_models import HINT, real_ggufs


def memory_read_bandwidth(threads: int = 2, mib: int = 512, repeat: int = 5) -> float:
    """Best-of-``repeat`` read bandwidth in GB/s: ``threads`` threads each summing their own
    ``mib`` MiB array (numpy releases the GIL in the reduction)."""
    import numpy as np

    arrays = [np.ones(mib * 2**20 // 8, dtype=np.float64) for _ in range(threads)]
    best = 0.0
    for _ in range(repeat):
        barrier = threading.Barrier(threads + 1)

        def work(a: Any, barrier: threading.Barrier = barrier) -> None:
            barrier.wait()
            a.sum()

        workers = [threading.Thread(target=work, args=(a,)) for a in arrays]
        for w in workers:
            w.start()
        t0 = time.perf_counter()
        barrier.wait()
        for w in workers:
            w.join()
        dt = time.perf_counter() - t0
        best = max(best, threads * mib * 2**20 / dt / 1e9)
    return best


def machine() -> dict[str, Any]:
    """What the numbers were measured on."""
    cpu = platform.processor() or ""
    try:
        with open("/proc/cpuinfo") as f:
            cpu = next((ln.split(":", 1)[1].strip() for ln in f if ln.startswith("model name")),
                       cpu)
    except OSError:
        pass
    return {"cpu": cpu, "cores": os.cpu_count(), "python": platform.python_version(),
            "platform": platform.platform(), "date": time.strftime("%Y-%m-%d %H:%M UTC",
                                                                   time.gmtime())}


def plot(llama: dict[str, Any], path: Path) -> bool:
    """Decode tok/s by position bucket, one line per contender per model."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return False
    models = llama.get("models", {})
    fig, axes = plt.subplots(1, max(len(models), 1), figsize=(6 * max(len(models), 1), 4))
    axes = axes if hasattr(axes, "__len__") else [axes]
    for ax, (model, rows) in zip(axes, models.items(), strict=False):
        for contender, r in rows.items():
            pos = r.get("per_position_tps") or {}
            if pos:
                ax.plot(range(len(pos)), list(pos.values()), marker="o", label=contender)
                ax.set_xticks(range(len(pos)), list(pos.keys()), rotation=30, fontsize=7)
        ax.set_title(f"llama.cpp {model}: decode tok/s by position")
        ax.set_ylabel("tok/s")
        ax.set_ylim(bottom=0)
        ax.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    return True


def markdown(report: dict[str, Any]) -> str:
    """The suite's tables as Markdown."""
    m = report["machine"]
    lines = [f"Measured {m['date']} on {m['cpu']} ({m['cores']} cores), Python {m['python']}.",
             f"Memory read bandwidth (2 threads): **{report['bandwidth_gbs']:.1f} GB/s**.", ""]
    llama = report.get("llama.cpp", {})
    if "models" in llama:
        lines += ["### llama.cpp: seam vs llama-cpp-python used directly", "",
                  f"{llama['threads']} threads, prompt {llama['prompt_tokens']} tokens, "
                  f"{llama['gen_tokens']} generated, {llama['repeat']} interleaved repeats.", "",
                  "| model | contender | decode tok/s (min-max) | vs minimal | vs llama-bench "
                  "| prefill tok/s (min-max) | vs llama-bench | first token ms | load s "
                  "| peak RSS MB | ceiling tok/s |", "|---" * 11 + "|"]

        def ratio(r: dict[str, Any], key: str) -> str:
            return f"{r[key]:.3f}" if key in r else "-"

        for model, rows in llama["models"].items():
            ceiling = report.get("ceilings", {}).get(model)
            for c, r in rows.items():
                lines.append(
                    f"| {model} | {c} | {cell(r['decode_tps'])} | "
                    f"{ratio(r, 'decode_ratio_vs_minimal')} | "
                    f"{ratio(r, 'decode_ratio_vs_llama_bench')} | {cell(r['prefill_tps'])} | "
                    f"{ratio(r, 'prefill_ratio_vs_llama_bench')} | "
                    f"{cell(r['ttft_s'], 1000)} | {cell(r['load_s'], fmt='.2f')} | "
                    f"{cell(r['peak_rss_mb'], fmt='.0f')} | "
                    f"{f'{ceiling:.0f}' if ceiling else '-'} |")
        lines.append("")
    for key in ("litert", "mlx", "speculative", "draft-policy", "memory"):
        data = report.get(key)
        if data is None:
            continue
        lines += [f"### {key}", "", "```json", json.dumps(
            {k: v for k, v in data.items() if not k.startswith("_")}, indent=1)[:6000], "```",
            ""]
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--out", type=Path, default=HERE / "results")
    ap.add_argument("--quick", action="store_true", help="fewer repeats and tokens")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--skip", default="", help="comma list of: llama.cpp,litert,mlx,speculative")
    ap.add_argument("--real", action="store_true", help="add the real models")
    ap.add_argument("--gguf", default="", help="comma list of real GGUFs (with --real)")
    ap.add_argument("--converted", type=Path, help="a converted bundle for the memory table")
    args = ap.parse_args(argv)
    real = real_ggufs(list(filter(None, args.gguf.split(",")))) if args.real else []
    if args.real and not real:
        raise SystemExit(HINT)
    skip = set(filter(None, args.skip.split(",")))
    reps = "2" if args.quick else "3"
    report: dict[str, Any] = {"machine": machine(),
                              "bandwidth_gbs": memory_read_bandwidth(threads=2)}
    if "llama.cpp" not in skip:
        models = ",".join(["tiny", "q4_0", "q8_0", *map(str, real)])
        report["llama.cpp"] = run_script(
            "bench_llamacpp.py", "--models", models, "--repeat", reps,
            "--gen", "64" if args.quick else "128", "--threads", str(args.threads))
        sizes = {p.stem: p.stat().st_size for p in real}
        for model in ("q4_0", "q8_0"):
            gguf = sorted((ROOT / ".bench-cache" / f"random-0.85b-{model}" / "text")
                          .glob("*.gguf"))
            if gguf:
                sizes[model] = gguf[0].stat().st_size
        report["ceilings"] = {m: report["bandwidth_gbs"] * 1e9 / size
                              for m, size in sizes.items()}
    if "litert" not in skip:
        report["litert"] = run_script("bench_litert.py", "--reps", "3" if args.quick else "7")
    if "mlx" not in skip:
        report["mlx"] = run_script("bench_mlx.py", "--rounds", reps)
    if "speculative" not in skip:
        report["speculative"] = run_script("bench_speculative.py", "--repeat", reps,
                                           "--threads", str(args.threads), "--gen",
                                           "64" if args.quick else "128")
    if real and "draft-policy" not in skip:
        report["draft-policy"] = run_script(
            "bench_draft_policy.py", "--models", ",".join(map(str, real)), "--repeat", reps,
            "--threads", str(args.threads), "--gen", "64")
    if args.converted is not None and "memory" not in skip:
        report["memory"] = run_script("bench_memory.py", "--bundle", str(args.converted),
                                      "--repeat", reps, "--threads", str(args.threads))
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "latest.json").write_text(json.dumps(report, indent=2))
    md = markdown(report)
    (args.out / "latest.md").write_text(md + "\n")
    if "llama.cpp" in report and "models" in report["llama.cpp"]:
        plot(report["llama.cpp"], args.out / "decode_by_position.png")
    print(md)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
