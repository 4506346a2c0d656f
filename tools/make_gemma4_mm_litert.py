#!/usr/bin/env python
"""Make the tiny multimodal Gemma 4 for LiteRT-LM (examples/bundles/gemma4-mm-tiny-litert): the
model of tools/make_gemma4_mm_tiny.py at the tower widths litert-torch's multimodal exporter
accepts, exported to one ``.litertlm`` with its image and audio encoders, and a torch oracle.

litert-torch 0.10 hard-codes Gemma 4 E2B's widths: the vision hidden size must be 3 x patch^2
and the audio ``output_proj_dims`` 1536. Here: patch 4 / hidden 48 (so an image of 70 soft
tokens is 120x84 px: 12 px a soft token) and output 1536; the text model is gemma4-tiny's.

Usage:
    PY=.venv-convert/bin/python        # torch 2.13, transformers 5.24 (scripts/install-convert.sh)
    LITERT=.venv-litert-torch/bin/python   # litert-torch 0.10
    $PY tools/make_gemma4_mm_litert.py OUT --litert-python $LITERT

What it writes (deterministic: fixed seeds, one torch thread, PYTHONHASHSEED=0 for the
exporter, the container's uuid/time stamped from the name):
    OUT/text/gemma4-mm-tiny-litert.litertlm   the model + embedders + vision/audio encoders,
                                              adapters and end-of-media models (float32)
    OUT/media/                                two 70-token images (120x84, 84x120), two clips
    OUT/parity.json                           the torch oracle (gemma4_mm_oracle.py), whose
                                              other_mask_rules.causal is what LiteRT-LM follows
    OUT/manifest.json
"""

from __future__ import annotations

import argparse
import json
import shutil
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))

import gemma4_mm_family as mm
import gemma4_mm_oracle as oracle
import litert_audio_frontend
import make_gemma4_mm_tiny as base

NAME = "gemma4-mm-tiny-litert"
REPO = Path(__file__).resolve().parent.parent
#: the widths litert-torch 0.10's Gemma 4 exporter takes (vision hidden = 3 x patch^2)
VISION = dict(hidden_size=48, intermediate_size=96, num_attention_heads=3,
              num_key_value_heads=3, head_dim=16, patch_size=4)
AUDIO_TOWER = dict(output_proj_dims=1536)
#: pixels a soft token covers a side (patch 4 x pooling 3)
PX = 12
#: export_hf flags for the multimodal bundle (prefill 128, cache 512: the oracle's prompts fit)
EXPORT_FLAGS = ("--task=multimodal_lm", "--export_vision_encoder=True",
                "--export_audio_encoder=True", "--bundle_litert_lm=True",
                f"--gemma4_vision_max_soft_tokens={mm.MAX_SOFT_TOKENS}",
                "--vision_encoder_quantization_recipe=none",
                "--audio_encoder_quantization_recipe=none", "--split_cache=False")


#: the smallest top-1/top-2 logit gap allowed on the tokens a LiteRT-LM test compares (the
#: causal-mask greedy tokens up to the first stop): the .litertlm is float32 like the oracle,
#: its encoders agree with torch to 1e-5, so a gap this size is far past their difference
LITERT_MIN_GAP = 0.01


#: parity.json's note on the litert_lm expectations
LITERT_RULE = (
    "LiteRT-LM 0.18.1's prefill attends causally over an image block, and its audio front end "
    "gives a clip one mel frame more than transformers' (tools/litert_audio_frontend.py): a "
    "prompt's litert_lm.ids are the oracle's greedy tokens under the causal mask with "
    "LiteRT-LM's audio features (= the reference's for text prompts), compared up to "
    f"until_stop; gap >= {LITERT_MIN_GAP} there")


def log(msg: str) -> None:
    print(f"[{NAME}] {msg}", flush=True)


def write_media(out: Path) -> None:
    """The committed bundle's media drawn at this model's 70-token sizes (the images by the
    same formulas at a quarter of the size, so neither runtime resizes them; the same clips)."""
    out.mkdir(parents=True, exist_ok=True)
    mm._png(out / "image-landscape.png", 10 * PX, 7 * PX,
            lambda x, y: mm._landscape(4 * x, 4 * y))
    mm._png(out / "image-portrait.png", 7 * PX, 10 * PX,
            lambda x, y: mm._portrait(4 * x, 4 * y))
    mm._wav(out / "audio-chirp.wav", mm._chirp(16000))
    mm._wav(out / "audio-tones.wav", mm._tones(32000))


def export_litertlm(python: str, hf_dir: Path, work: Path, dest: Path) -> None:
    """export_hf of ``hf_dir`` to one multimodal ``.litertlm`` at ``dest``."""
    from eliza_backends.convert.litert_out import export_tflite

    out = work / "export"
    out.mkdir(parents=True)
    export_tflite(python, hf_dir, out, precision="fp32", prefill_lengths=[128],
                  cache_length=512, log_path=work / "export.log", threads=1,
                  extra_flags=EXPORT_FLAGS)
    sys.path.insert(0, str(REPO / "tools"))
    from make_tiny_bundle import _fix_litertlm_system_metadata

    dest.parent.mkdir(parents=True, exist_ok=True)
    dest.write_bytes(_fix_litertlm_system_metadata((out / "model.litertlm").read_bytes(),
                                                   dest.name))


