#!/usr/bin/env python
"""Make the tiny Gemma 4 family (examples/bundles/gemma4-tiny): a Gemma4ForCausalLM target and
its gemma4_assistant MTP drafter, trained here on tools/tiny_corpus/.

Usage:
    PY=.venv-convert/bin/python   # bundle convert's environment: torch 2.13, transformers 5.24,
                                  # tokenizers, llama.cpp's converter, litert-torch beside it
    $PY tools/make_gemma4_tiny.py OUT [--steps N] [--assistant-steps N] [--work DIR]
        [--no-bundle] [--reuse-work] [--llama-cpp-src DIR] [--litert-python PY]

The artifacts are made by `eliza-backends bundle convert` (eliza_backends.convert.convert) of
the trained folders, the assistant as its --draft: GGUF by the llama.cpp tree vendored in the
installed llama-cpp-python's sdist (scripts/install-convert.sh unpacks its convert_hf_to_gguf.py;
--llama-cpp-src DIR names another tree), LiteRT by litert-torch export_hf.

What it writes (deterministic: fixed seeds, one torch thread):
    WORK/target/, WORK/assistant/         float32 Hugging Face folders (+ tokenizer files)
    WORK/converted/                       the bundle convert output
    OUT/text/gemma4-tiny-f32.gguf         the target (llama.cpp's converter)
    OUT/text/gemma4-tiny-mlx/             the target's float32 HF folder, as mlx-lm loads it
    OUT/text/gemma4-tiny.tflite           the target by litert-torch export_hf (float32)
    OUT/text/gemma4-tiny.litertlm         the same model packed for LiteRT-LM
    OUT/text/draft/mtp/gemma4-tiny-assistant-f32.gguf   the MTP assistant (llama.cpp's converter)
    OUT/source/assistant/                 the assistant's float32 HF folder
    OUT/oracle.json                       float32 torch greedy continuations + gaps
    OUT/training.json                     losses, times, measured draft acceptance
    OUT/manifest.json
"""

from __future__ import annotations

import argparse
import json
import os
import random
import shutil
import sys
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))

import gemma4_family as g4

N_ORACLE_TOKENS = 32
# Every artifact of this bundle is float32 (runtimes agree with torch to ~1e-5 in the logits),
# so the margin is lower than the tiny bundle's 0.1 (which guards float16 artifacts); the two
# unseen prompts' continuations are the least certain (gaps 0.03-0.06).
MIN_ORACLE_GAP = 0.02

ORACLE_PROMPTS: list[tuple[str, str, Any]] = [
    ("gettysburg", "train", "Four score and seven years ago"),
    ("declaration", "train", "We hold these truths to be self-evident,"),
    ("preamble", "train", "We the People of the United States,"),
    ("lighthouse", "train", "Ships that passed in the dark"),
    ("baker", "train", "Every morning before the sun came up, the baker"),
    ("garden", "train", "In summer the garden is"),
    ("river", "train", "The river does not hurry"),
    ("unseen_dog", "unseen", "The old dog slept by the fire"),
    ("unseen_once", "unseen", "Once upon a time"),
    ("chat_math", "chat", [{"role": "user", "content": "What is two plus two?"}]),
    ("chat_system", "chat", [{"role": "system", "content": "You are a helpful assistant."},
                             {"role": "user", "content": "Name three colors."}]),
    ("chat_hello", "chat", [{"role": "user", "content": "Hello!"}]),
]
# past the sliding window (32): a long stretch of the Declaration, then its continuation
LONG_PROMPT_SOURCE = "declaration_of_independence.txt"
LONG_PROMPT_TOKENS = (160, 400)


def log(msg: str) -> None:
    g4.log(msg)


def save_hf(model: Any, tok_dir: Path, out: Path, *, target: bool) -> None:
    from transformers import GenerationConfig

    out.mkdir(parents=True, exist_ok=True)
    model.generation_config = GenerationConfig(bos_token_id=2, eos_token_id=[1, 6],
                                               pad_token_id=0, do_sample=False)
    if not target:
        model.generation_config.num_assistant_tokens = 4
        model.generation_config.num_assistant_tokens_schedule = "constant"
    model.save_pretrained(str(out), safe_serialization=True)
    for name in g4.TOKENIZER_FILES:
        shutil.copy2(tok_dir / name, out / name)
    cfg = json.loads((out / "config.json").read_text())
    text = cfg.get("text_config", cfg)
    # mlx-lm reads global_head_dim at the top level (default 512) and wants
    # use_double_wide_mlp explicit; llama.cpp's converter reads either place
    text["global_head_dim"] = g4.TARGET["global_head_dim"] if target else \
        g4.ASSISTANT["global_head_dim"]
    text["use_double_wide_mlp"] = False
    (out / "config.json").write_text(json.dumps(cfg, indent=2, sort_keys=True) + "\n")


