#!/usr/bin/env python
"""Rank evidence on a realistic-size model: llama.cpp vs the LiteRT token-exact session.

    python benchmarks/bench_litert_realistic.py [--threads 1,2] [--reps 5] [--tokens 48]
                                                [--prompt-tokens 100] [--json]

One random-init Hugging Face ``LlamaForCausalLM`` (default: hidden 768, 6 layers, 12 heads /
4 KV heads, FFN 2048, vocab 32000, ~87 M parameters), written both ways from the same weights:
GGUF f16 (``tools/make_tiny_bundle.write_gguf``) and a litert-torch ``export_hf`` .tflite
(fp32, ``--quantization_recipe=none``, prefill lengths 32,128, cache length 512, through
``tools/make_tiny_bundle.export_litert``). The bundle is made at benchmark time under
``.bench-cache/litert-realistic-<shape>/`` (git-ignored) by running this script with
``--make-only`` in the tool venv (``/work/toolvenv``, or ``--tool-python``), which has torch,
transformers, litert-torch and gguf. Nothing it makes is committed.

Contestants, through the seam, loaded once, interleaved repetitions (rotated order), medians:
  llama.cpp            open_stream(backend="llama.cpp") on the f16 GGUF
  litert/interpreter   the LiteRT token-exact session on ai-edge-litert's Interpreter
  litert/compiled      the same session on the CompiledModel runtime
for each thread count. Prompt: ``--prompt-tokens`` random in-vocabulary ids (seeded);
greedy, ``ignore_eos``. TTFT = prefill start to the first token; decode tok/s = tokens after
the first / time after the first.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import statistics
import subprocess
import sys
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
TOOL_PYTHON = Path("/work/toolvenv/bin/python")
TINY_TOKENIZER = ROOT / "examples" / "bundles" / "tiny" / "text" / "tiny-mlx"

SHAPE = dict(hidden_size=768, intermediate_size=2048, num_hidden_layers=6,
             num_attention_heads=12, num_key_value_heads=4, head_dim=64)
VOCAB = 32000


def bundle_dir(shape: dict[str, int]) -> Path:
    tag = "h{hidden_size}-l{num_hidden_layers}-f{intermediate_size}".format(**shape)
    return ROOT / ".bench-cache" / f"litert-realistic-{tag}-v{VOCAB}"


# ---------------------------------------------------------------------------- make (tool venv)

def _padded_tokenizer(out_dir: Path) -> None:
    """The tiny bundle's byte-level BPE tokenizer padded to VOCAB ids with plain filler tokens
    (so the GGUF, the HF dir and the .tflite have a 32000-id vocabulary)."""
    tj = json.loads((TINY_TOKENIZER / "tokenizer.json").read_text())
    vocab = tj["model"]["vocab"]
    for i in range(len(vocab), VOCAB):
        vocab[f"<fill{i}>"] = i
    out_dir.mkdir(parents=True, exist_ok=True)
    (out_dir / "tokenizer.json").write_text(json.dumps(tj, ensure_ascii=False))
    for name in ("tokenizer_config.json", "chat_template.jinja"):
        (out_dir / name).write_bytes((TINY_TOKENIZER / name).read_bytes())


def make_bundle(out: Path) -> None:
    """Runs in the tool venv: random-init model -> HF dir, GGUF f16, .tflite (fp32)."""
    import time

    import torch
    from tokenizers import Tokenizer
    from transformers import LlamaForCausalLM

    sys.path.insert(0, str(ROOT / "tools"))
    import make_tiny_bundle as mtb

    torch.set_num_threads(1)
    torch.manual_seed(0)
    t0 = time.time()
    work = out / "work"
    hf = work / "hf"
    text = out / "text"
    text.mkdir(parents=True, exist_ok=True)
    _padded_tokenizer(work / "tokenizer")
    config = mtb.make_config(SHAPE)
    config.vocab_size = VOCAB
    model = LlamaForCausalLM(config).eval()
    # random init at the HF default std (0.02) gives near-flat logits; that is fine for timing
    mtb.save_hf_model(model, work / "tokenizer", hf)
    tok = Tokenizer.from_file(str(hf / "tokenizer.json"))
    mtb.write_gguf(model, tok, text / "realistic-f16.gguf", "realistic")
    print(f"gguf written ({time.time() - t0:.0f}s)", flush=True)
    del model
    litertlm = work / "realistic.litertlm"
    mtb.export_litert(hf, work, text / "realistic.tflite", litertlm)
    litertlm.unlink(missing_ok=True)  # the .tflite + tokenizer.json serve the token-exact session
    (text / "tokenizer.json").write_bytes((hf / "tokenizer.json").read_bytes())
    (out / "shape.json").write_text(json.dumps({**SHAPE, "vocab_size": VOCAB,
                                                "prefill_lengths": mtb.LITERT_PREFILL_LENGTHS,
                                                "cache_length": mtb.LITERT_CACHE_LENGTH}))
    print(f"bundle ready in {out} ({time.time() - t0:.0f}s)", flush=True)


def ensure_bundle(out: Path, tool_python: Path) -> None:
    if (out / "shape.json").is_file():
        return
    if not tool_python.is_file():
        raise SystemExit(f"the export needs the tool venv (torch, transformers, litert-torch, "
                         f"gguf): {tool_python} is missing; pass --tool-python or build it "
                         "from tools/requirements.txt")
    env = dict(os.environ, OMP_NUM_THREADS="1", HF_HUB_OFFLINE="1", TRANSFORMERS_OFFLINE="1")
    subprocess.run([str(tool_python), __file__, "--make-only", "--out", str(out)], check=True,
                   env=env)


# ---------------------------------------------------------------------------- bench

def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--threads", default="1,2")
    ap.add_argument("--reps", type=int, default=5)
    ap.add_argument("--tokens", type=int, default=48)
    ap.add_argument("--prompt-tokens", type=int, default=100)
    ap.add_argument("--tool-python", type=Path, default=TOOL_PYTHON)
    ap.add_argument("--out", type=Path, default=None)
    ap.add_argument("--make-only", action="store_true", help=argparse.SUPPRESS)
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args(argv)
    out = args.out or bundle_dir(SHAPE)
    if args.make_only:
        make_bundle(out)
        return 0
    ensure_bundle(out, args.tool_python)

    from bench_litert import seam
    from harness import interleave

    rng = random.Random(0)
    prompt = [0] + [rng.randrange(6, 384) for _ in range(args.prompt_tokens - 1)]
    report: dict[str, Any] = {"bundle": str(out), "shape": json.loads(
        (out / "shape.json").read_text()), "reps": args.reps, "tokens": args.tokens,
        "prompt_tokens": len(prompt), "threads": {}}
    for th in (int(t) for t in args.threads.split(",")):
        contestants = {
            "llama.cpp": seam(out, prompt, args.tokens, th, "llama.cpp"),
            "litert/interpreter": seam(out, prompt, args.tokens, th, "litert-lm",
                                       {"litert-lm": {"session": "interpreter"}}),
            "litert/compiled": seam(out, prompt, args.tokens, th, "litert-lm", {
                "litert-lm": {"session": "interpreter", "runtime": "compiled"}}),
        }
        results = interleave(list(contestants), args.reps,
                             lambda name, c=contestants: c[name][0](), warmup=True)
        for _, close in contestants.values():
            close()
        summary = {name: {"ttft_ms": statistics.median(r[0] for r in runs) * 1e3,
                          "decode_tok_s": statistics.median(r[1] for r in runs)}
                   for name, runs in results.items()}
        base = summary["llama.cpp"]
        for row in summary.values():
            row["decode_vs_llamacpp"] = row["decode_tok_s"] / base["decode_tok_s"]
            row["ttft_vs_llamacpp"] = row["ttft_ms"] / base["ttft_ms"]
        report["threads"][str(th)] = summary
        if not args.json:
            print(f"threads {th}  prompt {len(prompt)}  decode {args.tokens}  reps {args.reps} "
                  "(medians)")
            print(f"{'contestant':<22}{'TTFT ms':>10}{'x llama':>9}{'decode tok/s':>15}"
                  f"{'x llama':>9}")
            for name, row in summary.items():
                print(f"{name:<22}{row['ttft_ms']:>10.1f}{row['ttft_vs_llamacpp']:>9.2f}"
                      f"{row['decode_tok_s']:>15.1f}{row['decode_vs_llamacpp']:>9.2f}", flush=True)
    if args.json:
        print(json.dumps(report, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
