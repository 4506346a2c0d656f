"""The slot model fingerprint on a 1 GB file: cost of the first computation and of later ones.

    python benchmarks/bench_fingerprint.py [--size-mb 1024] [--repeat 3] [--json]

Rows, each in a fresh process (median [min-max] of ``--repeat``):

- ``sampled (98aaa27)``: the old fingerprint, sha256 of size + first and last MiB (it missed
  any change in between);
- ``full, first time``: :func:`eliza_backends.hashing.fingerprint_artifact` with an empty
cache:
  sha256 of every byte;
- ``full, cached``: the same in a new process once the on-disk cache holds the entry (a
  ``stat`` and one small file read).

The file is pseudo-random bytes written once into ``.bench-cache/`` and read from the page
cache (a cold read from disk adds the disk's time, once).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent

SAMPLED = """
import hashlib, os, sys, time
p = sys.argv[1]
t = time.perf_counter()
h = hashlib.sha256(f"{os.path.basename(p)}\\0{os.path.getsize(p)}\\0".encode())
with open(p, "rb") as f:
    h.update(f.read(1 << 20))
    f.seek(os.path.getsize(p) - (1 << 20))
    h.update(f.read(1 << 20))
print(time.perf_counter() - t)
"""
FULL = """
import sys, time
from eliza_backends.hashing import fingerprint_artifact
t = time.perf_counter()
fingerprint_artifact(sys.argv[1])
print(time.perf_counter() - t)
"""


def _make(path: Path, size: int) -> None:
    if path.is_file() and path.stat().st_size == size:
        return
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path, "wb") as f:
        block = os.urandom(1 << 20)
        for i in range(size >> 20):
            f.write(block[i % 256:] + block[:i % 256])  # every MiB different


def _run(code: str, path: Path, cache: str) -> float:
    env = {**os.environ, "ELIZA_CACHE_DIR": cache}
    out = subprocess.run([sys.executable, "-c", code, str(path)], capture_output=True,
                         text=True, check=True, env=env)
    return float(out.stdout.strip())


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--size-mb", type=int, default=1024)
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args()
    path = ROOT / ".bench-cache" / f"fingerprint-{args.size_mb}mb.bin"
    _make(path, args.size_mb << 20)
    rows: dict[str, list[float]] = {"sampled (98aaa27)": [], "full, first time": [],
                                    "full, cached": []}
    for _ in range(args.repeat):
        with tempfile.TemporaryDirectory() as cache:
            rows["sampled (98aaa27)"].append(_run(SAMPLED, path, cache))
            rows["full, first time"].append(_run(FULL, path, cache))
            rows["full, cached"].append(_run(FULL, path, cache))
    result = {k: {"median": statistics.median(v), "min": min(v), "max": max(v)}
              for k, v in rows.items()}
    if args.json:
        print(json.dumps({"size_mb": args.size_mb, "rows": result}, indent=2))
        return
    print(f"fingerprint of a {args.size_mb} MiB file (s), fresh processes, median [min-max]")
    for k, s in result.items():
        print(f"  {k:20s} {s['median']:.4f} [{s['min']:.4f}-{s['max']:.4f}]")


if __name__ == "__main__":
    main()