def prompt_cases(tok: Any) -> list[dict[str, Any]]:
    cases = []
    for name, kind, spec in ORACLE_PROMPTS:
        entry: dict[str, Any] = {"name": name, "kind": kind}
        if kind == "chat":
            rendered = g4.render_chat(spec, True)
            entry["messages"] = spec
            entry["rendered"] = rendered
            text = rendered[len(g4.BOS):]
        else:
            text = spec
        entry["text"] = text
        entry["prompt_ids"] = [2, *tok.encode(text, add_special_tokens=False).ids]
        cases.append(entry)
    body = (g4.tiny.CORPUS_DIR / LONG_PROMPT_SOURCE).read_text(encoding="utf-8")
    body_ids = tok.encode(body, add_special_tokens=False).ids
    for n in LONG_PROMPT_TOKENS:
        ids = [2, *body_ids[: n - 1]]
        text = tok.decode(ids[1:], skip_special_tokens=False)
        assert [2, *tok.encode(text, add_special_tokens=False).ids] == ids, n
        cases.append({"name": f"long{n}", "kind": "long", "text": text, "prompt_ids": ids})
    return cases


def make_oracle(model: Any, tok: Any, hf_tok: Any, allow_small: bool) -> dict[str, Any]:
    stop_ids = [tok.token_to_id(t) for t in g4.STOP_TOKENS]
    prompts = []
    for entry in prompt_cases(tok):
        assert hf_tok(entry["text"]).input_ids == entry["prompt_ids"], entry["name"]
        cont, gaps = g4.greedy(model, entry["prompt_ids"], N_ORACLE_TOKENS)
        first_stop = next((i for i, t in enumerate(cont) if t in stop_ids), None)
        until = cont if first_stop is None else cont[:first_stop]
        entry.update(continuation_ids=cont,
                     continuation_text=hf_tok.decode(cont, skip_special_tokens=False),
                     first_stop_index=first_stop,
                     text_until_stop=hf_tok.decode(until, skip_special_tokens=False),
                     min_logit_gap=round(min(gaps), 4), min_logit_gap_step=gaps.index(min(gaps)),
                     logit_gaps=[round(x, 4) for x in gaps])
        prompts.append(entry)
        log(f"oracle {entry['name']}: gap {min(gaps):.3f} -> {entry['text_until_stop']!r}")
    small = [(p["name"], p["min_logit_gap"]) for p in prompts
             if p["min_logit_gap"] < MIN_ORACLE_GAP]
    if small and not allow_small:
        raise SystemExit(f"oracle prompts with a logit gap below {MIN_ORACLE_GAP}: {small}; "
                         "train longer or pass --allow-small-gaps")
    return {
        "schema_version": 1, "generator": "tools/make_gemma4_tiny.py",
        "min_gap_required": MIN_ORACLE_GAP,
        "reference": "float32 torch transformers Gemma4ForCausalLM (the training weights)",
        "n_tokens": N_ORACLE_TOKENS, "sliding_window": g4.SLIDING_WINDOW,
        "decoding": "greedy argmax, full recompute each step, no early stop",
        "prompt_ids_rule": "prompt_ids == [bos_id] + encode(text, add_special_tokens=False); "
                           "chat prompts: text is the rendered template without its leading "
                           "bos_token; long prompts are cuts of one corpus text",
        "tokenizer": {
            "vocab_size": g4.VOCAB_SIZE, "bos_token": g4.BOS, "bos_id": 2,
            "eos_token": g4.EOS, "eos_id": 1, "end_token": g4.TURN_CLOSE,
            "end_id": tok.token_to_id(g4.TURN_CLOSE), "stop_ids": stop_ids,
            "special_tokens": {t: tok.token_to_id(t) for t in g4.CONTROL_TOKENS},
            "add_bos": True, "chat_template": g4.CHAT_TEMPLATE,
        },
        "prompts": prompts,
    }


def measure_acceptance(target: Any, assistant: Any, oracle: dict[str, Any],
                       k: int) -> dict[str, Any]:
    rows = {}
    drafted = accepted = 0
    for p in oracle["prompts"]:
        r = g4.speculative_acceptance(target, assistant, p["prompt_ids"], N_ORACLE_TOKENS, k)
        rows[p["name"]] = r
        drafted += r["drafted"]
        accepted += r["accepted"]
    return {"draft_length": k, "drafted": drafted, "accepted": accepted,
            "acceptance": round(accepted / max(1, drafted), 4), "per_prompt": rows}


