"""The tiny multimodal Gemma 4's parts: the media tokens, the chat template with media parts,
the small random vision and audio towers, the committed test media, the processor files, and
the assembly of a ``Gemma4ForConditionalGeneration`` around the trained gemma4-tiny text model.
Used by tools/make_gemma4_mm_tiny.py (tool-time only: torch, transformers 5.24, tokenizers).

Everything here is deterministic: fixed seeds, tensors filled in sorted-name order, media drawn
by formula (no random numbers), PNG and WAV written by the standard library.
"""

from __future__ import annotations

import json
import math
import shutil
import struct
import wave
import zlib
from pathlib import Path
from typing import Any

import gemma4_family as g4  # the text model's tokenizer and template (tools/ is on sys.path)

SEED = 4322

# ---------------------------------------------------------------------------
# Tokens: Gemma 4's seven media tokens, appended after the text vocabulary (ids 512-518), in
# the BPE vocabulary and as special added tokens (llama.cpp's converter wants the base
# vocabulary to equal vocab_size; libmtmd finds <|image> <image|> <|audio> <audio|> by text).
# ---------------------------------------------------------------------------
BOI, EOI, IMAGE = "<|image>", "<image|>", "<|image|>"
BOA, EOA, AUDIO = "<|audio>", "<audio|>", "<|audio|>"
VIDEO = "<|video|>"
MEDIA_TOKENS = (BOI, EOI, IMAGE, BOA, EOA, AUDIO, VIDEO)
VOCAB_SIZE = g4.VOCAB_SIZE + len(MEDIA_TOKENS)
TOKEN_IDS = {t: g4.VOCAB_SIZE + i for i, t in enumerate(MEDIA_TOKENS)}
#: mm_token_type_ids values transformers uses (processing_utils.create_mm_token_type_ids)
IMAGE_TYPE, AUDIO_TYPE = 1, 3

# The gemma4-tiny turn template, with Gemma 4's own media placeholders for media parts (the
# real template writes '<|image|>' / '<|audio|>' inline, whitespace stripped); the processor
# (here: expand_placeholders) turns each into <|image> + n x <|image|> + <image|>.
_TEXT_PART = "{% if part['type'] == 'text' %}{{ part['text'] | trim }}{% endif %}"
_MEDIA_PART = (
    "{% if part['type'] == 'text' %}{{ part['text'] | trim }}"
    "{% elif part['type'] in ('image', 'image_url') %}{{ '" + IMAGE + "' }}"
    "{% elif part['type'] in ('audio', 'input_audio') %}{{ '" + AUDIO + "' }}"
    "{% elif part['type'] == 'video' %}{{ '" + VIDEO + "' }}{% endif %}"
)
assert _TEXT_PART in g4.CHAT_TEMPLATE
CHAT_TEMPLATE = g4.CHAT_TEMPLATE.replace(_TEXT_PART, _MEDIA_PART)


def render_chat(messages: list[dict[str, Any]], add_generation_prompt: bool) -> str:
    import jinja2

    return jinja2.Environment().from_string(CHAT_TEMPLATE).render(
        messages=messages, bos_token=g4.BOS, add_generation_prompt=add_generation_prompt)


# ---------------------------------------------------------------------------
# Towers: small widths, Gemma 4's structure (patch 16, pooling 3; a 2-layer conformer over 128
# mel bins). position_embedding_size 1024 (the real 10240 would be 2.6 MB of table here) covers
# 1024 patches a side, past what llama.cpp's 1120-token budget lets an image reach.
# ---------------------------------------------------------------------------
VISION = dict(hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=2,
              num_key_value_heads=2, head_dim=16, patch_size=16, pooling_kernel_size=3,
              position_embedding_size=1024)
AUDIO_TOWER = dict(hidden_size=32, num_hidden_layers=2, num_attention_heads=2,
                   subsampling_conv_channels=[128, 32], output_proj_dims=32)
#: soft tokens per image: images of 70 soft tokens whose sides are multiples of 48 px
#: (patch 16 x pooling 3) are kept at their size by both transformers (max_soft_tokens 70) and
#: llama.cpp (its Gemma 4 budget is 70-1120 tokens), so both see the same pixels
MAX_SOFT_TOKENS = 70
#: the scale of the random multimodal projections: projected features of about the norm of the
#: scaled text embeddings (~20), so the media change what the model says
PROJECTION_STD = 0.3
#: the clipped linears' ranges (the audio tower's; real checkpoints carry finite ranges)
CLIP_RANGE = 4.0


