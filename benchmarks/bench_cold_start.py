"""Cold start: a fresh process from its first import to its first token, through the seam and
through each runtime directly, with the seam's path broken down stage by stage.

    python benchmarks/bench_cold_start.py [--gguf PATH]... [--mlx] [--repeat 7] [--threads 2]
        [--json OUT.json]

Every run is a fresh Python process (``harness.spawn``); contenders run interleaved with
rotation (``harness.interleave``), medians with min-max, ratios against the runtime's own API.
Each worker starts its clock before its first import, so imports are included; the interpreter's
own start-up is the same for everyone and is left out (the ``wall`` column, the parent's view
of the whole process, includes it and the exit). Contenders per model:

- ``seam``: ``from eliza_backends import open_stream``; ``open_stream(bundle, threads=T,
  context_size=2048, max_tokens=1)``; ``prefill(PROMPT)``; ``next()``: what a user writes;
- ``stages``: the same work, one stage at a time, as ``open_stream`` does it (config
  validation, the bundle, registry discovery, selection, option parsing, the plugin's runtime
  import, model load, context creation), each timed: the breakdown;
- ``llama_cpp``: ``from llama_cpp import Llama``; ``Llama(gguf, n_ctx=2048, n_threads=T,
  verbose=False)``; ``tokenize`` + ``eval`` + ``sample(temp=0)`` (the same extra-buffer setting
  as the seam on this host, as in ``bench_load.py``);
- ``cli``: ``eliza-backends generate BUNDLE PROMPT --max-tokens 1``, wall time only, beside
  ``llama_cpp``'s wall time;
- with ``--mlx``, on the tiny bundle's MLX folder: ``seam`` (backend mlx-coreml) against
  ``mlx_lm.load`` + the first ``generate_step``;
- with ``--litert``, on the tiny bundle's ``.tflite``: the seam's interpreter session against
  ai-edge-litert's ``Interpreter`` used directly (prefill signature, one decode, argmax), both
  on the same token ids.

The bundles are plain ones (``create_bundle(link=True)``: the GGUF hard-linked beside a
manifest) in ``.bench-cache/cold-start/``. ``uptime``'s load average is recorded before and
after every round: on a shared machine, rerun when it is high.
"""

from __future__ import annotations

import time

T_START = time.perf_counter()  # before any other import: the workers' clock

import argparse  # noqa: E402
import json  # noqa: E402
import os  # noqa: E402
import subprocess  # noqa: E402
import sys  # noqa: E402
from pathlib import Path  # noqa: E402
from typing import Any  # noqa: E402

HERE = Path(__file__).resolve().parent
PROMPT = ("The history of the printing press begins in the fifteenth century, when Johannes "
          "Gutenberg combined movable metal type, oil-based ink and a screw press into a "
          "system that could")
N_CTX = 2048
#: The marks every worker sets, in order (seconds since the worker's clock started).
PHASES = ("import", "open", "prefill", "first_token")
TINY_BUNDLE = HERE.parent / "examples" / "bundles" / "tiny"
MLX_FOLDER = TINY_BUNDLE / "text" / "tiny-mlx"
LITERT_FILE = TINY_BUNDLE / "text" / "tiny.tflite"
#: The LiteRT pair: the seam's token-exact interpreter session on the tiny bundle's .tflite
#: (its KV cache holds 512 positions), a token-id prompt (the direct loop has no tokenizer).
LITERT_SPEC: dict[str, Any] = {
    "open": {"backend": "litert-lm", "context_size": 256, "batch_size": 64,
             "options": {"litert-lm": {"runtime": "interpreter", "artifact": "tiny.tflite"}}},
    "ids": [0, 43, 289, 87, 269, 51, 12, 300, 7, 99]}


def _since_start() -> float:
    return time.perf_counter() - T_START


def _cpu_seconds() -> float:
    """User + system CPU time of this process so far (all its threads): steadier than wall
    time on a loaded machine."""
    import resource

    usage = resource.getrusage(resource.RUSAGE_SELF)
    return usage.ru_utime + usage.ru_stime


