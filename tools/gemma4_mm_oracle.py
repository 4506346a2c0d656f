"""The torch oracle of the tiny multimodal Gemma 4: prompts with images and audio expanded the
way Gemma4Processor expands them, greedy tokens by a manual loop (full recompute each step, no
early stop: ``generate()`` keeps the model's end ids even when told not to), the projected
media embeddings, and the same prompts under the other runtimes' image masks (the measured gap).
Used by tools/make_gemma4_mm_tiny.py (tool-time only).
"""

from __future__ import annotations

import base64
import hashlib
from pathlib import Path
from typing import Any

import gemma4_family as g4
import gemma4_mm_family as mm

#: The image-token attention rules the runtimes apply (FIELD_NOTES "Multimodal Gemma 4"):
#: the reference is transformers' own Gemma 4 definition.
MASK_RULES = {
    "sliding-bidirectional": "transformers Gemma 4 with use_bidirectional_attention='vision' "
                             "(the reference) and llama.cpp for widths other than E2B/E4B: an "
                             "image's soft tokens attend to each other both ways on sliding "
                             "layers (still within the window backwards), causal on full layers",
    "all-bidirectional": "mlx-vlm 0.7.10 and transformers' Gemma 4 Unified: the image block "
                         "bidirectional on every layer",
    "causal": "LiteRT-LM 0.18.1's prefill, and llama.cpp for E2B/E4B widths (1536/2560): "
              "causal everywhere",
}
REFERENCE_RULE = "sliding-bidirectional"


def _b64(array: Any) -> dict[str, Any]:
    import numpy as np

    a = np.ascontiguousarray(array, dtype="<f4")
    return {"dtype": "float32", "shape": list(a.shape),
            "base64": base64.b64encode(a.tobytes()).decode("ascii")}


class MediaEncoder:
    """Processor outputs and projected features of the committed media files (paths relative
    to the bundle ``root``)."""

    def __init__(self, model: Any, root: Path) -> None:
        self.model = model
        self.root = root
        self.image_processor, self.feature_extractor = self.processors()

    def processors(self) -> tuple[Any, Any]:
        """(image processor, audio feature extractor) of the model."""
        return mm.processors()

    def image_inputs(self, files: list[str]) -> dict[str, Any]:
        from PIL import Image

        images = [Image.fromarray(mm.read_image(self.root / f)) for f in files]
        out = self.image_processor(images=images, return_tensors="pt")
        return {"pixel_values": out["pixel_values"],
                "image_position_ids": out["image_position_ids"],
                "counts": [int(n) for n in out["num_soft_tokens_per_image"]]}

    def audio_inputs(self, files: list[str]) -> dict[str, Any]:
        import torch

        clips = [mm.read_audio(self.root / f) for f in files]
        out = self.feature_extractor(clips, sampling_rate=16000, return_tensors="pt")
        with torch.no_grad():
            enc = self.model.model.get_audio_features(out["input_features"],
                                                      out["input_features_mask"])
        return {"input_features": out["input_features"],
                "input_features_mask": out["input_features_mask"],
                "counts": [int(m.sum()) for m in enc.attention_mask]}

    def embeddings(self, name: str) -> Any:
        """The projected features (the embeddings the text model reads), [soft tokens, 128]."""
        import torch

        kind = mm.MEDIA_FILES[Path(name).name][0]
        with torch.no_grad():
            if kind == "image":
                x = self.image_inputs([name])
                feats = self.model.model.get_image_features(
                    x["pixel_values"], x["image_position_ids"]).pooler_output[0]
            else:
                x = self.audio_inputs([name])
                enc = self.model.model.get_audio_features(x["input_features"],
                                                          x["input_features_mask"])
                feats = enc.pooler_output[0][enc.attention_mask[0]]
        return feats.float().numpy()

    def describe(self, name: str) -> dict[str, Any]:
        kind, what = mm.MEDIA_FILES[Path(name).name]
        emb = self.embeddings(name)
        data = (self.root / name).read_bytes()
        entry: dict[str, Any] = {"kind": kind, "description": what,
                                 "sha256": hashlib.sha256(data).hexdigest(),
                                 "soft_tokens": int(emb.shape[0])}
        if kind == "image":
            h, w, _ = mm.read_image(self.root / name).shape
            entry["size"] = [w, h]
        else:
            entry["samples"] = int(mm.read_audio(self.root / name).shape[0])
            entry["sample_rate"] = 16000
        entry["embedding"] = _b64(emb)
        return entry


