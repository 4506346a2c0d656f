"""Peak memory of each backend on the same weights, through the seam and used directly.

    python benchmarks/bench_memory.py --bundle BUNDLE [--repeat 3] [--threads 1] [--json]

``BUNDLE``: a bundle holding one model in several formats, as ``eliza-backends bundle convert``
makes it (an f32 GGUF, a ``.litertlm`` with its ``.tflite`` and a ``*-mlx-*`` folder, all from the
same weights); without one, the tiny bundle. Every contender runs in a fresh process (its peak
RSS is its own): load, prefill 64 tokens, decode 16 greedily, then report the peak RSS
(``VmHWM``), the anonymous and file-backed resident memory at the end (``RssAnon`` /
``RssFile``: mapped weights are file-backed, shared and reclaimable; a copy is anonymous), and
the peak as a multiple of the model file. Contenders are interleaved with rotation, medians.

- ``llama.cpp``: the seam on the ``.gguf`` (mmap, the default); ``llama.cpp-direct``: llama-cpp-
  python's ``Llama`` on the same file;
- ``litert/compiled``: the seam's token-exact session on the ``.litertlm`` (CompiledModel, the
  default runtime; a fresh temporary cache dir, so it packs its weights); ``litert/compiled-
  warm``: the same with a ``cache_dir`` a previous load filled (maps the packed weights);
  ``litert/interpreter``: the Interpreter runtime; ``litert/engine``: the LiteRT-LM engine
  session (a fresh cache dir); ``litert/engine-warm``: the same with a ``cache_dir`` an earlier
  load filled (LiteRT-LM keeps its packed weights there); ``litert-direct/bytes``:
  ``CompiledModel.from_buffer`` on the section read into ``bytes`` (what the seam did before it
  mapped the file); ``litert-direct/file``: ``CompiledModel.from_file`` on the ``.tflite``;
- ``mlx``: the seam on the MLX folder; ``mlx-direct``: ``mlx_lm.load`` + ``generate_step``.

Contenders whose artifact or runtime is missing are left out (said on stderr).
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import shutil
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from harness import TINY, cell, emit, format_table, interleave, spawn, summarize

PROMPT = "Write a short story about a lighthouse keeper who finds a message in a bottle. " * 3
N_PROMPT, N_GEN = 64, 16


def _status() -> dict[str, float]:
    """VmHWM / VmRSS / RssAnon / RssFile of this process in MB."""
    out = {}
    with open("/proc/self/status") as f:
        for line in f:
            key = line.split(":", 1)[0]
            if key in ("VmHWM", "VmRSS", "RssAnon", "RssFile"):
                out[key] = int(line.split()[1]) / 1024
    return out


def artifacts(bundle: Path) -> dict[str, Path]:
    """The bundle's file per format: gguf (the largest: f32 beside a quantized source),
    litertlm, tflite, mlx (a folder with config.json)."""
    text = bundle / "text"
    found: dict[str, Path] = {}
    ggufs = sorted(text.glob("*.gguf"), key=lambda p: p.stat().st_size)
    if ggufs:
        found["gguf"] = ggufs[-1]
    for ext in ("litertlm", "tflite"):
        files = sorted(text.glob(f"*.{ext}"))
        if files:
            found[ext] = files[0]
    mlx = sorted(p.parent for p in text.glob("*mlx*/config.json"))
    if mlx:
        found["mlx"] = mlx[0]
    return found


def _size(path: Path) -> int:
    if path.is_dir():
        return sum(p.stat().st_size for p in path.glob("*.safetensors"))
    return path.stat().st_size


# ---------------------------------------------------------------------------- workers


def _seam(bundle: Path, backend: str, options: dict[str, Any], threads: int) -> None:
    from eliza_backends import open_stream

    # LiteRT-LM's engine ends a turn at its stop tokens itself (no ignore_eos): it may stop early
    ignore_eos = options.get("session") != "engine"
    with open_stream(bundle, backend=backend, threads=threads, max_tokens=N_GEN,
                     ignore_eos=ignore_eos, context_size=512, options={backend: options}
                     ) as stream:
        stream.prefill(stream.session.tokenize(PROMPT)[:N_PROMPT])
        for _ in stream:
            pass


def _llama_direct(path: Path, threads: int) -> None:
    import llama_cpp as lc

    llm = lc.Llama(str(path), n_ctx=512, n_threads=threads, verbose=False)
    ids = llm.tokenize(PROMPT.encode())[:N_PROMPT]
    for _ in llm.create_completion(ids, max_tokens=N_GEN, temperature=0.0, stream=True):
        pass


def _litert_direct(path: Path, how: str, threads: int) -> None:
    import numpy as np
    from ai_edge_litert.compiled_model import CompiledModel  # type: ignore[import-untyped]
    from ai_edge_litert.options import CpuOptions, Options  # type: ignore[import-untyped]

    opts = Options(cpu_options=CpuOptions(num_threads=threads))
    if how == "bytes":
        sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "plugins" /
                               "eliza_litert" / "src"))
        from eliza_litert.container import read_container

        cm = CompiledModel.from_buffer(read_container(path).tflite_model(), options=opts)
    else:
        cm = CompiledModel.from_file(str(path), options=opts)
    for sig in cm.get_signature_list():  # one call of each signature on zero inputs
        idx = cm.get_signature_index(sig)
        ins = cm.create_input_buffers(idx)
        outs = cm.create_output_buffers(idx)
        for buf, (_, d) in zip(ins, cm.get_input_tensor_details(sig).items(), strict=True):
            buf.write(np.zeros(d["shape"], d["dtype"]))
        cm.run_by_index(idx, ins, outs)


def _mlx_direct(path: Path) -> None:
    import mlx.core as mx
    from mlx_lm import load
    from mlx_lm.generate import generate_step

    model, tok = load(str(path))
    ids = mx.array(tok.encode(PROMPT)[:N_PROMPT])
    for n, _ in enumerate(generate_step(ids, model)):
        if n + 1 >= N_GEN:
            break


def worker(contender: str, bundle: Path, threads: int, cache_dir: str | None) -> dict[str, Any]:
    """Run one contender in this (fresh) process; its memory figures."""
    arts = artifacts(bundle)
    t0 = time.perf_counter()
    if contender == "llama.cpp":
        _seam(bundle, "llama.cpp", {"artifact": arts["gguf"].name}, threads)
        size = _size(arts["gguf"])
    elif contender == "llama.cpp-direct":
        _llama_direct(arts["gguf"], threads)
        size = _size(arts["gguf"])
    elif contender.startswith("litert/"):
        kind = contender.split("/", 1)[1]
        opts: dict[str, Any] = {"artifact": arts["litertlm"].name}
        if kind.startswith("engine"):
            opts["session"] = "engine"
        else:
            opts["session"] = "interpreter"
            opts["runtime"] = "interpreter" if kind == "interpreter" else "compiled"
        if kind.endswith("-warm") and cache_dir:  # a dir of its own per session kind
            own = Path(cache_dir) / kind
            own.mkdir(exist_ok=True)
            opts["cache_dir"] = str(own)
        _seam(bundle, "litert-lm", opts, threads)
        size = _size(arts["litertlm"])
    elif contender == "litert-direct/bytes":
        _litert_direct(arts["litertlm"], "bytes", threads)
        size = _size(arts["litertlm"])
    elif contender == "litert-direct/file":
        _litert_direct(arts["tflite"], "file", threads)
        size = _size(arts["tflite"])
    elif contender == "mlx":
        _seam(bundle, "mlx", {"artifact": arts["mlx"].name}, threads)
        size = _size(arts["mlx"])
    elif contender == "mlx-direct":
        _mlx_direct(arts["mlx"])
        size = _size(arts["mlx"])
    else:
        raise SystemExit(f"unknown contender {contender}")
    st = _status()
    return {"wall_s": time.perf_counter() - t0, "model_mb": size / 2**20, "peak_mb": st["VmHWM"],
            "anon_mb": st.get("RssAnon"), "file_mb": st.get("RssFile"),
            "peak_x_model": st["VmHWM"] * 2**20 / size}


def contenders_for(bundle: Path) -> list[str]:
    """The contenders this bundle and this install can run."""
    arts = artifacts(bundle)
    have = importlib.util.find_spec
    out = []
    if "gguf" in arts and have("llama_cpp"):
        out += ["llama.cpp", "llama.cpp-direct"]
    if "litertlm" in arts and have("ai_edge_litert"):
        out += ["litert/compiled", "litert/compiled-warm", "litert/interpreter",
                "litert-direct/bytes"]
        if have("litert_lm"):
            out += ["litert/engine", "litert/engine-warm"]
    if "tflite" in arts and have("ai_edge_litert"):
        out.append("litert-direct/file")
    if "mlx" in arts and have("mlx_lm"):
        out += ["mlx", "mlx-direct"]
    missing = {"gguf", "litertlm", "tflite", "mlx"} - set(arts)
    if missing:
        print(f"{bundle} has no {', '.join(sorted(missing))}: those contenders are left out",
              file=sys.stderr)
    return out


def bench(bundle: Path, repeat: int, threads: int, names: list[str]) -> dict[str, Any]:
    """Every contender ``repeat`` times, interleaved; medians per contender."""
    cache_dir = tempfile.mkdtemp(prefix="eliza-bench-memory-")
    try:
        common = ["--bundle", str(bundle), "--threads", str(threads), "--cache-dir", cache_dir]
        for warm in ("litert/compiled-warm", "litert/engine-warm"):
            if warm in names:  # fill the cache dir once, unmeasured
                spawn(__file__, warm, *common)
        runs = interleave(names, repeat, lambda c: spawn(__file__, c, *common))
    finally:
        shutil.rmtree(cache_dir, ignore_errors=True)
    rows = {c: {k: summarize(r.get(k) for r in runs[c])
                for k in ("peak_mb", "anon_mb", "file_mb", "peak_x_model", "wall_s")}
            | {"model_mb": runs[c][0]["model_mb"]} for c in names}
    return {"bundle": str(bundle), "threads": threads, "repeat": repeat,
            "prompt_tokens": N_PROMPT, "gen_tokens": N_GEN, "rows": rows}


def render(report: dict[str, Any]) -> str:
    """The report as a Markdown table."""
    head = ["contender", "model MB", "peak RSS MB", "peak / model", "anon MB (end)",
            "file-backed MB (end)"]
    body = [[c, f"{r['model_mb']:.0f}", cell(r["peak_mb"], fmt=".0f"),
             cell(r["peak_x_model"], fmt=".2f"), cell(r["anon_mb"], fmt=".0f"),
             cell(r["file_mb"], fmt=".0f")] for c, r in report["rows"].items()]
    return (f"{report['bundle']}: load, prefill {report['prompt_tokens']}, decode "
            f"{report['gen_tokens']}; {report['threads']} thread(s), {report['repeat']} "
            "interleaved fresh-process runs, median (min-max)\n\n" + format_table(head, body))


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--bundle", type=Path, default=TINY)
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--contenders", default="", help="comma list (default: all that can run)")
    ap.add_argument("--json", action="store_true")
    ap.add_argument("--worker", help=argparse.SUPPRESS)
    ap.add_argument("--cache-dir", help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    if args.worker:
        print(json.dumps(worker(args.worker, args.bundle, args.threads, args.cache_dir)))
        return 0
    names = args.contenders.split(",") if args.contenders else contenders_for(args.bundle)
    emit(bench(args.bundle, args.repeat, args.threads, names), args.json, render)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
