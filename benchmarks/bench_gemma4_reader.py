"""What reading a Gemma 4 reply as it streams costs, next to reading it whole.

    python benchmarks/bench_gemma4_reader.py [--repeat 7]

Two replies of about 4,300 characters: one call whose string argument is 700 lines of code,
and plain prose. Rows (median of ``--repeat`` interleaved rounds, one process):

- ``strict, whole``: :func:`eliza_backends.openai.gemma4_calls.parse_gemma4_reply` (the call);
- ``reader, whole``: :func:`eliza_backends.openai.gemma4_reader.read_gemma4_reply`;
- ``reader, 4-char pieces``: :class:`~eliza_backends.openai.gemma4_reader.Gemma4Reader` fed
  four characters at a time (about a token each), as a streamed generation feeds it; the
  per-piece cost is the row divided by the pieces.
"""

from __future__ import annotations

import argparse
import statistics
import time
from collections.abc import Callable

from eliza_backends.openai.gemma4_calls import parse_gemma4_reply
from eliza_backends.openai.gemma4_reader import Gemma4Reader, read_gemma4_reply

Q = '<|"|>'
CALL = (f"<|tool_call>call:write{{content:{Q}" + "x = 1\n" * 700 +
        f"{Q},path:{Q}a.py{Q}}}<tool_call|>")
PROSE = "The quick brown fox jumps over the lazy dog. " * 95
TOOLS = {"write": {"type": "object", "properties": {"content": {"type": "string"},
                                                    "path": {"type": "string"}}}}


def _pieces(text: str) -> None:
    reader = Gemma4Reader(TOOLS)
    for i in range(0, len(text), 4):
        reader.feed(text[i:i + 4])
    reader.finish()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeat", type=int, default=7)
    args = parser.parse_args()
    rows: dict[str, Callable[[], object]] = {
        "call  strict, whole": lambda: parse_gemma4_reply(CALL, set(TOOLS)),
        "call  reader, whole": lambda: read_gemma4_reply(CALL, TOOLS),
        "call  reader, 4-char pieces": lambda: _pieces(CALL),
        "prose reader, whole": lambda: read_gemma4_reply(PROSE, TOOLS),
        "prose reader, 4-char pieces": lambda: _pieces(PROSE),
    }
    times: dict[str, list[float]] = {name: [] for name in rows}
    for _ in range(args.repeat):  # interleaved: every row once per round
        for name, run in rows.items():
            start = time.perf_counter()
            run()
            times[name].append(time.perf_counter() - start)
    print(f"call {len(CALL)} chars, prose {len(PROSE)} chars, "
          f"{len(CALL) // 4 + 1} / {len(PROSE) // 4 + 1} pieces")
    for name, values in times.items():
        print(f"{name:30s} median {statistics.median(values) * 1e3:8.2f} ms")


if __name__ == "__main__":
    main()