def media_parts(messages: list[dict[str, Any]]) -> list[tuple[str, str]]:
    """(kind, file) of every media part, in prompt order."""
    return [(part["type"], part["path"]) for m in messages if not isinstance(m["content"], str)
            for part in m["content"] if part["type"] in ("image", "audio")]


def expand(rendered: str, counts: list[tuple[str, int]]) -> str:
    """Each '<|image|>' / '<|audio|>' placeholder of the rendered template, in order, replaced by
    begin marker + n soft tokens + end marker (Gemma4Processor.replace_image_token /
    replace_audio_token)."""
    out = []
    rest = rendered
    for kind, n in counts:
        mark, begin, end = ((mm.IMAGE, mm.BOI, mm.EOI) if kind == "image"
                            else (mm.AUDIO, mm.BOA, mm.EOA))
        i = rest.index(mark)
        out.append(rest[:i] + begin + mark * n + end)
        rest = rest[i + len(mark):]
    assert mm.IMAGE not in rest and mm.AUDIO not in rest, "more placeholders than media"
    return "".join(out) + rest


def attention_masks(ids: list[int], rule: str) -> dict[str, Any]:
    """Additive [1, 1, T, T] masks per layer type for ``rule`` (a key of MASK_RULES)."""
    import torch

    t = torch.tensor(ids)
    is_img = t == mm.TOKEN_IDS[mm.IMAGE]
    starts = is_img & ~torch.cat([torch.tensor([False]), is_img[:-1]])
    block = torch.where(is_img, torch.cumsum(starts.int(), 0), -1)
    q = torch.arange(len(ids))[:, None]
    k = torch.arange(len(ids))[None, :]
    causal = k <= q
    same = (block[:, None] == block[None, :]) & (block[:, None] >= 0)
    window = k > q - g4.SLIDING_WINDOW
    if rule == "causal":
        full, sliding = causal, causal & window
    elif rule == "sliding-bidirectional":
        full, sliding = causal, (causal | same) & window
    elif rule == "all-bidirectional":
        full, sliding = causal | same, (causal | same) & window
    elif rule == "all-bidirectional-past-window":
        full, sliding = causal | same, (causal & window) | same
    else:
        raise ValueError(rule)
    neg = torch.finfo(torch.float32).min

    def additive(allowed: Any) -> Any:
        return torch.where(allowed, 0.0, neg)[None, None]

    return {"full_attention": additive(full), "sliding_attention": additive(sliding)}


def greedy(model: Any, ids: list[int], inputs: dict[str, Any], n: int,
           rule: str | None) -> tuple[list[int], list[float], Any]:
    """n greedy tokens by full recompute, each step's top-1/top-2 gap, and the first step's
    logits (numpy float32); rule None = transformers builds the mask itself from
    mm_token_type_ids (its own Gemma 4 rule), else attention_masks(rule)."""
    import torch

    cur = list(ids)
    out: list[int] = []
    gaps: list[float] = []
    first = None
    with torch.no_grad():
        for _ in range(n):
            t = torch.tensor([cur])
            kw = dict(inputs)
            if rule is None:
                mm_types = torch.zeros_like(t)
                mm_types[t == mm.TOKEN_IDS[mm.IMAGE]] = mm.IMAGE_TYPE
                mm_types[t == mm.TOKEN_IDS[mm.AUDIO]] = mm.AUDIO_TYPE
                kw["mm_token_type_ids"] = mm_types
            else:
                kw["attention_mask"] = attention_masks(cur, rule)
            logits = model(input_ids=t, **kw).logits[0, -1].float()
            if first is None:
                first = logits.numpy().copy()
            top = torch.topk(logits, 2)
            out.append(int(top.indices[0]))
            gaps.append(float(top.values[0] - top.values[1]))
            cur.append(out[-1])
    return out, gaps, first


