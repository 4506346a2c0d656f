"""The transformers float32 references of ``--verify``'s media prompts for the Gemma 4 families
(:mod:`..verify_media` sends the prompts through the bundle's artifacts; the family's
``media_reference`` says what they must give).

Both render the folder's chat template with one media part and a question, expand the media
placeholder to begin marker + soft tokens + end marker (the processors' rule), and decode
greedily by full recompute (``generate()`` keeps the model's end ids even when told not to).
The image-token mask is Gemma 4's own in both: the image block bidirectional on sliding layers
(within the window backwards), causal on full layers; audio causal.

* :func:`gemma4_reference` — ``Gemma4ForConditionalGeneration`` with its processors
  (``Gemma4ImageProcessorPil``, ``Gemma4AudioFeatureExtractor``); its forward builds that mask
  itself from ``mm_token_type_ids``;
* :func:`unified_reference` — ``Gemma4UnifiedForConditionalGeneration``: raw 48x48 patches and
  raw 640-sample frames; its plain forward ORs the image block in on every layer (what its own
  ``generate()`` does not), so the masks are built here (:func:`reference_masks`).

Tool-time only: torch and transformers are imported inside the functions.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from ...errors import BundleError


def _prompt_ids(source: Path, kind: str, question: str, n: int,
                tokens: tuple[int, int, int]) -> tuple[Any, list[int]]:
    """(tokenizer, prompt ids) of a one-item prompt: ``tokens`` = (begin, soft, end) ids."""
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(str(source))
    messages = [{"role": "user", "content": [{"type": kind},
                                             {"type": "text", "text": question}]}]
    rendered = tok.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)
    begin, soft, end = (tok.convert_ids_to_tokens(t) for t in tokens)
    text = rendered.replace(soft, begin + soft * n + end, 1)
    return tok, list(tok(text, add_special_tokens=False).input_ids)


def _greedy(model: Any, ids: list[int], inputs: dict[str, Any], n: int,
            step_kwargs: Any) -> list[int]:
    """``n`` greedy ids by full recompute; ``step_kwargs(ids tensor)`` -> the forward's extra
    keyword arguments for that step (masks / token types)."""
    import torch

    cur, out = list(ids), []
    with torch.no_grad():
        for _ in range(n):
            t = torch.tensor([cur])
            logits = model(input_ids=t, **inputs, **step_kwargs(t)).logits[0, -1]
            out.append(int(logits.argmax()))
            cur.append(out[-1])
    return out


def _processor_config(source: Path) -> dict[str, Any]:
    try:
        data = json.loads((source / "processor_config.json").read_text(encoding="utf-8"))
    except (OSError, ValueError) as exc:
        raise BundleError(f"{source}: a multimodal folder needs its processor_config.json "
                          f"({exc})") from None
    return data if isinstance(data, dict) else {}


def gemma4_reference(source: Path, kind: str, data: Any, question: str,
                     n_tokens: int) -> dict[str, Any]:
    """{"ids", "reference_ids"} of a Gemma 4 (with towers) folder (see the module docstring)."""
    import torch
    from transformers import Gemma4ForConditionalGeneration
    from transformers.models.gemma4 import Gemma4AudioFeatureExtractor, Gemma4ImageProcessorPil

    model = Gemma4ForConditionalGeneration.from_pretrained(str(source), dtype=torch.float32)
    model.eval()
    cfg = model.config
    proc = _processor_config(source)
    with torch.no_grad():
        if kind == "image":
            from PIL import Image

            ip = Gemma4ImageProcessorPil(**{k: v for k, v in proc["image_processor"].items()
                                            if k != "image_processor_type"})
            x = ip(images=[Image.fromarray(data)], return_tensors="pt")
            inputs = {"pixel_values": x["pixel_values"],
                      "image_position_ids": x["image_position_ids"]}
            n = int(x["num_soft_tokens_per_image"][0])
            tokens = (cfg.boi_token_id, cfg.image_token_id, cfg.eoi_token_id)
        else:
            fe = Gemma4AudioFeatureExtractor(**{k: v for k, v in proc.get(
                "feature_extractor", {}).items() if k != "feature_extractor_type"})
            x = fe([data], sampling_rate=16000, return_tensors="pt")
            inputs = {"input_features": x["input_features"],
                      "input_features_mask": x["input_features_mask"]}
            enc = model.model.get_audio_features(x["input_features"], x["input_features_mask"])
            n = int(enc.attention_mask[0].sum())
            tokens = (cfg.boa_token_id, cfg.audio_token_id, cfg.eoa_token_index)
    _, ids = _prompt_ids(source, kind, question, n, tokens)

    def types(t: Any) -> dict[str, Any]:
        return {"mm_token_type_ids": torch.where(t == cfg.image_token_id, 1, torch.where(
            t == cfg.audio_token_id, 3, 0))}

    return {"ids": ids, "reference_ids": _greedy(model, ids, inputs, n_tokens, types)}


def reference_masks(ids: Any, image_id: int, window: int) -> dict[str, Any]:
    """Gemma 4's additive masks [1, 1, T, T] for the ids tensor [1, T]: causal on full layers;
    on sliding layers causal within ``window`` plus the whole image block a token is in."""
    import torch

    t = ids[0]
    is_img = t == image_id
    starts = is_img & ~torch.cat([torch.tensor([False]), is_img[:-1]])
    block = torch.where(is_img, torch.cumsum(starts.int(), 0), -1)
    q = torch.arange(len(t))[:, None]
    k = torch.arange(len(t))[None, :]
    causal = k <= q
    same = (block[:, None] == block[None, :]) & (block[:, None] >= 0)
    sliding = (causal | same) & (k > q - window)
    neg = torch.finfo(torch.float32).min

    def additive(allowed: Any) -> Any:
        return torch.where(allowed, 0.0, neg)[None, None]

    return {"full_attention": additive(causal), "sliding_attention": additive(sliding)}


def unified_patches(rgb: Any, model_patch: int, max_tokens: int) -> tuple[Any, Any]:
    """(pixel_values [1, max_tokens, p*p*3], image_position_ids [1, max_tokens, 2]) of an
    (H, W, 3) uint8 image Gemma4UnifiedImageProcessor keeps at its size (sides multiples of the
    ``model_patch`` size, at most ``max_tokens`` patches): pixels / 255, each patch in row,
    column, channel order, row-major, padded with zero patches at position (-1, -1) — its
    16-px patches merged 3x3 come to this (its own code imports torchvision)."""
    import numpy as np
    import torch

    p = model_patch
    h, w, c = rgb.shape
    count = (h // p) * (w // p)
    if h % p or w % p or count > max_tokens:
        raise BundleError(f"the Unified reference takes images kept at their size: sides "
                          f"multiples of {p} px, at most {max_tokens} patches (got {w}x{h})")
    x = np.asarray(rgb, dtype=np.float32) / 255.0
    patches = x.reshape(h // p, p, w // p, p, c).transpose(0, 2, 1, 3, 4).reshape(count, -1)
    ys, xs = np.meshgrid(np.arange(h // p), np.arange(w // p), indexing="ij")
    pos = np.stack([xs.ravel(), ys.ravel()], axis=-1)
    pad = max_tokens - count
    return (torch.from_numpy(np.pad(patches, ((0, pad), (0, 0))))[None],
            torch.from_numpy(np.pad(pos, ((0, pad), (0, 0)), constant_values=-1))[None])


def unified_reference(source: Path, kind: str, data: Any, question: str,
                      n_tokens: int) -> dict[str, Any]:
    """{"ids", "reference_ids"} of a Gemma 4 Unified folder (see the module docstring)."""
    import torch
    from transformers import (
        Gemma4UnifiedAudioFeatureExtractor,
        Gemma4UnifiedForConditionalGeneration,
    )

    model = Gemma4UnifiedForConditionalGeneration.from_pretrained(str(source),
                                                                  dtype=torch.float32)
    model.eval()
    cfg = model.config
    if kind == "image":
        image = _processor_config(source).get("image_processor", {})
        vision = cfg.vision_config
        pv, pos = unified_patches(data, vision.patch_size * vision.pooling_kernel_size,
                                  int(image.get("max_soft_tokens", 280)))
        inputs = {"pixel_values": pv, "image_position_ids": pos}
        n = int((pos[0, :, 0] >= 0).sum())
        tokens = (cfg.boi_token_id, cfg.image_token_id, cfg.eoi_token_id)
        window = int(cfg.text_config.sliding_window)

        def masks(t: Any) -> dict[str, Any]:
            return {"attention_mask": reference_masks(t, cfg.image_token_id, window)}
    else:
        fe = Gemma4UnifiedAudioFeatureExtractor()(
            [data], sampling_rate=16000, return_tensors="pt")
        inputs = {"input_features": fe["input_features"],
                  "input_features_mask": fe["input_features_mask"]}
        n = int(fe["input_features_mask"][0].sum())
        tokens = (cfg.boa_token_id, cfg.audio_token_id, cfg.eoa_token_index)

        def masks(t: Any) -> dict[str, Any]:
            return {}  # no image: the forward's own causal masks
    _, ids = _prompt_ids(source, kind, question, n, tokens)
    return {"ids": ids, "reference_ids": _greedy(model, ids, inputs, n_tokens, masks)}


__all__ = ["gemma4_reference", "reference_masks", "unified_patches", "unified_reference"]
