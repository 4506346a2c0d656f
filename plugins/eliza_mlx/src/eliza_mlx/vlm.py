"""Multimodal MLX folders (Gemma 4 with a vision and/or audio tower, Gemma 4 Unified with its
raw-patch / raw-frame projections) through mlx-vlm.

:func:`load_vlm` loads such a folder with mlx-vlm and wraps it in :class:`VLMModel`, which the
session drives as it drives an mlx-lm model (``model(ids[None], cache=cache)`` -> logits,
``make_cache()``), plus the media path: :meth:`VLMModel.media_tokens` (the model's markers, the
soft-token count, the projected features) and :meth:`VLMModel.prefill_embeddings` (the
features appended to the cache).

The image mask is Gemma 4's own (transformers, ``use_bidirectional_attention="vision"``; the
reference the other backends follow): an image's soft tokens attend to each other both ways on
sliding layers, within the window backwards; full layers and audio stay causal. mlx-vlm 0.7.10
differs (it ORs the block in after the window, on every layer, and not at all after a cached
prefix), so the image block is prefilled here with masks built to the reference.

Runs on the MLX thread, like the rest of the plugin; mlx-vlm is imported only here.
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import mlx.core as mx  # type: ignore[import-not-found,unused-ignore]

from eliza_backends import MediaError

from .probe import multimodal_kinds

#: Gemma 4's media tokens, by their text (the tokenizer holds them as special tokens)
MARKERS = {"image": ("<|image>", "<|image|>", "<image|>"),
           "audio": ("<|audio>", "<|audio|>", "<audio|>")}


@dataclass(frozen=True)
class Prepared:
    """An item's projected features ``[count, hidden]`` and its kind (a MediaTokens handle)."""

    kind: str
    features: Any


class VLMModel:
    """mlx-vlm's Gemma 4 with the call shape of an mlx-lm model."""

    def __init__(self, model: Any, processor: Any, token_ids: dict[str, int],
                 max_audio_tokens: int) -> None:
        self.vlm = model
        self.language = model.language_model
        self.processor = processor
        self.token_ids = token_ids
        self.max_audio_tokens = max_audio_tokens
        self.model_type = "gemma4"
        self.layers = self.language.model.layers
        text = self.language.model
        text._make_masks = functools.partial(_reference_masks, text, text._make_masks)

    @property
    def language_model(self) -> Any:
        """mlx-vlm's language model (what the MTP assistant binds to and reads)."""
        return self.language

    def __call__(self, inputs: Any, cache: Any = None, **kwargs: Any) -> Any:
        return self.language(inputs, cache=cache, **kwargs).logits

    def make_cache(self) -> list[Any]:
        return list(self.language.make_cache())

    # ------------------------------------------------------------------ media
    def kinds(self) -> frozenset[str]:
        # Gemma 4: towers; Gemma 4 Unified: the raw-patch embedder and the audio projection
        kinds = set()
        if any(getattr(self.vlm, a, None) is not None for a in ("vision_tower",
                                                                 "vision_embedder")):
            kinds.add("image")
        if getattr(self.vlm, "audio_tower", None) is not None or (
                getattr(self.vlm, "vision_embedder", None) is not None
                and getattr(self.vlm, "embed_audio", None) is not None):
            kinds.add("audio")
        return frozenset(kinds)

    @property
    def unified(self) -> bool:
        """Whether the model is a Gemma 4 Unified (raw patches / frames, no encoders)."""
        return hasattr(self.vlm, "vision_embedder")

    def encode(self, kind: str, data: Any) -> Any:
        """Projected features ``[n, hidden]`` of an RGB image / 16 kHz PCM (evaluated)."""
        import numpy as np

        vlm = self.vlm
        if kind == "image":
            from PIL import Image

            pv, _ = self.processor.image_processor([Image.fromarray(np.asarray(data))])
            pixels = mx.array(np.asarray(pv["pixel_values"], dtype=np.float32))
            if self.unified:
                feats = vlm.get_image_features(pixels,
                                               mx.array(np.asarray(pv["image_position_ids"])))
            else:
                feats = vlm.embed_vision(vlm.vision_tower(pixels))[0]
        else:
            fe = self.processor.feature_extractor([np.asarray(data, dtype=np.float32)],
                                                  sampling_rate=16000, return_tensors="np")
            mask = mx.array(np.asarray(fe["input_features_mask"]))
            features = mx.array(np.asarray(fe["input_features"], dtype=np.float32))
            if self.unified:
                feats = vlm.get_audio_features(features, mask)
            else:
                enc, pad = vlm.audio_tower(features, ~mask)
                valid = int((~pad[0]).sum().item())  # padding sits at the end
                feats = vlm.embed_audio(enc)[0][:valid]
        mx.eval(feats)
        return feats

    def media_tokens(self, kind: str, data: Any) -> tuple[int, int, int, int, Prepared]:
        """(begin id, placeholder id, count, end id, prepared features) of one item."""
        feats = self.encode(kind, data)
        count = int(feats.shape[0])
        if count == 0:
            raise MediaError(f"the {kind} gave no embeddings (too short); send a longer clip")
        if kind == "audio" and count > self.max_audio_tokens:
            raise MediaError(f"the audio clip gives {count} soft tokens, past this model's "
                             f"{self.max_audio_tokens} ({self.max_audio_tokens * 0.04:.0f} s); "
                             "send a shorter clip")
        begin, soft, end = (self.token_ids[t] for t in MARKERS[kind])
        return begin, soft, count, end, Prepared(kind, feats)

    def prefill_embeddings(self, prepared: Prepared, cache: list[Any]) -> None:
        """Append the features to ``cache`` (positions after it), with Gemma 4's mask."""
        feats = prepared.features[None]
        n = int(feats.shape[1])
        text = self.language.model
        pad = mx.zeros((1, n), dtype=mx.uint32)  # per-layer inputs of the pad token, as HF
        per_layer = text.get_per_layer_inputs(pad) if text.hidden_size_per_layer_input else None
        types = mx.full((1, n), 1 if prepared.kind == "image" else 3, dtype=mx.int32)
        self.language(None, inputs_embeds=feats.astype(text.embed_tokens.weight.dtype),
                      per_layer_inputs=per_layer, cache=cache,
                      mm_token_type_ids=types if prepared.kind == "image" else None)
        mx.eval([c.state for c in cache])


