"""The per-token cost of constrained decoding, per backend and vocabulary size: the same bundle
decoded greedily with no constraint, with logprobs (top 5), and under a JSON schema, interleaved
(``benchmarks/harness.py``), medians over rounds. The logits hook's own time per token (the
llguidance mask, applying it, recording logprobs: ``LogitsGuide.prepare/process/accept``) is
timed inside the same runs.

    python benchmarks/bench_structured.py BUNDLE [BUNDLE ...] [--backends llama.cpp,mlx,litert-lm]
        [--tokens 48] [--repeat 5] [--threads 2]

A constrained run decodes until its JSON is complete, so its ms/token is over the tokens it
made; the unconstrained runs decode ``--tokens`` tokens (``ignore_eos``).
"""

from __future__ import annotations

import argparse
import json
import statistics
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from harness import interleave

from eliza_backends import InferenceContext, open_stream, select
from eliza_backends.errors import ElizaError
from eliza_backends.structured.logits import LogitsGuide, OutputSpec

SCHEMA = {"type": "object", "properties": {
    "name": {"type": "string", "maxLength": 24}, "age": {"type": "integer", "minimum": 0,
                                                         "maximum": 120},
    "tags": {"type": "array", "items": {"type": "string", "maxLength": 12}, "maxItems": 3},
    "address": {"type": "object", "properties": {"city": {"type": "string", "maxLength": 24},
                                                 "zip": {"type": "string",
                                                         "pattern": "^[0-9]{5}$"}},
                "required": ["city", "zip"], "additionalProperties": False}},
    "required": ["name", "age", "tags", "address"], "additionalProperties": False}
OPTIONS: dict[str, dict[str, Any]] = {
    "llama.cpp": {}, "mlx": {}, "litert-lm": {"litert-lm": {"session": "interpreter"}}}

hook_seconds = [0.0]


def _timed(method: Callable[..., Any]) -> Callable[..., Any]:
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        t0 = time.perf_counter()
        try:
            return method(*args, **kwargs)
        finally:
            hook_seconds[0] += time.perf_counter() - t0
    return wrapper


for _name in ("prepare", "process", "accept"):
    setattr(LogitsGuide, _name, _timed(getattr(LogitsGuide, _name)))


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("bundles", nargs="+", type=Path)
    ap.add_argument("--backends", default="llama.cpp,mlx,litert-lm")
    ap.add_argument("--tokens", type=int, default=48)
    ap.add_argument("--repeat", type=int, default=5)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args(argv)
    rows = []
    for bundle in args.bundles:
        for backend in args.backends.split(","):
            try:
                select(bundle, backend=backend)
            except ElizaError:
                continue
            rows.append(_measure(bundle, backend, args))
    if args.json:
        print(json.dumps(rows, indent=1))
        return 0
    print("| bundle | backend | vocab | plain ms/tok | logprobs ms/tok (x plain) | json ms/tok "
          "(x plain) | hook ms/tok, json (min-max) | hook ms/tok, logprobs | hook share |")
    print("|---|---|---|---|---|---|---|---|---|")
    for r in rows:
        print(f"| {r['bundle']} | {r['backend']} | {r['vocab']} | {r['plain']:.2f} | "
              f"{r['logprobs']:.2f} ({r['logprobs'] / r['plain']:.2f}) | {r['json']:.2f} "
              f"({r['json'] / r['plain']:.2f}) | {r['hook_json']:.2f} "
              f"({r['hook_json_min']:.2f}-{r['hook_json_max']:.2f}) | "
              f"{r['hook_logprobs']:.2f} | {100 * r['hook_json'] / r['json']:.1f}% |")
    return 0


def _measure(bundle: Path, backend: str, args: Any) -> dict[str, Any]:
    specs = {"plain": OutputSpec(), "logprobs": OutputSpec(top_logprobs=5),
             "json": OutputSpec.from_config(_config(SCHEMA))}
    with InferenceContext(bundle) as ctx, open_stream(
            ctx, backend=backend, options=OPTIONS.get(backend, {}), threads=args.threads,
            context_size=1024, max_tokens=args.tokens) as stream:
        session = stream.session
        prompt = session.tokenize("Describe a person as JSON:", add_special=True)

        def run(name: str) -> tuple[float, float, int]:
            session.reset()
            session.set_output(specs[name])
            session.prefill(prompt)  # builds the turn's guide (not timed below)
            hook_seconds[0] = 0.0
            n, t0 = 0, time.perf_counter()
            while True:
                step = session.next()
                n += len(step.tokens)
                if step.final or (name != "json" and n >= args.tokens):
                    break
            wall = time.perf_counter() - t0
            return wall / n * 1e3, hook_seconds[0] / n * 1e3, n

        session.set_output(specs["json"])  # warm-up: the vocabulary is built once per model
        session.prefill(prompt)
        session.next()
        got = interleave(list(specs), args.repeat, run, warmup=True)
        vocab = session.vocab_size
    med = {k: statistics.median(x[0] for x in v) for k, v in got.items()}
    hooks = [x[1] for x in got["json"]]
    return {"bundle": bundle.name, "backend": backend, "vocab": vocab, **med,
            "hook_json": statistics.median(hooks), "hook_json_min": min(hooks),
            "hook_json_max": max(hooks), "json_tokens": got["json"][0][2],
            "hook_logprobs": statistics.median(x[1] for x in got["logprobs"])}


def _config(schema: dict[str, Any]) -> Any:
    from eliza_backends import StreamConfig

    return StreamConfig(json_schema=schema)


if __name__ == "__main__":
    raise SystemExit(main())
