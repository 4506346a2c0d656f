#!/usr/bin/env python
"""Make the tiny multimodal Gemma 4 bundle (examples/bundles/gemma4-mm-tiny): a
Gemma4ForConditionalGeneration = the trained gemma4-tiny text model + small random vision and
audio towers, with a torch oracle for text, image and audio prompts.

Usage:
    PY=.venv-convert/bin/python   # bundle convert's environment: torch 2.13, transformers 5.24,
                                  # llama.cpp's converter (scripts/install-convert.sh)
    $PY tools/make_gemma4_mm_tiny.py OUT [--text-model DIR] [--llama-cpp-src DIR]

Nothing is trained: the text weights are examples/bundles/gemma4-tiny's (its float32 HF folder,
text/gemma4-tiny-mlx), the towers and the 7 new vocabulary rows are seeded random values.

What it writes (deterministic: fixed seeds, one torch thread, media drawn by formula):
    OUT/text/gemma4-mm-tiny-mlx/                  the float32 Hugging Face folder (weights,
                                                  config, tokenizer with the media tokens,
                                                  processor_config.json, chat template)
    OUT/text/gemma4-mm-tiny-f32.gguf              the text model (llama.cpp's convert_hf_to_gguf)
    OUT/text/mmproj/gemma4-mm-tiny-mmproj-f32.gguf  the projector (gemma4v + gemma4a), the same
                                                  converter with --mmproj; manifest role "mmproj"
    OUT/media/                                    two 70-token images, two 16 kHz clips
    OUT/parity.json                               the torch oracle (see gemma4_mm_oracle.py)
    OUT/manifest.json
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))

import gemma4_family as g4
import gemma4_mm_family as mm
import gemma4_mm_oracle as oracle

NAME = "gemma4-mm-tiny"
N_ORACLE_TOKENS = 24
#: every artifact is float32; the runtimes' projected features agree with torch to cosine
#: ~0.9999, which moved llama.cpp's first-step logits by up to 0.1 on media prompts
MIN_ORACLE_GAP = 0.1
REPO = Path(__file__).resolve().parent.parent
MEDIA_DIR = "media"
DEFAULT_TEXT_MODEL = REPO / "examples" / "bundles" / "gemma4-tiny" / "text" / "gemma4-tiny-mlx"


def _img(path: str) -> dict[str, str]:
    return {"type": "image", "path": f"{MEDIA_DIR}/{path}"}


def _aud(path: str) -> dict[str, str]:
    return {"type": "audio", "path": f"{MEDIA_DIR}/{path}"}


def _text(text: str) -> dict[str, str]:
    return {"type": "text", "text": text}


#: (name, messages): media parts name committed files under OUT/media/; the questions are the
#: ones (of a dozen tried) whose 24 greedy tokens keep a top-1/top-2 gap >= MIN_ORACLE_GAP
PROMPTS: list[tuple[str, list[dict[str, Any]]]] = [
    ("text_hello", [{"role": "user", "content": "Hello!"}]),
    ("text_colors", [{"role": "system", "content": "You are a helpful assistant."},
                     {"role": "user", "content": "Name three colors."}]),
    ("image_landscape", [{"role": "user", "content": [_img("image-landscape.png"),
                                                       _text("Describe this image.")]}]),
    ("image_portrait", [{"role": "user", "content": [_img("image-portrait.png"),
                                                      _text("Look at this.")]}]),
    ("audio_chirp", [{"role": "user", "content": [_aud("audio-chirp.wav"),
                                                   _text("Can you help me?")]}]),
    ("audio_tones", [{"role": "user", "content": [_aud("audio-tones.wav"),
                                                   _text("Is this a song?")]}]),
    ("image_audio", [{"role": "user", "content": [_img("image-portrait.png"),
                                                   _aud("audio-chirp.wav"),
                                                   _text("What did they say?")]}]),
    ("image_two_turns", [{"role": "user", "content": [_img("image-landscape.png"),
                                                       _text("Describe this image.")]},
                         {"role": "assistant", "content": "It is a picture."},
                         {"role": "user", "content": "What colors are in it?"}]),
]


def log(msg: str) -> None:
    print(f"[gemma4-mm-tiny] {msg}", flush=True)


def convert_ggufs(hf_dir: Path, out: Path, work: Path) -> None:
    """The text GGUF and the mmproj GGUF by llama.cpp's own converter (f32)."""
    from eliza_backends.convert.llamacpp_convert import convert_hf_to_gguf
    from eliza_backends.convert.toolchain import llama_cpp_converter

    script = llama_cpp_converter()
    if script is None:
        raise SystemExit("no llama.cpp convert_hf_to_gguf.py: run scripts/install-convert.sh "
                         "or pass --llama-cpp-src")
    # the converter names the model (general.name) after the folder
    staged = work / NAME
    if staged.exists():
        shutil.rmtree(staged)
    shutil.copytree(hf_dir, staged)
    text = out / "text"
    (text / "mmproj").mkdir(parents=True, exist_ok=True)
    logf = work / "convert.log"
    convert_hf_to_gguf(script, staged, text / f"{NAME}-f32.gguf", logf)
    convert_hf_to_gguf(script, staged, text / "mmproj" / f"{NAME}-mmproj-f32.gguf", logf,
                       extra_args=("--mmproj",))


