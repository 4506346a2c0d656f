"""Stream text from the bundled tiny model, first through the backend the selector picks, then
through every other installed backend that can serve the bundle, with the measured speed.

    python examples/demo.py [PROMPT] [--bundle DIR]
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from eliza_backends import ElizaError, explain, list_backends, open_stream

TINY = Path(__file__).resolve().parent / "bundles" / "tiny"


def stream_once(bundle: Path, prompt: str, backend: str | None) -> None:
    with open_stream(bundle, backend=backend, max_tokens=64, tokens_per_step=4) as stream:
        stream.prefill(prompt)
        print(f"--- {stream.backend} ---")
        print(prompt, end="", flush=True)
        for step in stream:
            print(step.text, end="", flush=True)
        m = stream.metrics
        print(f"\n    [{m.decode_tokens} tokens, {m.decode_tokens_per_second:,.0f} tok/s, "
              f"first token {1000 * (m.time_to_first_token or 0):.1f} ms]")


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("prompt", nargs="?", default="Four score and seven years ago")
    ap.add_argument("--bundle", type=Path, default=TINY)
    args = ap.parse_args()
    report = explain(args.bundle)
    print(report, end="\n\n")
    if report.error:
        return 1
    stream_once(args.bundle, args.prompt, None)
    for info in list_backends():
        if info.name == report.chosen or not info.available:
            continue
        try:
            stream_once(args.bundle, args.prompt, info.name)
        except ElizaError as exc:
            print(f"--- {info.name} --- skipped: {exc}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