# -------------------------------------------------------------------------------- workers


def worker_seam(bundle: str, threads: int, spec: dict[str, Any]) -> dict[str, Any]:
    """What a user writes; marks after the import, the open, the prefill and the token."""
    marks: dict[str, float] = {}
    from eliza_backends import open_stream

    marks["import"] = _since_start()
    stream = open_stream(bundle, threads=threads, max_tokens=1, **_open_kwargs(spec))
    marks["open"] = _since_start()
    stream.prefill(spec.get("ids") or PROMPT)
    marks["prefill"] = _since_start()
    step = stream.next()
    marks["first_token"] = _since_start()
    cpu = _cpu_seconds()
    stream.close()
    return {"marks": marks, "cpu": cpu, "token": step.tokens[0] if step.tokens else None}


def _open_kwargs(spec: dict[str, Any]) -> dict[str, Any]:
    """``open_stream``'s keywords of a target (``spec["open"]``; context 2048 by default)."""
    return {"context_size": N_CTX, **spec.get("open", {})}


def worker_stages(bundle: str, threads: int, spec: dict[str, Any]) -> dict[str, Any]:
    """``open_stream``'s work one stage at a time (its order), each stage's end marked."""
    marks: dict[str, float] = {}

    def mark(name: str) -> None:
        marks[name] = _since_start()

    import eliza_backends

    mark("import eliza_backends")
    from eliza_backends import stream as stream_module

    mark("import stream API")
    from eliza_backends.config import StreamConfig

    kwargs = _open_kwargs(spec)
    backend = kwargs.pop("backend", None)
    cfg = StreamConfig.build(None, threads=threads, max_tokens=1, **kwargs)
    mark("config validation")
    from eliza_backends.backend.context import InferenceContext

    context = InferenceContext(bundle)
    mark("bundle")
    from eliza_backends.registry import default_registry

    registry = default_registry()
    registry.factories()
    mark("registry discovery")
    from eliza_backends.selector import select

    factory = select(context.bundle_dir, backend=backend)
    mark("selection")
    stream_module.check_option_keys(cfg, registry)
    factory.parse_options(cfg)
    mark("options")
    _import_runtime(factory.name)
    mark("plugin + runtime import")
    loaded = _load_weights(factory, context, cfg)
    mark("model load" if loaded else "(no separate load)")
    session = factory.open(context, cfg)
    stream_module.check_capabilities(session, cfg, factory.name)
    mark("context creation" if loaded else "model load + context")
    stream = stream_module.Stream(session, backend=factory.name, context=context,
                                  owns_context=True)
    stream.prefill(spec.get("ids") or PROMPT)
    mark("first prefill")
    step = stream.next()
    mark("first token")
    stream.close()
    del eliza_backends
    return {"marks": marks, "token": step.tokens[0] if step.tokens else None}


def _import_runtime(backend: str) -> None:
    """The modules ``factory.open`` imports first, imported here to time them apart."""
    if backend == "llama.cpp":
        from eliza_llamacpp import model, session, solo  # noqa: F401
    elif backend == "mlx-coreml":
        import mlx_lm  # noqa: F401
    elif backend == "litert-lm":
        import ai_edge_litert.interpreter  # noqa: F401


def _load_weights(factory: Any, context: Any, cfg: Any) -> bool:
    """Load the weights into ``context`` as ``factory.open`` would (so that open then only
    makes the context); False where the backend has no separate load step to call."""
    if factory.name != "llama.cpp":
        return False
    from eliza_llamacpp.model import shared_model

    options = factory.parse_options(cfg)
    shared_model(context, factory.artifact(context.bundle_dir, name=options.artifact), options)
    return True


