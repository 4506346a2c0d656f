"""Parity prompts of a multimodal test bundle as an OpenAI client sends them: media parts that
name a bundle file (``{"type": "image", "path": "media/x.png"}``) become data-URI
``image_url`` / base64 ``input_audio`` parts. Shared by the multimodal backend tests."""

from __future__ import annotations

import base64
from pathlib import Path
from typing import Any

from eliza_backends import Stream


def openai_part(bundle: Path, p: dict[str, Any]) -> dict[str, Any]:
    """One parity message part as the OpenAI content part a client sends."""
    if p["type"] == "text":
        return p
    data = base64.b64encode((bundle / p["path"]).read_bytes()).decode()
    if p["type"] == "image":
        return {"type": "image_url", "image_url": {"url": f"data:image/png;base64,{data}"}}
    return {"type": "input_audio", "input_audio": {"data": data, "format": "wav"}}


def openai_messages(bundle: Path, messages: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """A parity prompt's messages with each media part as its OpenAI content part."""
    return [m if isinstance(m["content"], str) else
            {"role": m["role"], "content": [openai_part(bundle, p) for p in m["content"]]}
            for m in messages]


def reply_ids(stream: Stream, bundle: Path, messages: list[dict[str, Any]]) -> list[int]:
    """Prefill the messages (chat path, prefix reuse) and generate to the end."""
    stream.prefill_messages(openai_messages(bundle, messages))
    return [t for step in stream for t in step.tokens]