def write_artifacts(out: Path, work: Path, litert: bool) -> None:
    """OUT/text/ and OUT/source/: ``bundle convert`` of WORK/target with WORK/assistant as its
    draft (GGUFs by llama.cpp's own converter, LiteRT by litert-torch: see
    eliza_backends.convert), placed under this bundle's names; the float32 HF folder as the MLX
    folder; the assistant's HF folder as OUT/source/assistant (the target's is the MLX one)."""
    from eliza_backends.convert import convert, parse_plan

    made = work / "converted"
    if made.exists():
        shutil.rmtree(made)
    plan = parse_plan("gguf,litert" if litert else "gguf", prefill_lengths=(32, 128),
                      cache_length=1024, name="gemma4-tiny", threads=1)
    convert(work / "target", made, plan, draft=work / "assistant",
            work_dir=work / "convert-stages")
    text = out / "text"
    for stale in (text, out / "source"):
        if stale.exists():
            shutil.rmtree(stale)
    (text / "draft" / "mtp").mkdir(parents=True)
    places = {"gemma4-tiny-f32.gguf": "gemma4-tiny-f32.gguf",
              "draft/mtp/gemma4-tiny-assistant-f32.gguf":
                  "draft/mtp/gemma4-tiny-assistant-f32.gguf"}
    if litert:
        places.update({"gemma4-tiny-fp32.tflite": "gemma4-tiny.tflite",
                       "gemma4-tiny-fp32.litertlm": "gemma4-tiny.litertlm"})
    for src, dest in places.items():
        shutil.copy2(made / "text" / src, text / dest)
    shutil.copytree(work / "target", text / "gemma4-tiny-mlx")
    shutil.copytree(work / "assistant", out / "source" / "assistant")


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("out", type=Path)
    ap.add_argument("--llama-cpp-src", type=Path, default=None,
                    help="a llama.cpp tree (its convert_hf_to_gguf.py); default: the one "
                         "scripts/install-convert.sh recorded for bundle convert")
    ap.add_argument("--steps", type=int, default=1200)
    ap.add_argument("--assistant-steps", type=int, default=400)
    ap.add_argument("--work", type=Path, default=None, help="keep HF folders and GGUFs here")
    ap.add_argument("--allow-small-gaps", action="store_true")
    ap.add_argument("--no-bundle", action="store_true", help="stop after WORK (no OUT files)")
    ap.add_argument("--reuse-work", action="store_true",
                    help="load the trained pair from WORK/target and WORK/assistant instead of "
                         "training (re-export only)")
    ap.add_argument("--litert-python", default=None,
                    help="a python with litert-torch 0.10 (default: bundle convert's own; "
                         "empty: no LiteRT export)")
    args = ap.parse_args(argv)
    if args.llama_cpp_src is not None:
        os.environ["ELIZA_LLAMA_CPP_CONVERTER"] = str(args.llama_cpp_src / "convert_hf_to_gguf.py")
    if args.litert_python:
        os.environ["ELIZA_LITERT_TORCH_PYTHON"] = args.litert_python

    import torch

    torch.set_num_threads(1)
    torch.use_deterministic_algorithms(True)
    random.seed(g4.SEED)
    t_start = time.time()
    work = (args.work or args.out / ".work").resolve()
    if work.exists() and not args.reuse_work:
        shutil.rmtree(work)
    work.mkdir(parents=True, exist_ok=True)

    prose, dialogues = g4.corpus()
    tok = g4.build_tokenizer(prose, dialogues)
    hf_tok = g4.save_tokenizer(tok, work / "tokenizer", g4.MAX_POSITIONS)
    stream, starts = g4.training_stream(tok, prose, dialogues)
    log(f"corpus: {len(prose)} documents, {len(dialogues)} dialogues, {len(stream)} tokens")

    if args.reuse_work:
        from transformers import Gemma4AssistantForCausalLM, Gemma4ForCausalLM

        target = Gemma4ForCausalLM.from_pretrained(str(work / "target"), dtype=torch.float32)
        assistant = Gemma4AssistantForCausalLM.from_pretrained(str(work / "assistant"),
                                                               dtype=torch.float32)
        target.eval()
        assistant.eval()
        prior = json.loads((work / "training.json").read_text())
        target.train_stats, assistant.train_stats = prior["target"], prior["assistant"]
    else:
        target = g4.train_target(stream, starts, args.steps)
        assistant = g4.train_assistant(target, stream, starts, args.assistant_steps)
        save_hf(target, work / "tokenizer", work / "target", target=True)
        save_hf(assistant, work / "tokenizer", work / "assistant", target=False)
        (work / "training.json").write_text(json.dumps(
            {"target": target.train_stats, "assistant": assistant.train_stats}, indent=1))
    if args.no_bundle:
        return 0

    oracle = make_oracle(target, tok, hf_tok, args.allow_small_gaps)
    acc = measure_acceptance(target, assistant, oracle, 4)
    log(f"draft acceptance (k=4, greedy, torch): {acc['accepted']}/{acc['drafted']} = "
        f"{acc['acceptance']}")
    log("bundle convert (GGUF by llama.cpp's convert_hf_to_gguf.py, LiteRT by litert-torch)")
    write_artifacts(args.out.resolve(), work, args.litert_python != "")
    out = args.out.resolve()
    (out / "oracle.json").write_text(json.dumps(oracle, indent=1, ensure_ascii=False) + "\n")
    training = {"target": target.train_stats, "assistant": assistant.train_stats,
                "acceptance_torch": acc, "total_seconds": round(time.time() - t_start, 1),
                "torch_threads": 1}
    (out / "training.json").write_text(json.dumps(training, indent=1) + "\n")
    from eliza_backends.manifest import write_manifest

    write_manifest(out, name="gemma4-tiny")
    log(f"done in {time.time() - t_start:.0f}s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