def multimodal_config(text_dir: Path) -> Any:
    """Gemma4Config: the trained text model's config grown by the media tokens, with the image
    block bidirectional on sliding layers (``use_bidirectional_attention="vision"``, Gemma 4's
    rule for the sizes llama.cpp does not key to causal), and the two small towers."""
    from transformers import Gemma4AudioConfig, Gemma4Config, Gemma4TextConfig, Gemma4VisionConfig

    text = json.loads((text_dir / "config.json").read_text())
    for key in ("architectures", "transformers_version", "dtype", "model_type",
                "per_layer_config"):
        text.pop(key, None)
    text.update(vocab_size=VOCAB_SIZE, vocab_size_per_layer_input=VOCAB_SIZE,
                use_bidirectional_attention="vision")
    return Gemma4Config(
        text_config=Gemma4TextConfig(**text), vision_config=Gemma4VisionConfig(**VISION),
        audio_config=Gemma4AudioConfig(**AUDIO_TOWER),
        boi_token_id=TOKEN_IDS[BOI], eoi_token_id=TOKEN_IDS[EOI],
        image_token_id=TOKEN_IDS[IMAGE], boa_token_id=TOKEN_IDS[BOA],
        eoa_token_index=TOKEN_IDS[EOA], audio_token_id=TOKEN_IDS[AUDIO],
        video_token_id=TOKEN_IDS[VIDEO], tie_word_embeddings=True, dtype="float32")


def _fill_tower(module: Any, gen: Any) -> None:
    """Random weights in sorted-name order: matrices N(0, 1/fan_in), norm scales 1 + N(0, 0.1),
    other vectors N(0, 0.1), the patch position table N(0, 0.5); clipped linears get finite
    ranges."""
    import torch

    for name, p in sorted(module.named_parameters()):
        if "position_embedding_table" in name:
            p.copy_(0.5 * torch.randn(p.shape, generator=gen))
        elif p.dim() == 1 and "norm" in name:
            p.copy_(1 + 0.1 * torch.randn(p.shape, generator=gen))
        elif p.dim() <= 1:
            p.copy_(0.1 * torch.randn(p.shape, generator=gen))
        else:
            p.copy_(torch.randn(p.shape, generator=gen) / math.sqrt(p[0].numel()))
    for name, b in sorted(module.named_buffers()):
        if name.endswith(("input_min", "output_min")):
            b.fill_(-CLIP_RANGE)
        elif name.endswith(("input_max", "output_max")):
            b.fill_(CLIP_RANGE)


def build_model(text_dir: Path) -> Any:
    """The float32 Gemma4ForConditionalGeneration: the trained text weights of ``text_dir`` under
    ``model.language_model``, their embedding tables grown by 7 rows of small random values (so
    the media tokens never outscore a text token through the tied head), random towers."""
    import torch
    from transformers import Gemma4ForCausalLM, Gemma4ForConditionalGeneration

    text = Gemma4ForCausalLM.from_pretrained(str(text_dir), dtype=torch.float32)
    torch.manual_seed(SEED)
    model = Gemma4ForConditionalGeneration(multimodal_config(text_dir)).float().eval()
    gen = torch.Generator().manual_seed(SEED)
    lm = model.model.language_model
    with torch.no_grad():
        targets = lm.state_dict()
        for name, src in sorted(text.model.state_dict().items()):
            dst = targets[name]
            n = src.shape[0]
            dst[:n].copy_(src)
            if dst.shape[0] > n:  # the two vocabulary tables
                dst[n:].copy_(0.02 * torch.randn((dst.shape[0] - n, *dst.shape[1:]),
                                                 generator=gen))
        _fill_tower(model.model.vision_tower, gen)
        _fill_tower(model.model.audio_tower, gen)
        for emb in (model.model.embed_vision, model.model.embed_audio):
            w = emb.embedding_projection.weight
            w.copy_(PROJECTION_STD * torch.randn(w.shape, generator=gen))
    model.tie_weights()
    return model


def tower_parameters(model: Any) -> dict[str, int]:
    return {name: sum(p.numel() for p in getattr(model.model, name).parameters())
            for name in ("vision_tower", "audio_tower", "embed_vision", "embed_audio")}