def _reference_masks(text: Any, original: Any, h: Any, cache: Any,
                     mm_token_type_ids: Any = None) -> list[Any]:
    """Gemma 4's masks for a chunk that is one image block (``mm_token_type_ids`` all 1):
    causal on full layers; on sliding layers mlx-vlm's windowed causal mask plus every later
    token of the block (the window bounds only the past). Any other chunk: mlx-vlm's own."""
    from mlx_vlm.models.base import create_attention_mask

    if mm_token_type_ids is None:
        return list(original(h, cache, None))
    n = int(h.shape[1])
    by_type: dict[str, Any] = {}
    masks = []
    for layer, c in zip(text.layers, cache, strict=False):
        kind = layer.layer_type
        if kind not in by_type:
            if kind == "sliding_attention":
                base = create_attention_mask(h, c, window_size=text.window_size,
                                             return_array=True)
                k = int(base.shape[-1])
                i = mx.arange(n)[:, None]
                j = mx.arange(k)[None, :] - (k - n)  # block index of each key column
                by_type[kind] = base | (j > i)
            else:
                by_type[kind] = create_attention_mask(h, c, return_array=True)
        masks.append(by_type[kind])
    return masks


def _gemma4_processor() -> Any:
    from mlx_vlm.models.gemma4.processing_gemma4 import Gemma4Processor

    return Gemma4Processor


def _gemma4_unified_processor() -> Any:
    from mlx_vlm.models.gemma4_unified.processing_gemma4_unified import (
        Gemma4UnifiedProcessor,
    )

    return Gemma4UnifiedProcessor


#: config.json model_type -> the mlx-vlm processor class it is loaded with (its own
#: processor_config.json read, max_soft_tokens included), imported when asked for: a fixed
#: table of named imports, never a module name taken from the bundle.
PROCESSORS: dict[str, Callable[[], Any]] = {
    "gemma4": _gemma4_processor,
    "gemma4_unified": _gemma4_unified_processor,
}


def load_vlm(folder: Path, token_ids: dict[str, int]) -> VLMModel:
    """mlx-vlm's model and its Gemma 4 (or Gemma 4 Unified) processor for ``folder`` (raises
    what mlx-vlm raises)."""
    import json

    from mlx_vlm.utils import load_model

    model_type = json.loads((folder / "config.json").read_text(encoding="utf-8"))["model_type"]
    processor_class = PROCESSORS[model_type]()
    model = load_model(folder)
    processor = processor_class.from_pretrained(str(folder))
    return VLMModel(model, processor, token_ids,
                    max_audio_tokens=int(getattr(processor, "audio_seq_length", 750)))


__all__ = ["MARKERS", "PROCESSORS", "Prepared", "VLMModel", "load_vlm", "multimodal_kinds"]
