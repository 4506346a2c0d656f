#!/usr/bin/env python
"""Greedy MTP drafting with the tiny Gemma 4 pair straight on llama-cpp-python 0.3.36's
low-level API (no eliza_backends code): the acceptance llama.cpp itself gives for the bundle's
assistant, and a check that the speculative output equals plain greedy.

Usage: .venv/bin/python tools/gemma4_mtp_acceptance.py BUNDLE [--k 4]

The drive follows llama.cpp's `common_speculative_impl_draft_mtp` with shared KV (Gemma 4): the
target context is made with `load_mtp` and emits its post-norm hidden rows
(`llama_set_embeddings_nextn`); the assistant is an MTP context over it (`ctx_type = MTP`,
`ctx_other = target`); a round drafts up to k tokens at one position p: first from the target's
sampled token and its hidden row at p-1, then from each drafted token and the assistant's own
output row; the target verifies the drafts in one batch and its KV is trimmed after the first
mismatch.
"""

from __future__ import annotations

import argparse
import ctypes
import json
import sys
from pathlib import Path
from typing import Any


def main(argv: list[str] | None = None) -> int:
    import llama_cpp as L
    import llama_cpp.llama_cpp_ext as X
    import numpy as np

    ap = argparse.ArgumentParser()
    ap.add_argument("bundle", type=Path)
    ap.add_argument("--k", type=int, default=4)
    args = ap.parse_args(argv)
    oracle = json.loads((args.bundle / "oracle.json").read_text())
    target_path = args.bundle / "text" / "gemma4-tiny-f32.gguf"
    asst_path = args.bundle / "text" / "draft" / "mtp" / "gemma4-tiny-assistant-f32.gguf"

    L.llama_backend_init()
    mp = L.llama_model_default_params()
    mp.load_mtp = True
    tm = L.llama_model_load_from_file(str(target_path).encode(), mp)
    am = L.llama_model_load_from_file(str(asst_path).encode(), L.llama_model_default_params())
    cp = L.llama_context_default_params()
    cp.n_ctx = cp.n_batch = cp.n_ubatch = 1024
    cp.n_threads = cp.n_threads_batch = 1
    tctx = L.llama_init_from_model(tm, cp)
    acp = L.llama_context_default_params()
    acp.n_ctx = acp.n_batch = acp.n_ubatch = 1024
    acp.n_threads = acp.n_threads_batch = 1
    acp.ctx_type = L.LLAMA_CONTEXT_TYPE_MTP
    acp.ctx_other = tctx
    acp.n_outputs_max = 1
    actx = L.llama_init_from_model(am, acp)
    if not tctx or not actx:
        raise SystemExit("could not create the target / MTP contexts")
    X.llama_set_embeddings_nextn(tctx, True, False)
    X.llama_set_embeddings_nextn(actx, True, False)
    n_vocab = L.llama_vocab_n_tokens(L.llama_model_get_vocab(tm))
    n_embd = L.llama_model_n_embd(tm)
    mem = L.llama_get_memory(tctx)

    tok_batch = L.llama_batch_init(1024, 0, 1)
    emb_batch = L.llama_batch_init(1, n_embd, 1)
    emb_tokens = (L.llama_token * 1)()
    emb_batch.token = ctypes.cast(emb_tokens, ctypes.POINTER(L.llama_token))

    def decode_target(ids: list[int], pos0: int) -> None:
        tok_batch.n_tokens = len(ids)
        for i, t in enumerate(ids):
            tok_batch.token[i] = t
            tok_batch.pos[i] = pos0 + i
            tok_batch.n_seq_id[i] = 1
            tok_batch.seq_id[i][0] = 0
            tok_batch.logits[i] = 1
        if L.llama_decode(tctx, tok_batch) != 0:
            raise SystemExit("target decode failed")

    def row(ptr: Any) -> Any:
        return np.ctypeslib.as_array(ptr, shape=(n_embd,)).copy()

    def argmax_logits(ctx: Any, i: int) -> int:
        return int(np.argmax(np.ctypeslib.as_array(L.llama_get_logits_ith(ctx, i),
                                                   shape=(n_vocab,))))

    def draft_step(token: int, pos: int, h: Any) -> tuple[int, Any]:
        emb_batch.n_tokens = 1
        emb_tokens[0] = token
        ctypes.memmove(emb_batch.embd, h.ctypes.data, n_embd * 4)
        emb_batch.pos[0] = pos
        emb_batch.n_seq_id[0] = 1
        emb_batch.seq_id[0][0] = 0
        emb_batch.logits[0] = 1
        if L.llama_decode(actx, emb_batch) != 0:
            raise SystemExit("assistant decode failed")
        return argmax_logits(actx, 0), row(X.llama_get_embeddings_nextn_ith(actx, 0))

    total_d = total_a = 0
    same = 0
    rows = {}
    for case in oracle["prompts"]:
        ids = case["prompt_ids"]
        n = len(case["continuation_ids"])
        L.llama_memory_clear(mem, True)
        decode_target(ids, 0)
        t = argmax_logits(tctx, len(ids) - 1)
        h = row(X.llama_get_embeddings_nextn_ith(tctx, len(ids) - 1))
        out = [t]
        pos = len(ids)  # position of t (not yet in the target's KV)
        drafted = accepted = 0
        while len(out) < n:
            drafts: list[int] = []
            tok, hid = t, h
            for _ in range(min(args.k, n - len(out))):
                tok, hid = draft_step(tok, pos, hid)
                drafts.append(tok)
            drafted += len(drafts)
            decode_target([t, *drafts], pos)
            verified = [argmax_logits(tctx, i) for i in range(len(drafts) + 1)]
            m = 0
            while m < len(drafts) and drafts[m] == verified[m]:
                m += 1
            accepted += m
            new = [*drafts[:m], verified[m]]
            h = row(X.llama_get_embeddings_nextn_ith(tctx, m))
            L.llama_memory_seq_rm(mem, 0, pos + m + 1, -1)
            out += new
            pos += m + 1
            t = new[-1]
        out = out[:n]
        same += out == case["continuation_ids"]
        rows[case["name"]] = {"drafted": drafted, "accepted": accepted,
                              "equals_oracle": out == case["continuation_ids"]}
        total_d += drafted
        total_a += accepted
    result = {"k": args.k, "drafted": total_d, "accepted": total_a,
              "acceptance": round(total_a / max(1, total_d), 4),
              "prompts_equal_to_oracle": f"{same}/{len(oracle['prompts'])}", "per_prompt": rows}
    print(json.dumps(result, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
