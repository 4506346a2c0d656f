"""llama.cpp's flash attention: off / on / auto through the seam, and each against
llama-cpp-python's ``Llama`` at the same setting (greedy tokens must be equal).

    python benchmarks/bench_flash_attention.py GGUF [GGUF...] [--repeat 3] [--gen 64]
        [--prompt-tokens 128] [--threads 2]

Each (model, setting) runs in a fresh process, interleaved off/on/auto with rotation
(``benchmarks/harness.py``), so machine noise hits all alike; reported: decode and prefill
tok/s (median, min-max) and whether the seam's 64 greedy tokens equal ``Llama``'s at that
setting (``Llama(flash_attn=...)`` takes on/off only; auto is compared with neither).
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
from pathlib import Path
from typing import Any

from harness import ROOT, cell, emit, format_table, interleave, spawn, summarize

sys.path.insert(0, str(ROOT / "tests"))
from direct_runtimes import direct_llama

SETTINGS = ("off", "on", "auto")
PROMPT = ("The history of the lighthouse begins on a rocky coast where sailors needed a light "
          "to guide them home through storms and fog. ")


def worker(gguf: str, setting: str, gen: int, prompt_tokens: int, threads: int) -> dict[str, Any]:
    """One measurement in this process: the seam, then Llama at the same setting."""
    import shutil

    import llama_cpp
    import numpy as np

    from eliza_backends import open_stream

    with tempfile.TemporaryDirectory() as tmp:
        bundle = Path(tmp)
        (bundle / "text").mkdir()
        (bundle / "text" / "m.gguf").symlink_to(Path(gguf).resolve())
        options = {"llama.cpp": {"flash_attention": setting}}
        with open_stream(bundle, backend="llama.cpp", options=options, max_tokens=gen,
                         temperature=0.0, ignore_eos=True, threads=threads,
                         context_size=1024) as s:
            ids = s.session.tokenize(PROMPT * 40)[:prompt_tokens]
            s.prefill(ids[:8])
            s.next(4)  # warm-up
            s.reset()
            s.prefill(ids)
            got = [t for step in s for t in step.tokens]
            m = s.metrics
            decode, prefill = m.decode_tokens_per_second, m.prefill_tokens_per_second
        shutil.rmtree(bundle / "text")
    same: bool | None = None
    if setting != "auto":
        llm = direct_llama(model_path=gguf, n_ctx=1024, n_batch=512, n_threads=threads,
                              n_threads_batch=threads, flash_attn=setting == "on",
                              verbose=False)
        llm.eval(ids)
        want = []
        for _ in range(gen):
            logits = np.ctypeslib.as_array(llama_cpp.llama_get_logits_ith(llm.ctx, -1),
                                           shape=(llm.n_vocab(),))
            want.append(int(np.argmax(logits)))
            llm.eval([want[-1]])
        same = want == got
    return {"decode": decode, "prefill": prefill, "same_as_llama": same}


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("ggufs", nargs="*")
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--gen", type=int, default=64)
    ap.add_argument("--prompt-tokens", type=int, default=128)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--worker", nargs=2, metavar=("GGUF", "SETTING"))
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args()
    if args.worker:
        print(json.dumps(worker(args.worker[0], args.worker[1], args.gen, args.prompt_tokens,
                                args.threads)))
        return 0
    common = ("--gen", str(args.gen), "--prompt-tokens", str(args.prompt_tokens),
              "--threads", str(args.threads))
    report = []
    for gguf in args.ggufs:
        runs = interleave(SETTINGS, args.repeat,
                          lambda setting, g=gguf: spawn(__file__, g, setting, *common))
        for setting in SETTINGS:
            done = runs[setting]
            report.append({"model": Path(gguf).name, "flash_attention": setting,
                           "decode": summarize(r["decode"] for r in done),
                           "prefill": summarize(r["prefill"] for r in done),
                           "same_as_llama": [r["same_as_llama"] for r in done]})
    emit({"threads": args.threads, "rows": report}, args.json, render)
    return 0


def render(report: dict[str, Any]) -> str:
    """The rows as a table (greedy equality: every repeat's verdict)."""
    verdict = {True: "yes", False: "NO", None: "n/a"}
    rows = [(r["model"], r["flash_attention"], cell(r["decode"]), cell(r["prefill"]),
             "/".join(verdict[v] for v in r["same_as_llama"])) for r in report["rows"]]
    return format_table(("model", "flash attention", "decode tok/s", "prefill tok/s",
                         "greedy = Llama at same setting"), rows)


if __name__ == "__main__":
    raise SystemExit(main())
