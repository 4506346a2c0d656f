"""Images and audio for the LiteRT-LM engine session, through LiteRT-LM's Conversation API.

LiteRT-LM's Session API takes media only preprocessed (``run_prefill`` with raw image bytes
fails: "Image must be preprocessed before being used in SessionAdvanced"); its Conversation API
preprocesses them itself (resize, mel features), runs the ``.litertlm``'s encoders and places
the model's begin/end markers around the soft tokens. So a sequence that holds media is given
to a conversation whole: its text runs as text parts, each media item as an ``image`` /
``audio`` part (PNG / 16-bit WAV bytes made from the decoded item), under a chat template
that renders the parts as they are (the sequence is already the rendered prompt).

The attention mask over an image's soft tokens is LiteRT-LM's: its prefill is **causal**
(see docs/guides/multimodal.md; the reference mask is bidirectional inside an image block on
sliding layers, and the gap is measured in the bundle's parity.json).
"""

from __future__ import annotations

import io
import wave
from collections.abc import Iterator, Sequence
from typing import Any

from eliza_backends import BackendRuntimeError, MediaError
from eliza_backends.backend import MediaItem

from .container import Container

#: the ``.litertlm`` sections that encode each media kind (litert-torch 0.10's exporter)
ENCODER_SECTIONS = {"image": "tf_lite_vision_encoder", "audio": "tf_lite_audio_encoder_hw"}

#: Gemma 4's media markers: kind -> (begin, soft token, end) texts; the conversation renders a
#: part as its soft token and expands it to ``begin + N soft tokens + end``
MARKERS = {"image": ("<|image>", "<|image|>", "<image|>"),
           "audio": ("<|audio>", "<|audio|>", "<audio|>")}

#: renders a conversation message's parts as they are: text as text, media as its soft token
IDENTITY_TEMPLATE = (
    "{% for m in messages %}{% for p in m['content'] %}{% if p['type'] == 'text' %}"
    "{{ p['text'] }}{% elif p['type'] == 'image' %}<|image|>{% elif p['type'] == 'audio' %}"
    "<|audio|>{% endif %}{% endfor %}{% endfor %}")


def container_media(container: Container) -> dict[str, str]:
    """The media kinds a ``.litertlm`` carries encoders for, each with the section that
    encodes it (a header read: nothing is loaded)."""
    return {kind: f"{container.path.name}: {section} section"
            for kind, section in ENCODER_SECTIONS.items()
            if container.find("TFLiteModel", model_type=section) is not None}


def media_bytes(item: MediaItem) -> bytes:
    """The item as the file bytes LiteRT-LM decodes: PNG for an image (its RGB pixels),
    16 kHz mono 16-bit WAV for audio (its PCM, rounded to int16)."""
    import numpy as np

    out = io.BytesIO()
    if item.kind == "image":
        from PIL import Image

        Image.fromarray(np.asarray(item.data), "RGB").save(out, format="PNG")
        return out.getvalue()
    if item.kind == "audio":
        pcm = np.clip(np.round(np.asarray(item.data) * 32768.0), -32768, 32767)
        with wave.open(out, "wb") as w:
            w.setnchannels(1)
            w.setsampwidth(2)
            w.setframerate(16000)
            w.writeframes(pcm.astype("<i2").tobytes())
        return out.getvalue()
    raise MediaError(f"the LiteRT-LM engine takes images and audio, not {item.kind!r}")


def media_part(kind: str, data: bytes) -> dict[str, Any]:
    """A Conversation API content part (``litert_lm.Content.ImageBytes/AudioBytes`` JSON)."""
    import base64

    return {"type": kind, "blob": base64.b64encode(data).decode("ascii")}


def message_text(message: Any) -> str:
    """The text of one streamed conversation chunk (a Message dict)."""
    content = message.get("content", "") if hasattr(message, "get") else str(message)
    if isinstance(content, str):
        return content
    return "".join(p.get("text", "") for p in content if p.get("type") == "text")


def conversation_tokens(engine: Any, sampler: Any, content: Sequence[dict[str, Any]]) -> int:
    """Positions a conversation holds after ``content`` and one generated token (the
    engine's own count: bos, the parts as it expanded them, the token)."""
    conv = engine.create_conversation(sampler_config=sampler, chat_template=IDENTITY_TEMPLATE,
                                      max_output_tokens=1)
    try:
        conv.send_message({"role": "user", "content": list(content)})
        return int(conv.token_count)
    finally:
        conv.close()