def worker_llama_cpp(gguf: str, threads: int) -> dict[str, Any]:
    """llama-cpp-python's own API doing the same work: import, load, tokenize, eval, sample."""
    marks: dict[str, float] = {}
    import llama_cpp

    marks["import"] = _since_start()
    extra = _seam_extra_buffers()
    defaults = llama_cpp.llama_model_default_params

    def patched() -> Any:  # the high-level class has no switch for extra buffer types
        params = defaults()
        params.use_extra_bufts = extra
        return params

    llama_cpp.llama_model_default_params = patched
    llama_cpp.llama_cpp.llama_model_default_params = patched
    llm = llama_cpp.Llama(gguf, n_ctx=N_CTX, n_threads=threads, n_threads_batch=threads,
                          verbose=False)
    marks["open"] = _since_start()
    tokens = llm.tokenize(PROMPT.encode("utf-8"))
    llm.eval(tokens)
    marks["prefill"] = _since_start()
    token = llm.sample(temp=0.0)
    marks["first_token"] = _since_start()
    cpu = _cpu_seconds()
    llm.close()
    return {"marks": marks, "cpu": cpu, "token": int(token)}


def _seam_extra_buffers() -> bool:
    """What the seam's llama.cpp plugin sets ``use_extra_bufts`` to on this host (read from
    /proc/cpuinfo without importing the plugin, which would add to this contender's time)."""
    try:
        with open("/proc/cpuinfo", encoding="ascii", errors="replace") as f:
            amx = any(line.startswith("flags") and " amx_int8" in line for line in f)
    except OSError:
        amx = False
    return not amx


def worker_mlx_lm(folder: str, threads: int) -> dict[str, Any]:
    """mlx-lm's own API: ``load``, then the first token of ``generate_step`` (greedy)."""
    marks: dict[str, float] = {}
    import mlx.core as mx
    from mlx_lm import load
    from mlx_lm.generate import generate_step

    marks["import"] = _since_start()
    model, tokenizer = load(folder)
    marks["open"] = _since_start()
    prompt = mx.array(tokenizer.encode(PROMPT))
    steps = generate_step(prompt, model, max_tokens=1)
    token, _ = next(steps)
    marks["prefill"] = marks["first_token"] = _since_start()
    del threads
    return {"marks": marks, "cpu": _cpu_seconds(), "token": int(token)}


def worker_litert(tflite: str, threads: int, ids: list[int]) -> dict[str, Any]:
    """ai-edge-litert's Interpreter used directly on the ``.tflite`` (as
    ``benchmarks/bench_litert.py``'s direct loop): the prefill signature over all but the
    last prompt token, then one decode of the last one, argmax."""
    marks: dict[str, float] = {}
    import numpy as np
    from ai_edge_litert.interpreter import Interpreter

    marks["import"] = _since_start()
    it = Interpreter(model_path=tflite, num_threads=threads)
    prefill = {int(k.split("_")[1]): it.get_signature_runner(k)
               for k in it.get_signature_list() if k.startswith("prefill_")}
    decode = it.get_signature_runner("decode")
    details = decode.get_input_details()
    cache = {k: np.zeros(v["shape"], dtype=v["dtype"]) for k, v in details.items()
             if k.startswith("kv_cache_")}
    keys = np.arange(int(details["mask"]["shape"][-1]))
    masks = np.where(keys[None, :] <= keys[:, None], 0.0,
                     np.finfo(np.float32).min).astype(np.float32)
    marks["open"] = _since_start()
    head = ids[:-1]
    size = min(length for length in prefill if len(head) <= length)
    toks = np.zeros((1, size), dtype=np.int32)
    toks[0, :len(head)] = head
    cache = prefill[size](tokens=toks, input_pos=np.arange(size, dtype=np.int32),
                          mask=masks[:size][None, None], **cache)
    marks["prefill"] = _since_start()
    out = decode(tokens=np.array([[ids[-1]]], dtype=np.int32),
                 input_pos=np.array([len(head)], dtype=np.int32),
                 mask=masks[len(head)][None, None, None], **cache)
    token = int(out["logits"][0, -1].argmax())
    marks["first_token"] = _since_start()
    return {"marks": marks, "cpu": _cpu_seconds(), "token": token}


