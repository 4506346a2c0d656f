#!/usr/bin/env python
"""Write BUNDLE/parity.json for the tiny Gemma 4 bundle: every model artifact, through the seam
(``open_stream``), scored against the float32 torch oracle in BUNDLE/oracle.json with the same
scorer ``bundle convert --verify`` uses (eliza_backends.convert.verify.score_artifact).

Usage (the project's own venv, with the runtimes installed):
    .venv/bin/python tools/gemma4_parity.py examples/bundles/gemma4-tiny
"""

from __future__ import annotations

import json
import sys
import time
from pathlib import Path
from typing import Any


def main(argv: list[str]) -> int:
    from eliza_backends.convert.verify import _artifact_runs, score_artifact

    root = Path(argv[0]).resolve()
    oracle = json.loads((root / "oracle.json").read_text(encoding="utf-8"))
    n = oracle["n_tokens"]
    prompts = [(p["name"], p["prompt_ids"]) for p in oracle["prompts"]]
    ref = {p["name"]: {"ids": p["continuation_ids"], "gaps": p["logit_gaps"]}
           for p in oracle["prompts"]}
    eog = frozenset(oracle["tokenizer"]["stop_ids"])
    results: dict[str, Any] = {}
    for label, backend, options in _artifact_runs(root):
        t0 = time.monotonic()
        try:
            res = score_artifact(root, backend, options, prompts, ref, eog, threads=1)
        except Exception as exc:  # one artifact failing must not hide the others' results
            res = {"backend": backend, "options": options,
                   "error": f"{type(exc).__name__}: {exc}"}
        res["seconds"] = round(time.monotonic() - t0, 1)
        results[label] = res
        print(label, res.get("error") or f"greedy {res['greedy_agree']}/{res['positions']}",
              flush=True)
    doc = {"schema_version": 1,
           "reference": "float32 torch transformers Gemma4ForCausalLM (oracle.json: greedy, "
                        "full recompute)", "n_tokens": n,
           "prompts": [{"name": name, "ids": ids, "reference_ids": ref[name]["ids"],
                        "reference_gaps": ref[name]["gaps"]} for name, ids in prompts],
           "artifacts": results}
    (root / "parity.json").write_text(json.dumps(doc, indent=1) + "\n", encoding="utf-8")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