#: the ``llm_model_type`` s whose LiteRT-LM data processor counts soft tokens as
#: :func:`planned_soft_tokens` does (its Gemma 4 one); any other asks the engine
PLANNED_COUNT_MODEL_TYPES = frozenset({"gemma4"})
#: LiteRT-LM's Gemma 4 image pooling kernel (its ``Gemma4DataProcessorConfig`` default;
#: litert-torch 0.10 writes none into the container)
POOLING_KERNEL = 3
#: LiteRT-LM's Gemma 4 audio front end: one mel frame per hop of 160 samples (10 ms at
#: 16 kHz, semicausal: the first window is half zeros), two stride-2 subsamplings after it
AUDIO_HOP = 160
#: the audio encoder's input in mel frames (litert-torch 0.10 exports E2B's 816); longer
#: clips are left to the engine (the probe), which refuses them
AUDIO_MAX_FRAMES = 816


def image_soft_tokens(width: int, height: int, patchify: tuple[int, int, int]) -> int | None:
    """The soft tokens LiteRT-LM's Gemma 4 image preprocessor gives a ``width`` x ``height``
    image: its aspect-ratio-preserving resize (``GetAspectRatioPreservingSize``, in float32
    as there) to at most ``max_num_patches`` patches, sides multiples of patch x pooling,
    then one token per pooled cell. ``patchify``: (patch width, patch height,
    max_num_patches) from the container. None where the engine would refuse the size (it
    says why)."""
    import numpy as np

    patch, patch_h, max_patches = patchify
    if patch != patch_h or width <= 0 or height <= 0:
        return None
    f32 = np.float32
    side = POOLING_KERNEL * patch
    target = f32(max_patches * patch * patch)
    factor = np.sqrt(f32(target / f32(width * height)))
    rows = int(np.floor(f32(f32(factor * f32(height)) / f32(side))))
    cols = int(np.floor(f32(f32(factor * f32(width)) / f32(side))))
    longest = max_patches // (POOLING_KERNEL * POOLING_KERNEL)
    if rows == 0 and cols == 0:
        return None
    if rows == 0:
        rows, cols = 1, min(int(np.floor(f32(width) / f32(height))), longest)
    elif cols == 0:
        rows, cols = min(int(np.floor(f32(height) / f32(width))), longest), 1
    if rows * cols * side * side > target or rows * cols == 0:
        return None
    return rows * cols


def audio_soft_tokens(samples: int) -> int | None:
    """The soft tokens LiteRT-LM's Gemma 4 audio path gives ``samples`` of 16 kHz PCM: one
    mel frame per :data:`AUDIO_HOP` samples (at least one), halved twice rounding up (the
    encoder's subsampling). None past the encoder's :data:`AUDIO_MAX_FRAMES`."""
    frames = max(samples // AUDIO_HOP, 1)
    if frames > AUDIO_MAX_FRAMES:
        return None
    halved = (frames + 1) // 2
    return (halved + 1) // 2


def planned_soft_tokens(item: MediaItem, patchify: tuple[int, int, int] | None) -> int | None:
    """The soft tokens of ``item`` computed as the engine computes them (no encoder run), for
    a Gemma 4 container; None when they cannot be (no patchify fields, a size the engine
    refuses): then :func:`soft_token_count` asks the engine."""
    if item.kind == "image":
        return image_soft_tokens(item.width, item.height, patchify) if patchify else None
    if item.kind == "audio":
        return audio_soft_tokens(len(item.data))
    return None


def soft_token_count(engine: Any, sampler: Any, kind: str, data: bytes) -> int:
    """How many soft tokens the engine gives this item: a probe conversation with the item
    and one without, the difference less the begin/end markers the engine adds. Runs the
    encoder once (the count depends on the engine's own resize / framing): the fallback of
    :func:`planned_soft_tokens`."""
    lead = {"type": "text", "text": MARKERS[kind][0]}
    try:
        with_item = conversation_tokens(engine, sampler, [lead, media_part(kind, data)])
        without = conversation_tokens(engine, sampler, [lead])
    except Exception as exc:
        raise MediaError(f"LiteRT-LM could not encode this {kind}: {exc}") from None
    count = with_item - without - 2
    if count <= 0:
        raise BackendRuntimeError(f"LiteRT-LM gave this {kind} {count} soft tokens")
    return count


def stream_conversation(engine: Any, sampler: Any, budget: int,
                        content: Sequence[dict[str, Any]]) -> tuple[Any, Iterator[str]]:
    """Start a conversation on ``content`` (the whole sequence) and stream its reply as text
    chunks; returns (the conversation, to cancel and close; the chunk iterator)."""
    conv = engine.create_conversation(sampler_config=sampler, chat_template=IDENTITY_TEMPLATE,
                                      max_output_tokens=budget)
    chunks = conv.send_message_async({"role": "user", "content": list(content)})
    return conv, (message_text(m) for m in chunks)


__all__ = ["AUDIO_HOP", "AUDIO_MAX_FRAMES", "ENCODER_SECTIONS", "IDENTITY_TEMPLATE", "MARKERS",
           "PLANNED_COUNT_MODEL_TYPES", "POOLING_KERNEL", "audio_soft_tokens",
           "container_media", "image_soft_tokens", "media_bytes", "media_part",
           "planned_soft_tokens", "soft_token_count", "stream_conversation"]