WORKERS = {"seam": worker_seam, "stages": worker_stages}


def run_worker(argv: list[str]) -> None:
    """``--worker NAME TARGET THREADS SPEC``: one measurement, one JSON line (``SPEC``: the
    target's JSON: ``open`` keywords for ``open_stream``, token ``ids`` for the prompt)."""
    name, target, threads_text, spec_text = argv
    threads = int(threads_text)
    spec: dict[str, Any] = json.loads(spec_text or "{}")
    if name == "llama_cpp":
        out = worker_llama_cpp(target, threads)
    elif name == "mlx_lm":
        out = worker_mlx_lm(target, threads)
    elif name == "litert":
        out = worker_litert(target, threads, spec["ids"])
    else:
        out = WORKERS[name](target, threads, spec)
    print(json.dumps(out))


# -------------------------------------------------------------------------------- driver


def load_average() -> float:
    """The 1-minute load average (``uptime``'s first figure)."""
    return os.getloadavg()[0]


def plain_bundle(artifact: Path, cache: Path) -> Path:
    """A bundle holding only ``artifact`` (hard-linked, else copied), made once."""
    from eliza_backends.manifest import create_bundle

    out = cache / artifact.stem
    if not (out / "manifest.json").is_file():
        import shutil

        shutil.rmtree(out, ignore_errors=True)
        try:
            create_bundle(out, [artifact], link=True)
        except Exception:
            shutil.rmtree(out, ignore_errors=True)
            create_bundle(out, [artifact])
    return out


def source_path(checkout: Path) -> str:
    """``PYTHONPATH`` that runs another checkout's core and plugins (``--baseline``)."""
    dirs = [checkout / "src", *sorted((checkout / "plugins").glob("*/src"))]
    return os.pathsep.join(str(d) for d in dirs)


def timed_spawn(args: list[str], pythonpath: str | None = None) -> dict[str, Any]:
    """Run this script as a worker (``pythonpath``: another checkout's code first on the
    path); its JSON plus the parent's wall time and the load."""
    from harness import spawn

    saved = os.environ.get("PYTHONPATH")
    if pythonpath is not None:
        os.environ["PYTHONPATH"] = pythonpath
    load = load_average()
    t0 = time.perf_counter()
    try:
        out = spawn(Path(__file__), *args)
    finally:
        if pythonpath is not None:
            os.environ.pop("PYTHONPATH", None)
            if saved is not None:
                os.environ["PYTHONPATH"] = saved
    out["wall"] = time.perf_counter() - t0
    out["load"] = load
    return out


def timed_cli(bundle: Path, threads: int) -> dict[str, Any]:
    """``eliza-backends generate`` with one token, wall time."""
    cli = Path(sys.executable).with_name("eliza-backends")
    load = load_average()
    t0 = time.perf_counter()
    subprocess.run([str(cli), "generate", str(bundle), PROMPT, "--max-tokens", "1",
                    "--threads", str(threads), "--quiet"], check=True, capture_output=True,
                   env={**os.environ, "PYTHONHASHSEED": "0"})
    return {"wall": time.perf_counter() - t0, "load": load}


def measure(target: Path, direct: tuple[str, str], threads: int, repeat: int,
            spec: dict[str, Any], baseline: Path | None = None
            ) -> dict[str, list[dict[str, Any]]]:
    """Interleave seam, stages, the direct contender and the CLI on one bundle (and, with
    ``baseline``, the seam of that checkout: ``seam@baseline``)."""
    from harness import interleave

    runtime_name, runtime_target = direct
    seam_args = [str(target), str(threads), json.dumps(spec)]
    jobs = {
        "seam": lambda: timed_spawn(["seam", *seam_args]),
        "stages": lambda: timed_spawn(["stages", *seam_args]),
        runtime_name: lambda: timed_spawn([runtime_name, runtime_target, str(threads),
                                           json.dumps(spec)]),
    }
    if not spec:  # the CLI takes a text prompt and default options
        jobs["cli"] = lambda: timed_cli(target, threads)
    if baseline is not None:
        path = source_path(baseline)
        jobs["seam@baseline"] = lambda: timed_spawn(["seam", *seam_args], path)
        jobs["stages@baseline"] = lambda: timed_spawn(["stages", *seam_args], path)
    for job in jobs.values():  # warm-up: bytecode caches, the page cache
        job()
    return interleave(list(jobs), repeat, lambda name: jobs[name]())


