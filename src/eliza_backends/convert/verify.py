"""``--verify``: every artifact of a converted bundle through ``open_stream`` against a
transformers float32 reference on the same weights, written as ``parity.json``.

For each prompt (8 short ones; for sliding-window models also a 600- and a 900-token one, past
the window) the reference decodes 32 greedy tokens and records the top-1/top-2 logit gap at
every step. Each artifact then decodes greedily through the seam (``ignore_eos``, so 32 tokens
where the backend honours it) and is scored by:

* greedy agreement: positions equal to the reference before the first divergence, and the
  total over prompts (256/256 = identical);
* teacher-forced top-1 agreement: from the first divergence on, the artifact is fed the
  reference's tokens and asked for one token at each position (prefix reuse keeps this cheap);
* the first divergence (prompt, position) and the reference's gap there (a small gap means the
  two models were nearly tied; a large one means a real difference).

Each prompt is prefilled reusing the prefix it shares with the session's sequence
(:meth:`~eliza_backends.Stream.prefill_reusing`): the 900-token prompt continues the 600-token
one's cache, as a chat's next turn would, so only 300 of its tokens are prefilled.

Decode speed (tokens/s, the seam's metrics) is recorded per artifact too.
"""

from __future__ import annotations

import importlib.resources
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from ..manifest import load_manifest
from .facts import ModelFacts

N_TOKENS = 32
SHORT_PROMPTS = (
    "Once upon a time, in a small village by the sea, there lived",
    "The history of the Roman Empire begins",
    'def fibonacci(n):\n    """Return the n-th Fibonacci number."""\n',
    "The three primary colors are",
    "Water boils at 100 degrees Celsius because",
    "In 1969, the first humans landed on the Moon. The mission",
    "Photosynthesis is the process by which",
    "The quick brown fox jumps over the lazy dog. Then the fox",
)
LONG_PROMPT_TOKENS = (600, 900)


def long_text() -> str:
    """A public-domain passage (the Declaration of Independence) for long prompts."""
    return (importlib.resources.files(__package__) / "long_prompt.txt").read_text("utf-8")


def prompt_ids(gguf_path: Path, facts: ModelFacts) -> list[tuple[str, list[int]]]:
    """(name, token ids) of every verification prompt, tokenized by llama.cpp on the source
    GGUF (BOS added when the model adds it)."""
    import llama_cpp

    llm = llama_cpp.Llama(model_path=str(gguf_path), vocab_only=True, verbose=False)
    add_bos = facts.tokenizer.add_bos

    def tok(text: str) -> list[int]:
        return list(llm.tokenize(text.encode(), add_bos=add_bos, special=True))

    out = [(f"short{i}", tok(p)) for i, p in enumerate(SHORT_PROMPTS)]
    if facts.sliding_window is not None:
        body = tok(long_text() * 3)
        for n in LONG_PROMPT_TOKENS:
            out.append((f"long{n}", body[:n]))
    return out


def reference(hf_dir: Path, prompts: list[tuple[str, list[int]]],
              threads: int | None = None) -> dict[str, dict[str, Any]]:
    """transformers float32 greedy continuations: {name: {"ids", "gaps"}}. Prompts go through
    ``generate`` in left-padded batches of at most 8 (short and long prompts apart; masked
    positions add exact zeros), with no early stop at end tokens."""
    import torch
    import transformers

    if threads:
        torch.set_num_threads(threads)
    model = transformers.AutoModelForCausalLM.from_pretrained(str(hf_dir), dtype=torch.float32)
    model.eval()
    pad = model.config.pad_token_id if model.config.pad_token_id is not None else 0
    out: dict[str, dict[str, Any]] = {}
    groups: dict[bool, list[tuple[str, list[int]]]] = {}
    for name, ids in prompts:
        groups.setdefault(len(ids) > 256, []).append((name, ids))
    with torch.no_grad():
        for group in groups.values():
            for i in range(0, len(group), 8):
                batch = group[i:i + 8]
                width = max(len(ids) for _n, ids in batch)
                inp = torch.tensor([[pad] * (width - len(ids)) + ids for _n, ids in batch])
                mask = torch.tensor([[0] * (width - len(ids)) + [1] * len(ids)
                                     for _n, ids in batch])
                res = model.generate(
                    input_ids=inp, attention_mask=mask, max_new_tokens=N_TOKENS,
                    min_new_tokens=N_TOKENS, do_sample=False, eos_token_id=None,
                    pad_token_id=pad, output_logits=True, return_dict_in_generate=True)
                steps = torch.stack(res.logits, dim=1)  # [batch, N_TOKENS, vocab]
                top = torch.topk(steps, 2, dim=-1).values
                gaps = (top[..., 0] - top[..., 1]).tolist()
                for row, (name, _ids) in enumerate(batch):
                    out[name] = {"ids": res.sequences[row, width:].tolist(),
                                 "gaps": [round(g, 4) for g in gaps[row]]}
    return out


