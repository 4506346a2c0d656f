"""The tiny Gemma 4 Unified's parts: the ``Gemma4UnifiedForConditionalGeneration`` around the
trained gemma4-tiny text weights (every tensor whose name and shape the Unified text model
shares; it has no per-layer input embeddings), the raw-patch image and raw-frame audio
projections (seeded random), the processor files, the image patches and audio frames as the
oracle computes them, and the assistant (gemma4-tiny's, its vocabulary grown by the media
tokens). Used by tools/make_gemma4_unified_tiny.py (tool-time only: torch, transformers 5.24).

The media tokens, the chat template, the test media and the tokenizer files are the multimodal
tiny's (:mod:`gemma4_mm_family`): the same seven tokens at ids 512-518.
"""

from __future__ import annotations

import json
import math
import shutil
from pathlib import Path
from typing import Any

import gemma4_family as g4  # tools/ is on sys.path
import gemma4_mm_family as mm
import gemma4_mm_oracle as oracle

SEED = 4323
#: the raw-patch image projection: 48x48 merged patches (patch 16 x pooling 3) -> 64 -> text
#: hidden; a 128-entry factorized position table covers 128 patches a side
VISION = dict(patch_size=16, pooling_kernel_size=3, mm_embed_dim=64, mm_posemb_size=128)
#: raw 640-sample (40 ms) audio frames, each one soft token
AUDIO = dict(audio_embed_dim=640)
#: images of 70 soft tokens whose sides are multiples of 48 px are kept at their size by
#: transformers / mlx-vlm (max_soft_tokens 70) and by llama.cpp (its budget is 70-1120)
MAX_SOFT_TOKENS = 70
#: the image-token attention rules (keys of gemma4_mm_oracle.attention_masks) measured here:
#: the reference is Gemma 4's own, which transformers' Unified ``generate()`` path
#: (Gemma4UnifiedForConditionalGeneration.create_masks_for_generate) and llama.cpp apply;
#: the Unified model's plain forward (given mm_token_type_ids) applies the past-window rule
MASK_RULES = {
    "sliding-bidirectional": "the reference: transformers Gemma 4 Unified's generate() masks "
                             "(create_masks_for_vision_model) and llama.cpp's gemma4uv "
                             "(non-causal image chunks, bidirectional on sliding layers only): "
                             "an image's soft tokens attend to each other both ways on sliding "
                             "layers, within the window backwards; causal on full layers",
    "all-bidirectional-past-window": "transformers' Gemma4UnifiedModel.forward given "
                                     "mm_token_type_ids (and mlx-vlm 0.7.10's gemma4_unified): "
                                     "the image block ORed in on every layer, after the "
                                     "sliding window (a soft token sees its whole block)",
    "causal": "causal everywhere (LiteRT-LM's prefill rule)",
}
NATIVE_RULE = "all-bidirectional-past-window"
#: the random projections' scale: projected features of about the norm of the scaled text
#: embeddings, so the media change what the model says
PROJECTION_STD = 0.3
#: text_config keys of gemma4-tiny a Gemma4UnifiedTextConfig takes
_TEXT_KEYS = ("vocab_size", "hidden_size", "intermediate_size", "num_hidden_layers",
              "num_attention_heads", "num_key_value_heads", "head_dim", "hidden_activation",
              "max_position_embeddings", "rms_norm_eps", "pad_token_id", "eos_token_id",
              "bos_token_id", "tie_word_embeddings", "rope_parameters", "sliding_window",
              "layer_types", "final_logit_softcapping", "attention_k_eq_v",
              "num_kv_shared_layers", "use_double_wide_mlp", "global_head_dim")