def model_inputs(encoder: MediaEncoder, parts: list[tuple[str, str]]) -> tuple[
        dict[str, Any], list[tuple[str, int]]]:
    """The forward's media inputs for a prompt's parts and (kind, soft tokens) in order."""
    images = [f for k, f in parts if k == "image"]
    clips = [f for k, f in parts if k == "audio"]
    inputs: dict[str, Any] = {}
    counts_of: dict[str, list[int]] = {"image": [], "audio": []}
    if images:
        x = encoder.image_inputs(images)
        counts_of["image"] = x.pop("counts")
        inputs.update(x)
    if clips:
        x = encoder.audio_inputs(clips)
        counts_of["audio"] = x.pop("counts")
        inputs.update(x)
    order = [(k, counts_of[k].pop(0)) for k, _ in parts]
    return inputs, order


def oracle_prompt(model: Any, tok: Any, encoder: MediaEncoder, name: str,
                  messages: list[dict[str, Any]], n: int,
                  native_rule: str = REFERENCE_RULE,
                  rules: dict[str, str] | None = None) -> dict[str, Any]:
    """One prompt's record: rendered text, expanded ids, media spans, the reference greedy
    tokens and gaps, and the tokens under the other mask rules; ``native_rule``: the rule
    transformers' forward applies by itself given ``mm_token_type_ids`` (checked); ``rules``
    the mask rules measured (default MASK_RULES)."""
    rendered = mm.render_chat(messages, True)
    parts = media_parts(messages)
    inputs, counts = model_inputs(encoder, parts)
    text = expand(rendered, counts)
    ids = tok(text, add_special_tokens=False).input_ids
    assert ids[0] == 2, "the template starts with <bos>"
    spans = []
    pos = 0
    for (kind, file), (_, count) in zip(parts, counts, strict=True):
        soft = mm.TOKEN_IDS[mm.IMAGE if kind == "image" else mm.AUDIO]
        start = ids.index(soft, pos)
        assert ids[start:start + count] == [soft] * count
        spans.append({"kind": kind, "file": file, "start": start, "count": count})
        pos = start + count
    # the reference tokens: transformers' own mask when its forward applies the reference
    # rule (Gemma 4), else the reference masks built here (Gemma 4 Unified's plain forward
    # applies native_rule)
    native = native_rule == REFERENCE_RULE
    cont, gaps, first = greedy(model, ids, inputs, n, None if native else REFERENCE_RULE)
    stop_ids = [1, 6]
    first_stop = next((i for i, t in enumerate(cont) if t in stop_ids), None)
    until = cont if first_stop is None else cont[:first_stop]
    entry: dict[str, Any] = {
        "name": name, "kind": "+".join(sorted({k for k, _ in parts})) or "text",
        "messages": messages, "rendered": rendered, "prompt_ids": ids, "media": spans,
        "continuation_ids": cont,
        "continuation_text": tok.decode(cont, skip_special_tokens=False),
        "first_stop_index": first_stop,
        "text_until_stop": tok.decode(until, skip_special_tokens=False),
        "min_logit_gap": round(min(gaps), 4), "logit_gaps": [round(x, 4) for x in gaps],
        "first_logits": _b64(first)}
    if any(k == "image" for k, _ in parts):
        own, _, _ = greedy(model, ids, inputs, n, None)
        mine, _, _ = greedy(model, ids, inputs, n, native_rule)
        assert mine == own, f"{name}: attention_masks({native_rule}) != transformers' own"
        other = {}
        for rule in rules or MASK_RULES:
            if rule == REFERENCE_RULE:
                continue
            alt, _, alt_first = greedy(model, ids, inputs, n, rule)
            div = next((i for i, (a, b) in enumerate(zip(alt, cont, strict=True)) if a != b),
                       None)
            other[rule] = {"ids": alt, "equal": sum(a == b for a, b in zip(alt, cont,
                                                                           strict=True)),
                           "first_divergence": div,
                           "first_logits_max_abs_diff": round(float(abs(alt_first - first)
                                                                    .max()), 5),
                           "first_logits": _b64(alt_first)}
        entry["other_mask_rules"] = other
    return entry