# ---------------------------------------------------------------------------
# Tokenizer and processor files
# ---------------------------------------------------------------------------
def write_tokenizer(text_dir: Path, out: Path) -> None:
    """tokenizer.json / tokenizer_config.json / chat_template.jinja of ``text_dir`` with the
    media tokens added (vocabulary and special added tokens) and the media template."""
    tj = json.loads((text_dir / "tokenizer.json").read_text(encoding="utf-8"))
    vocab = tj["model"]["vocab"]
    assert len(vocab) == g4.VOCAB_SIZE
    for token, i in TOKEN_IDS.items():
        vocab[token] = i
        tj["added_tokens"].append({"id": i, "content": token, "single_word": False,
                                   "lstrip": False, "rstrip": False, "normalized": False,
                                   "special": True})
    (out / "tokenizer.json").write_text(json.dumps(tj, ensure_ascii=False, indent=1) + "\n",
                                        encoding="utf-8")
    cfg = json.loads((text_dir / "tokenizer_config.json").read_text(encoding="utf-8"))
    cfg["additional_special_tokens"] = [*cfg["additional_special_tokens"], *MEDIA_TOKENS]
    cfg.update(image_token=IMAGE, boi_token=BOI, eoi_token=EOI, audio_token=AUDIO,
               boa_token=BOA, eoa_token=EOA, chat_template=CHAT_TEMPLATE)
    (out / "tokenizer_config.json").write_text(json.dumps(cfg, indent=2, ensure_ascii=False)
                                               + "\n", encoding="utf-8")
    (out / "chat_template.jinja").write_text(CHAT_TEMPLATE, encoding="utf-8")


def processors() -> tuple[Any, Any]:
    from transformers.models.gemma4 import Gemma4AudioFeatureExtractor, Gemma4ImageProcessorPil

    # the patch / pooling of VISION (as a sibling tool sets them: make_gemma4_mm_litert.py)
    image = Gemma4ImageProcessorPil(max_soft_tokens=MAX_SOFT_TOKENS,
                                    patch_size=VISION["patch_size"],
                                    pooling_kernel_size=VISION["pooling_kernel_size"])
    return image, Gemma4AudioFeatureExtractor()


def write_processor_config(out: Path) -> None:
    """processor_config.json as transformers 5 nests it (image_processor, feature_extractor):
    Gemma4Processor itself cannot be saved here (it wants a video processor, i.e. torchvision),
    and llama.cpp's converter reads image_mean / image_std from this file."""
    image, audio = processors()
    doc = {"processor_class": "Gemma4Processor", "image_seq_length": MAX_SOFT_TOKENS,
           "audio_seq_length": 750, "audio_ms_per_token": 40,
           "image_processor": json.loads(image.to_json_string()),
           "feature_extractor": json.loads(audio.to_json_string())}
    (out / "processor_config.json").write_text(json.dumps(doc, indent=2, sort_keys=True) + "\n")


def save_folder(model: Any, text_dir: Path, out: Path,
                text_fields: dict[str, Any] | None = None,
                processor_config: Any = None) -> None:
    """The Hugging Face folder: weights, config (global_head_dim and use_double_wide_mlp
    explicit in text_config, as mlx-lm / mlx-vlm want, and ``text_fields``), generation
    config, tokenizer, processor (``processor_config(out)`` writes it; default this model's
    :func:`write_processor_config`)."""
    from transformers import GenerationConfig

    if out.exists():
        shutil.rmtree(out)
    out.mkdir(parents=True)
    model.generation_config = GenerationConfig(bos_token_id=2, eos_token_id=[1, 6],
                                               pad_token_id=0, do_sample=False)
    model.save_pretrained(str(out), safe_serialization=True)
    cfg = json.loads((out / "config.json").read_text())
    cfg["text_config"]["global_head_dim"] = g4.TARGET["global_head_dim"]
    cfg["text_config"]["use_double_wide_mlp"] = False
    cfg["text_config"].update(text_fields or {})
    (out / "config.json").write_text(json.dumps(cfg, indent=2, sort_keys=True) + "\n")
    write_tokenizer(text_dir, out)
    (processor_config or write_processor_config)(out)