def unified_config(text_dir: Path) -> Any:
    """Gemma4UnifiedConfig: gemma4-tiny's text config (less its per-layer inputs) grown by the
    media tokens, ``use_bidirectional_attention="vision"``, the two projections."""
    from transformers import (
        Gemma4UnifiedAudioConfig,
        Gemma4UnifiedConfig,
        Gemma4UnifiedTextConfig,
        Gemma4UnifiedVisionConfig,
    )

    src = json.loads((text_dir / "config.json").read_text())
    text = {k: src[k] for k in _TEXT_KEYS if k in src}
    text.update(vocab_size=mm.VOCAB_SIZE, use_bidirectional_attention="vision")
    return Gemma4UnifiedConfig(
        text_config=Gemma4UnifiedTextConfig(**text),
        vision_config=Gemma4UnifiedVisionConfig(**VISION, output_proj_dims=VISION["mm_embed_dim"]),
        audio_config=Gemma4UnifiedAudioConfig(**AUDIO),
        boi_token_id=mm.TOKEN_IDS[mm.BOI], eoi_token_id=mm.TOKEN_IDS[mm.EOI],
        image_token_id=mm.TOKEN_IDS[mm.IMAGE], boa_token_id=mm.TOKEN_IDS[mm.BOA],
        eoa_token_index=mm.TOKEN_IDS[mm.EOA], audio_token_id=mm.TOKEN_IDS[mm.AUDIO],
        video_token_id=mm.TOKEN_IDS[mm.VIDEO], tie_word_embeddings=True,
        dtype="float32")


def build_model(text_dir: Path) -> tuple[Any, dict[str, list[str]]]:
    """The float32 model and {"copied": [...], "dropped": [...]}: gemma4-tiny's text tensors
    copied under ``model.language_model`` where the Unified model has them (the embedding
    table grown by 7 rows of small random values), the ones it has no place for (the per-layer
    input path) dropped; the projections random (seeded)."""
    import torch
    from transformers import Gemma4ForCausalLM, Gemma4UnifiedForConditionalGeneration

    text = Gemma4ForCausalLM.from_pretrained(str(text_dir), dtype=torch.float32)
    torch.manual_seed(SEED)
    model = Gemma4UnifiedForConditionalGeneration(unified_config(text_dir)).float().eval()
    gen = torch.Generator().manual_seed(SEED)
    lm = model.model.language_model
    targets = lm.state_dict()
    copied, dropped = [], []
    with torch.no_grad():
        for name, src in sorted(text.model.state_dict().items()):
            if name not in targets:
                dropped.append(name)
                continue
            dst = targets[name]
            n = src.shape[0] if src.dim() else 0
            if src.dim():
                dst[:n].copy_(src)
            else:
                dst.copy_(src)
            if src.dim() and dst.shape[0] > n:  # the embedding table
                dst[n:].copy_(0.02 * torch.randn((dst.shape[0] - n, *dst.shape[1:]),
                                                 generator=gen))
            copied.append(name)
        _fill_projections(model, gen)
    model.tie_weights()
    return model, {"copied": copied, "dropped": dropped}


def _fill_projections(model: Any, gen: Any) -> None:
    """Seeded values for the vision embedder (layer norms 1 + N(0, 0.1) / N(0, 0.1), the dense
    N(0, 1/fan_in), the position table N(0, 0.5)) and both output projections."""
    import torch

    for name, p in sorted(model.model.embed_vision.named_parameters()):
        if name == "pos_embedding":
            p.copy_(0.5 * torch.randn(p.shape, generator=gen))
        elif name.endswith("weight") and p.dim() == 1:
            p.copy_(1 + 0.1 * torch.randn(p.shape, generator=gen))
        elif p.dim() == 1:
            p.copy_(0.1 * torch.randn(p.shape, generator=gen))
        elif "embedding_projection" in name:
            p.copy_(PROJECTION_STD * torch.randn(p.shape, generator=gen))
        else:
            p.copy_(torch.randn(p.shape, generator=gen) / math.sqrt(p.shape[1]))
    w = model.model.embed_audio.embedding_projection.weight
    w.copy_(PROJECTION_STD * torch.randn(w.shape, generator=gen))


def projection_parameters(model: Any) -> dict[str, int]:
    return {name: sum(p.numel() for p in getattr(model.model, name).parameters())
            for name in ("embed_vision", "embed_audio")}