def _artifact_runs(root: Path) -> list[tuple[str, str, dict[str, Any]]]:
    """(label, backend, options) for every artifact of the bundle that can run here."""
    runs = []
    for art in load_manifest(root).artifacts:
        if art.role != "model":
            continue
        name = Path(art.path).name
        if art.format == "gguf":
            runs.append((name, "llama.cpp", {"llama.cpp": {"artifact": name}}))
        elif art.format == "mlx":
            runs.append((name, "mlx", {"mlx": {"artifact": name}}))
        elif art.format == "tflite":
            runs.append((name, "litert-lm", {"litert-lm": {"artifact": name,
                                                           "session": "interpreter"}}))
        elif art.format == "litertlm":
            runs.append((name + " (engine)", "litert-lm",
                         {"litert-lm": {"artifact": name, "session": "engine"}}))
    return runs


def score_artifact(root: Path, backend: str, options: dict[str, Any],
                   prompts: list[tuple[str, list[int]]], ref: dict[str, dict[str, Any]],
                   eog: frozenset[int], threads: int | None = None) -> dict[str, Any]:
    """Greedy and teacher-forced agreement of one artifact with the reference."""
    from ..stream import open_stream

    longest = max(len(ids) for _n, ids in prompts) + N_TOKENS + 8
    per_prompt = []
    greedy = tf = compared = 0
    decode_tokens = 0
    decode_seconds = 0.0
    first: dict[str, Any] | None = None
    context = max(1024, -(-longest // 256) * 256)
    # the LiteRT-LM engine ends its turn at a stop token itself (and refuses ignore_eos)
    engine = options.get("litert-lm", {}).get("session") == "engine"
    with open_stream(root, backend=backend, options=options, max_tokens=N_TOKENS,
                     temperature=0.0, ignore_eos=not engine, context_size=context,
                     threads=threads) as stream:
        for name, ids in prompts:
            want = ref[name]["ids"]
            # prompts sharing a prefix (the long ones are cuts of one text) reuse its KV
            stream.prefill_reusing(ids)
            got: list[int] = []
            ended = False
            t0 = time.perf_counter()
            for step in stream:
                got += step.tokens
                ended = step.finish_reason == "eos"
            decode_seconds += time.perf_counter() - t0
            decode_tokens += len(got)
            got = got[:N_TOKENS]
            same = [a == b for a, b in zip(got, want, strict=False)]
            div = same.index(False) if False in same else len(got)
            n_cmp = N_TOKENS
            if engine and ended and div == len(got) < N_TOKENS:
                # the engine stopped at an end token it does not report: compared up to and
                # including that position, where the reference must hold an end token too
                n_cmp = len(got) + 1
                div += want[len(got)] in eog
            compared += n_cmp
            greedy += div
            tf_ok = div
            if div < min(len(got), N_TOKENS):
                seq = list(ids) + want
                for t in range(div, N_TOKENS):
                    target = len(ids) + t
                    keep = stream.reset_keep(target - 1)
                    stream.prefill(seq[keep:target])
                    step = stream.next(1)
                    tf_ok += bool(step.tokens) and step.tokens[0] == want[t]
                if first is None:
                    first = {"prompt": name, "position": div, "reference": want[div],
                             "artifact": got[div], "reference_gap": ref[name]["gaps"][div]}
            tf += tf_ok
            per_prompt.append({"prompt": name, "greedy_agree": div, "compared": n_cmp,
                               "teacher_forced_agree": tf_ok, "ids": got})
    return {"backend": backend, "options": options, "greedy_agree": greedy,
            "teacher_forced_agree": tf, "positions": compared,
            "identical": greedy == compared == N_TOKENS * len(prompts),
            "first_divergence": first,
            "decode_tokens_per_second": round(decode_tokens / decode_seconds, 2)
            if decode_seconds else None,
            "prompts": per_prompt}


def verify_bundle_parity(root: Path, hf_dir: Path, f32_gguf: Path, facts: ModelFacts, *,
                         log: Callable[[str], None] = print,
                         threads: int | None = None) -> dict[str, Any]:
    """Score every artifact of the bundle at ``root`` against transformers on ``hf_dir``
    (prompts tokenized by llama.cpp on ``f32_gguf``); returns the ``parity.json`` document."""
    prompts = prompt_ids(f32_gguf, facts)
    log(f"verify: transformers float32 reference on {len(prompts)} prompts")
    t0 = time.monotonic()
    ref = reference(hf_dir, prompts, threads)
    log(f"verify: reference done in {time.monotonic() - t0:.1f}s")
    eog = frozenset(facts.tokenizer.eog_ids)
    results = {}
    for label, backend, options in _artifact_runs(root):
        t1 = time.monotonic()
        try:
            res = score_artifact(root, backend, options, prompts, ref, eog, threads)
        except Exception as exc:  # one artifact failing must not hide the others' results
            res = {"backend": backend, "options": options, "error": f"{type(exc).__name__}: "
                   f"{exc}"}
        res["seconds"] = round(time.monotonic() - t1, 1)
        results[label] = res
        if "error" in res:
            log(f"verify: {label}: ERROR {res['error']}")
        else:
            log(f"verify: {label}: greedy {res['greedy_agree']}/{res['positions']}, teacher-"
                f"forced {res['teacher_forced_agree']}/{res['positions']}, "
                f"{res['decode_tokens_per_second']} tok/s ({res['seconds']}s)")
    return {"schema_version": 1, "reference": "transformers float32 on the bundle's float32 "
            "checkpoint (greedy, KV cache)", "n_tokens": N_TOKENS,
            "prompts": [{"name": n, "ids": ids, "reference_ids": ref[n]["ids"],
                         "reference_gaps": ref[n]["gaps"]} for n, ids in prompts],
            "artifacts": results}


def format_parity(parity: dict[str, Any]) -> str:
    """A table of ``parity.json`` for ``bundle verify``."""
    rows = [("artifact", "backend", "greedy", "teacher-forced", "first divergence (gap)",
             "tok/s")]
    for label, r in parity.get("artifacts", {}).items():
        if "error" in r:
            rows.append((label, r["backend"], "error", "-", r["error"][:60], "-"))
            continue
        fd = r.get("first_divergence")
        where = "-" if not fd else f"{fd['prompt']}@{fd['position']} ({fd['reference_gap']})"
        rows.append((label, r["backend"], f"{r['greedy_agree']}/{r['positions']}",
                     f"{r['teacher_forced_agree']}/{r['positions']}", where,
                     str(r.get("decode_tokens_per_second") or "-")))
    widths = [max(len(row[i]) for row in rows) for i in range(len(rows[0]))]
    return "\n".join("  ".join(c.ljust(w) for c, w in zip(row, widths, strict=True)).rstrip()
                     for row in rows)


__all__ = ["N_TOKENS", "SHORT_PROMPTS", "format_parity", "prompt_ids", "reference",
           "score_artifact", "verify_bundle_parity"]
