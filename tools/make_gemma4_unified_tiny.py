#!/usr/bin/env python
"""Make the tiny Gemma 4 Unified bundle (examples/bundles/gemma4-unified-tiny): a
Gemma4UnifiedForConditionalGeneration (no vision / audio encoders: raw 48x48 image patches and
raw 640-sample audio frames projected into the text model) around gemma4-tiny's trained text
weights, its MTP assistant, and a torch oracle for text, image and audio prompts.

Usage:
    PY=.venv-convert/bin/python   # bundle convert's environment: torch 2.13, transformers 5.24,
                                  # llama.cpp's converter (scripts/install-convert.sh)
    $PY tools/make_gemma4_unified_tiny.py OUT [--text-model DIR] [--assistant DIR]
                                              [--llama-cpp-src DIR]

The Unified text model has no per-layer input embeddings: gemma4-tiny's other text tensors are
copied, then the text model is trained TRAIN_STEPS more steps on gemma4-tiny's corpus (about
90 s on one thread) so its greedy text is gemma4-tiny's again; the projections and the 7
media rows are seeded random values. The assistant is gemma4-tiny's (same shapes; its
embedding table grown by 7 zero rows), relabelled gemma4_unified_assistant.

What it writes (deterministic: fixed seeds, one torch thread, deterministic algorithms, media
drawn by formula; reruns are byte-identical):
    OUT/text/gemma4-unified-tiny-mlx/         the float32 Hugging Face folder (weights, config,
                                              tokenizer with the media tokens, processor
                                              config, chat template); mlx-vlm loads it as is
    OUT/text/gemma4-unified-tiny-f32.gguf     the text model (llama.cpp's convert_hf_to_gguf)
    OUT/text/mmproj/gemma4-unified-tiny-mmproj-f32.gguf   the projector (gemma4uv + gemma4ua)
    OUT/text/draft/mtp/gemma4-unified-tiny-assistant-f32.gguf   the assistant (MTP drafter)
    OUT/text/draft/mtp/gemma4-unified-tiny-assistant-mlx/       the same for mlx-vlm's drafter
    OUT/source/assistant/                     the assistant's Hugging Face folder
    OUT/media/                                two 70-token images, two 16 kHz clips
    OUT/parity.json                           the torch oracle (see gemma4_mm_oracle.py)
    OUT/manifest.json
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import sys
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))

import gemma4_family as g4
import gemma4_mm_family as mm
import gemma4_mm_oracle as oracle
import gemma4_unified_family as uf
from make_gemma4_mm_tiny import MEDIA_DIR, _aud, _img, _text, finish, start

NAME = "gemma4-unified-tiny"
N_ORACLE_TOKENS = 24
#: every artifact is float32; a runtime's projected features differ from torch's by float
#: rounding, which moves first-step logits by far less than this
MIN_ORACLE_GAP = 0.1
REPO = Path(__file__).resolve().parent.parent
TINY = REPO / "examples" / "bundles" / "gemma4-tiny"
DEFAULT_TEXT_MODEL = TINY / "text" / "gemma4-tiny-mlx"
DEFAULT_ASSISTANT = TINY / "source" / "assistant"


#: (name, messages): media parts name committed files under OUT/media/; the questions are the
#: ones (of 4-16 tried per slot) whose 24 greedy tokens keep a top-1/top-2 gap >= MIN_ORACLE_GAP
PROMPTS: list[tuple[str, list[dict[str, Any]]]] = [
    ("text_hello", [{"role": "user", "content": "Hello!"}]),
    ("text_colors", [{"role": "system", "content": "You are a helpful assistant."},
                     {"role": "user", "content": "Name three colors."}]),
    ("image_landscape", [{"role": "user", "content": [_img("image-landscape.png"),
                                                       _text("Can you help me?")]}]),
    ("image_portrait", [{"role": "user", "content": [_img("image-portrait.png"),
                                                      _text("Describe this image.")]}]),
    ("audio_chirp", [{"role": "user", "content": [_aud("audio-chirp.wav"),
                                                   _text("Is this a song?")]}]),
    ("audio_tones", [{"role": "user", "content": [_aud("audio-tones.wav"),
                                                   _text("Name three colors.")]}]),
    ("image_audio", [{"role": "user", "content": [_img("image-portrait.png"),
                                                   _aud("audio-chirp.wav"),
                                                   _text("Can you help me?")]}]),
    ("image_two_turns", [{"role": "user", "content": [_img("image-landscape.png"),
                                                       _text("Can you help me?")]},
                         {"role": "assistant", "content": "Yes."},
                         {"role": "user", "content": "Is this a song?"}]),
]


def log(msg: str) -> None:
    print(f"[{NAME}] {msg}", flush=True)


def convert_ggufs(hf_dir: Path, assistant: Path, out: Path, work: Path) -> None:
    """The text, projector and assistant GGUFs by llama.cpp's own converter (f32)."""
    from eliza_backends.convert.llamacpp_convert import convert_hf_to_gguf
    from eliza_backends.convert.toolchain import llama_cpp_converter

    script = llama_cpp_converter()
    if script is None:
        raise SystemExit("no llama.cpp convert_hf_to_gguf.py: run scripts/install-convert.sh "
                         "or pass --llama-cpp-src")
    text = out / "text"
    for sub in ("mmproj", "draft/mtp"):
        (text / sub).mkdir(parents=True, exist_ok=True)
    logf = work / "convert.log"
    # the converter names the model (general.name) after the folder
    staged = work / NAME
    shutil.copytree(hf_dir, staged)
    convert_hf_to_gguf(script, staged, text / f"{NAME}-f32.gguf", logf)
    convert_hf_to_gguf(script, staged, text / "mmproj" / f"{NAME}-mmproj-f32.gguf", logf,
                       extra_args=("--mmproj",))
    staged_a = work / f"{NAME}-assistant"
    shutil.copytree(assistant, staged_a)
    convert_hf_to_gguf(script, staged_a, text / "draft" / "mtp" / f"{NAME}-assistant-f32.gguf",
                       logf)