# ---------------------------------------------------------------------------
# Media inputs as transformers' Gemma4Unified processors make them (its image processor
# imports torchvision, absent here: the same arithmetic in numpy, the converter's
# eliza_backends.convert.families.gemma4_media.unified_patches)
# ---------------------------------------------------------------------------
def audio_frames(pcm: Any) -> Any:
    """[n, 640] float32: the clip zero-padded to whole 640-sample frames
    (Gemma4UnifiedAudioFeatureExtractor)."""
    from transformers import Gemma4UnifiedAudioFeatureExtractor

    out = Gemma4UnifiedAudioFeatureExtractor()([pcm], sampling_rate=16000, return_tensors="np")
    return out["input_features"][0]


def write_processor_config(out: Path) -> None:
    """processor_config.json (transformers 5 nests image_processor / feature_extractor):
    float ``image_mean`` / ``image_std`` (llama.cpp's converter refuses integers),
    ``max_soft_tokens`` 70 (mlx-vlm's default would be 280)."""
    image = {"image_processor_type": "Gemma4UnifiedImageProcessor", "do_convert_rgb": True,
             "do_normalize": False, "do_rescale": True, "do_resize": True,
             "rescale_factor": 1 / 255, "image_mean": [0.0, 0.0, 0.0],
             "image_std": [1.0, 1.0, 1.0], "resample": 3, "max_soft_tokens": MAX_SOFT_TOKENS,
             "patch_size": VISION["patch_size"],
             "pooling_kernel_size": VISION["pooling_kernel_size"]}
    audio = {"feature_extractor_type": "Gemma4UnifiedAudioFeatureExtractor",
             "feature_size": AUDIO["audio_embed_dim"], "sampling_rate": 16000,
             "padding_value": 0.0, "padding_side": "right",
             "audio_samples_per_token": AUDIO["audio_embed_dim"],
             "return_attention_mask": True}
    doc = {"processor_class": "Gemma4UnifiedProcessor", "image_seq_length": MAX_SOFT_TOKENS,
           "audio_seq_length": 750, "audio_ms_per_token": 40,
           "image_processor": image, "feature_extractor": audio}
    (out / "processor_config.json").write_text(json.dumps(doc, indent=2, sort_keys=True) + "\n")


def save_folder(model: Any, text_dir: Path, out: Path) -> None:
    """The Hugging Face folder as the multimodal tiny's (:func:`gemma4_mm_family.save_folder`)
    with ``moe_intermediate_size: null`` in text_config (llama.cpp's converter reads it) and
    this model's processor config."""
    mm.save_folder(model, text_dir, out, {"moe_intermediate_size": None},
                   write_processor_config)


# ---------------------------------------------------------------------------
# The assistant: gemma4-tiny's, as a gemma4_unified_assistant with the media rows
# ---------------------------------------------------------------------------
def write_assistant(src: Path, target_dir: Path, out: Path) -> None:
    """``out``: gemma4-tiny's trained assistant (``src``) as a ``gemma4_unified_assistant``
    for this target: the same weights, its tied embedding table grown by the 7 media rows
    (zeros: a draft never proposes a media token), ``vocab_size`` 519, the target's
    tokenizer files. Same shapes otherwise: the assistant reads the target's last hidden
    state (128 wide) and the KV of its last sliding / full layers (head sizes 32 / 64)."""
    import numpy as np
    from safetensors.numpy import load_file, save_file

    if out.exists():
        shutil.rmtree(out)
    out.mkdir(parents=True)
    cfg = json.loads((src / "config.json").read_text())
    cfg.update(architectures=["Gemma4UnifiedAssistantForCausalLM"],
               model_type="gemma4_unified_assistant")
    cfg["text_config"].update(model_type="gemma4_unified_text", vocab_size=mm.VOCAB_SIZE)
    for key in ("hidden_size_per_layer_input", "vocab_size_per_layer_input", "enable_moe_block",
                "num_experts", "top_k_experts"):
        cfg["text_config"].pop(key, None)
    (out / "config.json").write_text(json.dumps(cfg, indent=2, sort_keys=True) + "\n")
    state = load_file(str(src / "model.safetensors"))
    grown = {}
    for name, arr in state.items():
        if arr.ndim == 2 and arr.shape[0] == g4.VOCAB_SIZE:
            arr = np.concatenate([arr, np.zeros((mm.VOCAB_SIZE - g4.VOCAB_SIZE, arr.shape[1]),
                                                dtype=arr.dtype)])
        grown[name] = np.ascontiguousarray(arr)
    save_file(dict(sorted(grown.items())), str(out / "model.safetensors"),
              metadata={"format": "pt"})
    for name in ("tokenizer.json", "tokenizer_config.json", "chat_template.jinja",
                 "generation_config.json"):
        shutil.copy2(target_dir / name, out / name)