def make_parity(model: Any, hf_dir: Path, root: Path) -> dict[str, Any]:
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(str(hf_dir))
    encoder = oracle.MediaEncoder(model, root)
    media = {f"{MEDIA_DIR}/{name}": encoder.describe(f"{MEDIA_DIR}/{name}")
             for name in mm.MEDIA_FILES}
    prompts = []
    for name, messages in PROMPTS:
        entry = oracle.oracle_prompt(model, tok, encoder, name, messages, N_ORACLE_TOKENS)
        prompts.append(entry)
        log(f"oracle {name}: {len(entry['prompt_ids'])} prompt ids, gap "
            f"{entry['min_logit_gap']:.3f} -> {entry['text_until_stop']!r}")
    small = [(p["name"], p["min_logit_gap"]) for p in prompts
             if p["min_logit_gap"] < MIN_ORACLE_GAP]
    if small:
        raise SystemExit(f"oracle prompts with a logit gap below {MIN_ORACLE_GAP}: {small}")
    return {
        "schema_version": 1, "generator": "tools/make_gemma4_mm_tiny.py",
        "reference": "float32 torch transformers 5.24 Gemma4ForConditionalGeneration "
                     f"(text/{NAME}-mlx), processor outputs of Gemma4ImageProcessorPil "
                     f"(max_soft_tokens {mm.MAX_SOFT_TOKENS}) and Gemma4AudioFeatureExtractor",
        "decoding": "greedy argmax, full recompute each step, no early stop",
        "n_tokens": N_ORACLE_TOKENS, "min_gap_required": MIN_ORACLE_GAP,
        "mask": {"reference": oracle.REFERENCE_RULE, "rules": oracle.MASK_RULES,
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
    ap.add_argument("--llama-cpp-src", type=Path, default=None,
                    help="a llama.cpp tree (its convert_hf_to_gguf.py); default: the one "
                         "scripts/install-convert.sh recorded for bundle convert")
    ap.add_argument("--work", type=Path, default=None,
                    help="scratch folder (default: a temporary one)")
    args = ap.parse_args(argv)
    if args.llama_cpp_src is not None:
        os.environ["ELIZA_LLAMA_CPP_CONVERTER"] = str(args.llama_cpp_src / "convert_hf_to_gguf.py")

    out, work, t0 = start(args.out, args.work, NAME, ("text", MEDIA_DIR))

    model = mm.build_model(args.text_model)
    log(f"towers: {mm.tower_parameters(model)} parameters")
    hf_dir = out / "text" / f"{NAME}-mlx"
    mm.save_folder(model, args.text_model, hf_dir)
    mm.write_media(out / MEDIA_DIR)
    log("GGUF and mmproj by llama.cpp's convert_hf_to_gguf.py")
    convert_ggufs(hf_dir, out, work)
    parity = make_parity(model, hf_dir, out)
    text_cfg = json.loads((hf_dir / "config.json").read_text())["text_config"]
    parity["sizes"] = {"text_config": {k: text_cfg[k] for k in ("vocab_size", *g4.TARGET)},
                       "vision_config": mm.VISION, "audio_config": mm.AUDIO_TOWER,
                       "tower_parameters": mm.tower_parameters(model)}
    finish(out, NAME, parity, work, t0)
    return 0


def start(out_arg: Path, work_arg: Path | None, name: str,
          stale: tuple[str, ...]) -> tuple[Path, Path, float]:
    """One torch thread, deterministic algorithms; (the output folder with its ``stale``
    subfolders removed, an empty scratch folder, the start time)."""
    import torch

    torch.set_num_threads(1)
    torch.use_deterministic_algorithms(True)
    t0 = time.time()
    out = out_arg.resolve()
    work = (work_arg or Path(tempfile.mkdtemp(prefix=f"{name}-"))).resolve()
    if work.exists():
        shutil.rmtree(work)
    work.mkdir(parents=True)
    for sub in stale:
        if (out / sub).exists():
            shutil.rmtree(out / sub)
    return out, work, t0


def finish(out: Path, name: str, parity: dict[str, Any], work: Path, t0: float) -> None:
    """Write parity.json and the manifest, remove the scratch folder."""
    (out / "parity.json").write_text(json.dumps(parity, indent=1, ensure_ascii=False) + "\n",
                                     encoding="utf-8")
    from eliza_backends.manifest import write_manifest

    write_manifest(out, name=name)
    shutil.rmtree(work)
    print(f"[{name}] done in {time.time() - t0:.0f}s", flush=True)


if __name__ == "__main__":
    sys.exit(main())