def make_parity(model: Any, hf_dir: Path, root: Path, allow_small: bool) -> dict[str, Any]:
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(str(hf_dir))
    encoder = uf.UnifiedMediaEncoder(model, root)
    media = {f"{MEDIA_DIR}/{name}": encoder.describe(f"{MEDIA_DIR}/{name}")
             for name in mm.MEDIA_FILES}
    prompts = []
    for name, messages in PROMPTS:
        entry = oracle.oracle_prompt(model, tok, encoder, name, messages, N_ORACLE_TOKENS,
                                     native_rule=uf.NATIVE_RULE, rules=uf.MASK_RULES)
        prompts.append(entry)
        log(f"oracle {name}: {len(entry['prompt_ids'])} prompt ids, gap "
            f"{entry['min_logit_gap']:.3f} -> {entry['text_until_stop']!r}")
    small = [(p["name"], p["min_logit_gap"]) for p in prompts
             if p["min_logit_gap"] < MIN_ORACLE_GAP]
    if small and not allow_small:
        raise SystemExit(f"oracle prompts with a logit gap below {MIN_ORACLE_GAP}: {small}")
    return {
        "schema_version": 1, "generator": "tools/make_gemma4_unified_tiny.py",
        "reference": "float32 torch transformers 5.24 Gemma4UnifiedForConditionalGeneration "
                     f"(text/{NAME}-mlx), raw 48x48 patches / 640-sample frames as "
                     "Gemma4UnifiedImageProcessor (max_soft_tokens 70) and "
                     "Gemma4UnifiedAudioFeatureExtractor make them, image masks built to "
                     "the reference rule",
        "decoding": "greedy argmax, full recompute each step, no early stop",
        "n_tokens": N_ORACLE_TOKENS, "min_gap_required": MIN_ORACLE_GAP,
        "mask": {"reference": oracle.REFERENCE_RULE, "rules": uf.MASK_RULES,
                 "transformers_forward": uf.NATIVE_RULE,
                 "audio": "causal in every runtime (an audio block is never bidirectional)"},
        "prompt_ids_rule": "the template renders each media part as its placeholder "
                           "('<|image|>' / '<|audio|>'); each is expanded to begin marker + "
                           "soft_tokens x placeholder + end marker, then the text is encoded "
                           "with add_special_tokens=False (the template writes <bos>)",
        "tokenizer": {"vocab_size": mm.VOCAB_SIZE, "bos_id": 2, "eos_id": 1, "end_id": 6,
                      "stop_ids": [1, 6], "media_tokens": mm.TOKEN_IDS,
                      "chat_template": mm.CHAT_TEMPLATE},
        "media": media,
        "media_rule": "images: PNG decoded to RGB uint8; audio: 16-bit WAV as int16 / 32768 "
                      "float32 at 16 kHz; embedding = the projected features (embed_vision / "
                      "embed_audio output) the text model reads, [soft_tokens, hidden 128]",
        "prompts": prompts,
    }


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("out", type=Path)
    ap.add_argument("--text-model", type=Path, default=DEFAULT_TEXT_MODEL,
                    help="the trained gemma4-tiny float32 HF folder")
    ap.add_argument("--assistant", type=Path, default=DEFAULT_ASSISTANT,
                    help="gemma4-tiny's trained assistant HF folder")
    ap.add_argument("--llama-cpp-src", type=Path, default=None,
                    help="a llama.cpp tree (its convert_hf_to_gguf.py); default: the one "
                         "scripts/install-convert.sh recorded for bundle convert")
    ap.add_argument("--work", type=Path, default=None,
                    help="scratch folder (default: a temporary one)")
    ap.add_argument("--allow-small-gaps", action="store_true",
                    help="write the oracle even when a prompt's logit gap is small")
    args = ap.parse_args(argv)
    if args.llama_cpp_src is not None:
        os.environ["ELIZA_LLAMA_CPP_CONVERTER"] = str(args.llama_cpp_src / "convert_hf_to_gguf.py")

    out, work, t0 = start(args.out, args.work, NAME, ("text", "source", MEDIA_DIR))

    model, weights = uf.build_model(args.text_model)
    log(f"copied {len(weights['copied'])} text tensors, dropped {len(weights['dropped'])} "
        f"(per-layer inputs); projections: {uf.projection_parameters(model)} parameters")
    training = uf.train_text(model, args.text_model)
    hf_dir = out / "text" / f"{NAME}-mlx"
    uf.save_folder(model, args.text_model, hf_dir)
    assistant = out / "source" / "assistant"
    uf.write_assistant(args.assistant, hf_dir, assistant)
    from eliza_backends.convert.families.gemma4_unified import write_mlx_unified_assistant

    write_mlx_unified_assistant(assistant, hf_dir, out / "text" / "draft" / "mtp"
                                / f"{NAME}-assistant-mlx")
    mm.write_media(out / MEDIA_DIR)
    log("GGUFs (text, mmproj, assistant) by llama.cpp's convert_hf_to_gguf.py")
    convert_ggufs(hf_dir, assistant, out, work)
    parity = make_parity(model, hf_dir, out, args.allow_small_gaps)
    text_cfg = json.loads((hf_dir / "config.json").read_text())["text_config"]
    parity["sizes"] = {"text_config": {k: text_cfg[k] for k in ("vocab_size", *g4.TARGET)
                                       if k in text_cfg},
                       "vision_config": uf.VISION, "audio_config": uf.AUDIO,
                       "projection_parameters": uf.projection_parameters(model)}
    parity["training"] = {**training, "dropped_tensors": weights["dropped"]}
    finish(out, NAME, parity, work, t0)
    return 0


if __name__ == "__main__":
    sys.exit(main())