# ---------------------------------------------------------------------------
# Training: the text model without gemma4-tiny's per-layer inputs says nothing useful until it
# is trained a little more on gemma4-tiny's own corpus (the copied weights are the start)
# ---------------------------------------------------------------------------
TRAIN_STEPS = 200


def train_text(model: Any, text_dir: Path, steps: int = TRAIN_STEPS) -> dict[str, Any]:
    """Train the language model of ``model`` (in place) on gemma4-tiny's corpus and training
    stream (next-token cross-entropy, AdamW, gemma4-tiny's schedule at a third of its peak
    rate); the media projections are not touched. Returns the run's numbers (no times)."""
    import time

    import torch
    from tokenizers import Tokenizer

    tok = Tokenizer.from_file(str(text_dir / "tokenizer.json"))
    prose, dialogues = g4.corpus()
    stream, starts = g4.training_stream(tok, prose, dialogues)
    lm = model.model.language_model
    params = [p for p in lm.parameters()]
    opt = torch.optim.AdamW(params, lr=1e-3, betas=(0.9, 0.95), weight_decay=0.0)
    batches = g4._batches(stream, starts, SEED)
    model.train()
    t0 = time.time()
    loss = torch.tensor(float("nan"))
    for step in range(steps):
        batch = next(batches)
        for group in opt.param_groups:
            group["lr"] = g4._lr(step, steps, lr_max=1e-3, warmup=20)
        logits = model(input_ids=batch[:, :-1]).logits
        loss = torch.nn.functional.cross_entropy(logits.reshape(-1, logits.shape[-1]),
                                                 batch[:, 1:].reshape(-1))
        opt.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(params, 1.0)
        opt.step()
        if step % 50 == 0 or step == steps - 1:
            print(f"[gemma4-unified-tiny] text: step {step:4d} loss {loss.item():.4f} "
                  f"({time.time() - t0:.0f}s)", flush=True)
    model.eval()
    print(f"[gemma4-unified-tiny] text: trained in {time.time() - t0:.0f}s", flush=True)
    # no wall time in the record: parity.json stays byte-identical across reruns
    return {"steps": steps, "final_loss": round(float(loss.item()), 4),
            "torch_threads": torch.get_num_threads()}


class UnifiedMediaEncoder(oracle.MediaEncoder):
    """The oracle's media inputs for the Unified model: raw 48x48 patches and raw 640-sample
    frames (:func:`image_patches`, :func:`audio_frames`) in place of Gemma 4's processors."""

    def processors(self) -> tuple[Any, Any]:
        return None, None

    def image_inputs(self, files: list[str]) -> dict[str, Any]:
        import torch

        from eliza_backends.convert.families.gemma4_media import unified_patches

        p = VISION["patch_size"] * VISION["pooling_kernel_size"]
        made = [unified_patches(mm.read_image(self.root / f), p, MAX_SOFT_TOKENS)
                for f in files]
        return {"pixel_values": torch.cat([pv for pv, _ in made]),
                "image_position_ids": torch.cat([pos for _, pos in made]),
                "counts": [int((pos[0, :, 0] >= 0).sum()) for _, pos in made]}

    def audio_inputs(self, files: list[str]) -> dict[str, Any]:
        import numpy as np
        import torch

        frames = [audio_frames(mm.read_audio(self.root / f)) for f in files]
        n = max(f.shape[0] for f in frames)
        feats = np.stack([np.pad(f, ((0, n - f.shape[0]), (0, 0))) for f in frames])
        mask = np.stack([np.arange(n) < f.shape[0] for f in frames])
        return {"input_features": torch.from_numpy(feats),
                "input_features_mask": torch.from_numpy(mask),
                "counts": [int(f.shape[0]) for f in frames]}
