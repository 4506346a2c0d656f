#!/usr/bin/env python
"""Greedy MTP drafting with the tiny Gemma 4 pair straight on llama-cpp-python 0.3.36's
low-level API (no eliza_backends code): the acceptance llama.cpp itself gives for the bundle's
assistant on the oracle prompts, and whether the output equals the oracle (plain greedy).

Usage: .venv/bin/python tools/gemma4_mtp_acceptance.py BUNDLE [--k 4]

The drive is tests/direct_runtimes.py's ``llamacpp_mtp_greedy`` (it follows llama.cpp's
``common_speculative_impl_draft_mtp`` for a shared-KV assistant).
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "tests"))

import direct_runtimes as dr


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("bundle", type=Path)
    ap.add_argument("--k", type=int, default=4)
    args = ap.parse_args(argv)
    oracle = json.loads((args.bundle / "oracle.json").read_text())
    target = args.bundle / "text" / "gemma4-tiny-f32.gguf"
    assistant = args.bundle / "text" / "draft" / "mtp" / "gemma4-tiny-assistant-f32.gguf"
    total_d = total_a = same = 0
    rows = {}
    for case in oracle["prompts"]:
        want = case["continuation_ids"]
        got, drafted, accepted = dr.llamacpp_mtp_greedy(target, assistant, case["prompt_ids"],
                                                        len(want), args.k)
        same += got == want
        rows[case["name"]] = {"drafted": drafted, "accepted": accepted,
                              "equals_oracle": got == want}
        total_d += drafted
        total_a += accepted
    print(json.dumps({"k": args.k, "drafted": total_d, "accepted": total_a,
                      "acceptance": round(total_a / max(1, total_d), 4),
                      "prompts_equal_to_oracle": f"{same}/{len(oracle['prompts'])}",
                      "per_prompt": rows}, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