# ---------------------------------------------------------------------------
# Test media, drawn by formula: two 70-token images (landscape and portrait) and two clips
# ---------------------------------------------------------------------------
def _png(path: Path, width: int, height: int, pixel: Any) -> None:
    rows = bytearray()
    for y in range(height):
        rows.append(0)  # filter: none
        for x in range(width):
            rows.extend(pixel(x, y))

    def chunk(kind: bytes, data: bytes) -> bytes:
        return (struct.pack(">I", len(data)) + kind + data
                + struct.pack(">I", zlib.crc32(kind + data) & 0xFFFFFFFF))

    head = struct.pack(">IIBBBBB", width, height, 8, 2, 0, 0, 0)  # 8-bit RGB
    path.write_bytes(b"\x89PNG\r\n\x1a\n" + chunk(b"IHDR", head)
                     + chunk(b"IDAT", zlib.compress(bytes(rows), 9)) + chunk(b"IEND", b""))


def _wav(path: Path, samples: list[float]) -> None:
    with wave.open(str(path), "wb") as w:
        w.setnchannels(1)
        w.setsampwidth(2)
        w.setframerate(16000)
        w.writeframes(b"".join(struct.pack("<h", max(-32767, min(32767, round(s * 32767))))
                               for s in samples))


def _landscape(x: int, y: int) -> tuple[int, int, int]:
    # red steps left to right, green steps top to bottom, a blue checkerboard of 48-px squares
    return x * 16 // 480 * 17, y * 12 // 336 * 21, 220 if (x // 48 + y // 48) % 2 else 30


def _portrait(x: int, y: int) -> tuple[int, int, int]:
    # diagonal stripes, a green disc, a blue fade
    disc = (x - 168) ** 2 + (y - 240) ** 2 < 100 ** 2
    return 230 if (x + y) % 96 < 48 else 10, 255 if disc else 40, 255 - y * 255 // 480


def _chirp(n: int) -> list[float]:
    # 300 -> 800 Hz sweep with 20 ms fades
    out = []
    for i in range(n):
        t = i / 16000
        fade = min(1.0, i / 320, (n - 1 - i) / 320)
        out.append(0.5 * fade * math.sin(2 * math.pi * (300 * t + 250 * t * t)))
    return out


def _tones(n: int) -> list[float]:
    # three notes (440, 660, 880 Hz) with a second harmonic, each with its own fade in/out
    out = []
    seg = n // 3
    for i in range(n):
        k = min(2, i // seg)
        j = i - k * seg
        fade = min(1.0, j / 400, max(0, seg - 1 - j) / 400)
        f = (440, 660, 880)[k]
        t = i / 16000
        out.append(0.4 * fade * (math.sin(2 * math.pi * f * t)
                                 + 0.3 * math.sin(4 * math.pi * f * t)))
    return out


#: file name -> (kind, what it is)
MEDIA_FILES = {
    "image-landscape.png": ("image", "480x336 RGB: red/green steps, blue 48-px checkerboard"),
    "image-portrait.png": ("image", "336x480 RGB: diagonal stripes, a green disc, a blue fade"),
    "audio-chirp.wav": ("audio", "1.0 s, 16 kHz mono 16-bit: a 300-800 Hz sweep"),
    "audio-tones.wav": ("audio", "2.0 s, 16 kHz mono 16-bit: 440, 660, 880 Hz notes"),
}


def write_media(out: Path) -> None:
    out.mkdir(parents=True, exist_ok=True)
    _png(out / "image-landscape.png", 480, 336, _landscape)
    _png(out / "image-portrait.png", 336, 480, _portrait)
    _wav(out / "audio-chirp.wav", _chirp(16000))
    _wav(out / "audio-tones.wav", _tones(32000))


def read_image(path: Path) -> Any:
    """(H, W, 3) uint8 RGB, as the seam hands a backend an image."""
    import numpy as np
    from PIL import Image

    with Image.open(path) as im:
        return np.asarray(im.convert("RGB"), dtype=np.uint8)


def read_audio(path: Path) -> Any:
    """float32 mono PCM in [-1, 1) at 16 kHz (int16 / 32768), as the seam hands a backend."""
    import numpy as np

    with wave.open(str(path), "rb") as w:
        assert (w.getnchannels(), w.getsampwidth(), w.getframerate()) == (1, 2, 16000)
        data = w.readframes(w.getnframes())
    return np.frombuffer(data, dtype="<i2").astype(np.float32) / 32768.0