class LiteRTFrontEnd(oracle.MediaEncoder):
    """The oracle's media inputs with LiteRT-LM's own audio front end
    (tools/litert_audio_frontend.py: one mel frame more than transformers' at the end of a
    clip) in place of transformers' feature extractor; images as the oracle's."""

    def audio_inputs(self, files: list[str]) -> dict[str, Any]:
        import torch

        feats = [litert_audio_frontend.log_mel(mm.read_audio(self.root / f)) for f in files]
        frames = max(len(f) for f in feats)
        x = torch.zeros(len(feats), frames, litert_audio_frontend.MEL_BINS)
        mask = torch.zeros(len(feats), frames, dtype=torch.bool)
        for i, f in enumerate(feats):
            x[i, :len(f)] = torch.from_numpy(f)
            mask[i, :len(f)] = True
        with torch.no_grad():
            enc = self.model.model.get_audio_features(x, mask)
        return {"input_features": x, "input_features_mask": mask,
                "counts": [int(m.sum()) for m in enc.attention_mask]}


def litert_expectations(model: Any, root: Path,
                        prompts: list[dict[str, Any]]) -> None:
    """Add ``litert_lm`` to each prompt: the oracle's greedy tokens under LiteRT-LM's rules
    (the causal image mask; LiteRT-LM's audio front end, :class:`LiteRTFrontEnd`; for text
    prompts the reference's own tokens), the index of the first stop token (the engine ends
    its turn there and does not emit it) and the smallest logit gap before it."""
    encoder = LiteRTFrontEnd(model, root)
    stop_ids = {1, 6}
    for p in prompts:
        parts = oracle.media_parts(p["messages"])
        inputs, _ = oracle.model_inputs(encoder, parts)
        ids, gaps, _ = oracle.greedy(model, p["prompt_ids"], inputs, len(p["continuation_ids"]),
                                     "causal")
        if "other_mask_rules" not in p and not any(k == "audio" for k, _ in parts):
            assert ids == p["continuation_ids"], f"{p['name']}: causal mask != reference"
        stop = next((i for i, t in enumerate(ids) if t in stop_ids), len(ids))
        compared = gaps[:stop + 1]  # the stop token itself must win too
        p["litert_lm"] = {"rule": "causal", "audio_front_end": "litert-lm", "ids": ids,
                          "until_stop": stop,
                          "min_logit_gap_until_stop": round(min(compared), 4)}
        log(f"causal {p['name']}: {stop} tokens to the stop, gap {min(compared):.3f}")
        if min(compared) < LITERT_MIN_GAP:
            raise SystemExit(f"{p['name']}: causal-mask logit gap {min(compared):.4f} < "
                             f"{LITERT_MIN_GAP}")


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("out", type=Path)
    ap.add_argument("--text-model", type=Path, default=base.DEFAULT_TEXT_MODEL)
    ap.add_argument("--litert-python", default=str(REPO / ".venv-litert-torch" / "bin" /
                                                   "python"),
                    help="an interpreter with litert-torch 0.10")
    ap.add_argument("--work", type=Path, default=None)
    ap.add_argument("--expectations-only", action="store_true",
                    help="keep OUT's .litertlm, media and oracle: rebuild the torch model and "
                    "write only each prompt's litert_lm expectations (and the manifest)")
    args = ap.parse_args(argv)

    import torch

    torch.set_num_threads(1)
    torch.use_deterministic_algorithms(True)
    t0 = time.time()
    out = args.out.resolve()
    work = (args.work or Path(tempfile.mkdtemp(prefix=f"{NAME}-"))).resolve()
    if work.exists():
        shutil.rmtree(work)
    work.mkdir(parents=True)
    for stale in (out / "text", out / base.MEDIA_DIR):
        if stale.exists() and not args.expectations_only:
            shutil.rmtree(stale)
    mm.VISION.update(VISION)
    mm.AUDIO_TOWER.update(AUDIO_TOWER)
    model = mm.build_model(args.text_model)
    log(f"towers: {mm.tower_parameters(model)} parameters")
    if args.expectations_only:
        parity = json.loads((out / "parity.json").read_text(encoding="utf-8"))
        litert_expectations(model, out, parity["prompts"])
        parity["litert_lm_rule"] = LITERT_RULE
        base.finish(out, NAME, parity, work, t0)
        return 0
    hf_dir = work / "hf"
    mm.save_folder(model, args.text_model, hf_dir)
    config = json.loads((hf_dir / "config.json").read_text())
    config["experts_implementation"] = "eager"  # (the exporter traces the eager path)
    (hf_dir / "config.json").write_text(json.dumps(config, indent=2))
    write_media(out / base.MEDIA_DIR)
    log("export_hf (multimodal_lm) -> .litertlm")
    export_litertlm(args.litert_python, hf_dir, work, out / "text" / f"{NAME}.litertlm")
    # the reference-mask gap rule of the llama.cpp / MLX bundle does not apply here: LiteRT-LM
    # is compared on the causal-mask tokens, whose gaps litert_expectations checks
    base.MIN_ORACLE_GAP = 0.0
    parity: dict[str, Any] = base.make_parity(model, hf_dir, out)
    litert_expectations(model, out, parity["prompts"])
    parity["generator"] = "tools/make_gemma4_mm_litert.py"
    parity["reference"] = parity["reference"].replace(f"(text/{base.NAME}-mlx)",
                                                      "(the folder export_hf read)")
    parity["min_gap_required"] = None
    parity["litert_lm_rule"] = LITERT_RULE
    parity["sizes"] = {"vision_config": mm.VISION, "audio_config": mm.AUDIO_TOWER,
                       "tower_parameters": mm.tower_parameters(model)}
    base.finish(out, NAME, parity, work, t0)
    return 0


if __name__ == "__main__":
    sys.exit(main())