def stage_table(samples: list[dict[str, Any]]) -> dict[str, Any]:
    """Each stage's own time (its mark minus the previous one), summarized over the runs."""
    from harness import summarize

    marks = [s["marks"] for s in samples]
    if not marks:
        return {}
    names = list(marks[0])
    return {name: summarize(m[name] - (m[names[i - 1]] if i else 0.0) for m in marks)
            for i, name in enumerate(names)}


def summarize_model(runs: dict[str, list[dict[str, Any]]], direct: str) -> dict[str, Any]:
    """Medians per contender and mark, the stage durations, and the ratios."""
    from harness import summarize

    out: dict[str, Any] = {"contenders": {}}
    for name, samples in runs.items():
        marks = [s.get("marks", {}) for s in samples]
        phases = {}
        if name in ("seam", "seam@baseline", direct):  # phase times; total: to first token
            for i, key in enumerate(PHASES):
                before = PHASES[i - 1] if i else None
                phases[key] = summarize(m[key] - (m[before] if before else 0.0)
                                        for m in marks)
            phases["total"] = summarize(m["first_token"] for m in marks)
            phases["cpu"] = summarize(s["cpu"] for s in samples)
        out["contenders"][name] = {
            **phases,
            "wall": summarize(s["wall"] for s in samples),
            "load": summarize(s["load"] for s in samples),
        }
    out["stages"] = stage_table(runs.get("stages", []))
    out["stages@baseline"] = stage_table(runs.get("stages@baseline", []))
    seam, ref = out["contenders"]["seam"], out["contenders"][direct]
    out["ratio_first_token"] = seam["total"]["median"] / ref["total"]["median"]
    out["ratio_wall"] = seam["wall"]["median"] / ref["wall"]["median"]
    if "cli" in out["contenders"]:
        out["ratio_cli_wall"] = (out["contenders"]["cli"]["wall"]["median"]
                                 / ref["wall"]["median"])
    per_round = [s["marks"]["first_token"] / r["marks"]["first_token"]
                 for s, r in zip(runs["seam"], runs[direct], strict=True)]
    out["ratio_first_token_per_round"] = summarize(per_round)
    out["ratio_cpu"] = seam["cpu"]["median"] / ref["cpu"]["median"]
    # the same work: every contender's first token is the same one
    out["first_tokens"] = sorted({s.get("token") for name in ("seam", "stages", direct)
                                  for s in runs[name]}, key=str)
    base = out["contenders"].get("seam@baseline")
    if base is not None:
        out["ratio_baseline_first_token"] = seam["total"]["median"] / base["total"]["median"]
        out["ratio_baseline_cpu"] = seam["cpu"]["median"] / base["cpu"]["median"]
    return out


def render(report: dict[str, Any]) -> str:
    """The text tables."""
    from harness import cell, format_table

    lines = [f"fresh processes, {report['repeat']} interleaved rounds, threads "
             f"{report['threads']}, ms: median (min-max); import/open/prefill/token: each "
             "phase's own time; to first token: from before the first import"]
    for model, res in report["models"].items():
        direct = res["direct"]
        lines.append(f"\n{model}")
        rows = []
        for name, s in res["contenders"].items():
            rows.append([name, *(cell(s.get(k), 1000, ".0f") for k in
                                  (*PHASES, "total", "cpu", "wall")),
                         cell(s["load"], 1, ".1f")])
        lines.append(format_table(["contender", "import", "open", "prefill", "token",
                                   "to first token", "cpu", "process wall", "load avg"], rows))
        cli = (f"; cli wall / {direct} wall {res['ratio_cli_wall']:.2f}"
               if "ratio_cli_wall" in res else "")
        lines.append(f"seam / {direct}: first token {res['ratio_first_token']:.2f} (per round "
                     f"{cell(res['ratio_first_token_per_round'], 1, '.2f')}), wall "
                     f"{res['ratio_wall']:.2f}, cpu {res['ratio_cpu']:.2f}{cli}")
        if "ratio_baseline_cpu" in res:
            lines.append(f"seam / seam@baseline: first token "
                         f"{res['ratio_baseline_first_token']:.2f}, cpu "
                         f"{res['ratio_baseline_cpu']:.2f}")
        if len(res["first_tokens"]) != 1:
            lines.append(f"WARNING: the contenders' first tokens differ: {res['first_tokens']}")
        if res["stages"]:
            before = res.get("stages@baseline") or {}
            lines.append("stages (ms, each stage's own time):")
            lines.append(format_table(
                ["stage", "ms", "baseline ms"],
                [[k, cell(v, 1000, ".1f"), cell(before.get(k), 1000, ".1f")]
                 for k, v in res["stages"].items()]))
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--gguf", action="append", default=None, help="GGUF to measure "
                    "(default: the real models, see benchmarks/real_models.py)")
    ap.add_argument("--mlx", action="store_true", help="also the tiny bundle's MLX folder")
    ap.add_argument("--litert", action="store_true", help="also the tiny bundle's .tflite "
                    "(the interpreter session vs ai-edge-litert's Interpreter, token ids)")
    ap.add_argument("--no-gguf", action="store_true", help="skip the GGUFs (with --mlx)")
    ap.add_argument("--repeat", type=int, default=7)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--json", type=Path, help="also write the report here")
    ap.add_argument("--baseline", type=Path, help="another checkout (e.g. `git archive "
                    "REV src plugins | tar -x -C DIR`) whose seam runs interleaved too")
    ap.add_argument("--worker", nargs=4, help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    if args.worker:
        run_worker(args.worker)
        return 0
    # bytecode caches on, as after a pip install (an environment may switch them off: then
    # every fresh process would compile this checkout's modules, and not the runtimes')
    os.environ.pop("PYTHONDONTWRITEBYTECODE", None)
    sys.path.insert(0, str(HERE))
    from harness import ROOT
    from real_models import HINT, real_ggufs

    cache = ROOT / ".bench-cache" / "cold-start"
    cache.mkdir(parents=True, exist_ok=True)
    targets: list[tuple[str, Path, tuple[str, str], dict[str, Any]]] = []
    if not args.no_gguf:
        ggufs = real_ggufs(args.gguf)
        if not ggufs:
            print(HINT, file=sys.stderr)
            return 1
        targets += [(g.name, plain_bundle(g, cache), ("llama_cpp", str(g)), {}) for g in ggufs]
    if args.mlx:
        targets.append(("tiny MLX", plain_bundle(MLX_FOLDER, cache),
                        ("mlx_lm", str(MLX_FOLDER)), {}))
    report: dict[str, Any] = {"repeat": args.repeat, "threads": args.threads,
                              "baseline": None if args.baseline is None else str(args.baseline),
                              "prompt": PROMPT, "n_ctx": N_CTX, "models": {},
                              "load_before": load_average()}
    if args.litert:
        targets.append(("tiny LiteRT", TINY_BUNDLE, ("litert", str(LITERT_FILE)), LITERT_SPEC))
    for label, bundle, direct, spec in targets:
        print(f"{label}: ", end="", file=sys.stderr, flush=True)
        runs = measure(bundle, direct, args.threads, args.repeat, spec, args.baseline)
        report["models"][label] = {"direct": direct[0], **summarize_model(runs, direct[0]),
                                   "samples": runs}
    report["load_after"] = load_average()
    print(render(report))
    if args.json:
        args.json.write_text(json.dumps(report, indent=2) + "\n", encoding="utf-8")
    return 0


if __name__ == "__main__":
    sys.exit(main())
