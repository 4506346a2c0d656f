"""Gemma 4's multi-token-prediction assistant as the MLX drafter (``drafter="mtp"``).

The assistant (an MLX folder under ``text/draft/mtp/``, loaded by mlx-vlm 0.7.10's
``load_drafter`` as its ``Gemma4AssistantDraftModel``) is a few query-only layers whose
attention reads the *target's* KV cache and whose input is a token's embedding joined with the
target's last hidden state. Here it is only the draft forward pass: the core's one speculative
loop (:func:`~eliza_backends.runtime.speculative.speculate`) drives it through the session's
verify step, as it drives llama.cpp's :class:`~eliza_llamacpp.mtp.MtpDrafter`; mlx-vlm's own
round loop is not used.

The target stays mlx-lm's model (the session's, loaded once per context): mlx-lm's
``gemma4_text`` returns no hidden states, so the session runs every forward pass over its prompt
cache through :meth:`MLXMtpDrafter.target_forward`, which runs the text model for the final
(normed) hidden states, stages them, and applies mlx-lm's output head (tied embedding or
``lm_head``, then the logit soft-cap) for the session. The session keeps full-length caches
(:func:`~eliza_mlx.model.new_prompt_cache`), so the KV of every position is readable.

A round, as Hugging Face's ``SinglePositionMultiTokenCandidateGenerator`` and llama.cpp run it:
the history's last token ``t`` sits at position ``p`` (not in the target's cache, or fed ahead
of it); the assistant reads the target's KV for positions ``0..p-1`` (each layer type's last
KV layer), takes ``t``'s embedding with the target's hidden row for ``p - 1``, queries at
position ``p`` and drafts the argmax; each further draft feeds the previous one, at ``p`` again,
with the assistant's own output hidden state (mlx-vlm's ``draft_block``). mlx-vlm's own loop
queries at ``p - 1``: 0.66 acceptance on the tiny pair's oracle prompts at k=3 against 0.69 at
``p``, which is llama.cpp's 0.68.

A hidden row staged for position ``i`` is the one the forward pass that last wrote cache
position ``i`` computed (a pass from position ``s`` drops every row from ``s`` on), so it
always matches the cache. A proposal whose row is missing (after a slot restore, a reset or a
rewind past the staged passes) drafts nothing; the plain round that follows stages it.
All mlx calls run on the MLX thread (:mod:`eliza_mlx.mlx_thread`).
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any, cast

import mlx.core as mx  # type: ignore[import-not-found,unused-ignore]

from eliza_backends import BundleError, InferenceContext, UnsupportedOperationError

from .mlx_thread import on_mlx_thread
from .model import COMPUTE_STREAM, LoadedMLX
from .probe import check_mlx_folder, check_mtp_assistant

#: How many forward passes' hidden states are kept (a proposal reads the last or the one before
#: it: a round that drafted nothing feeds its token ahead in a second pass).
_KEPT_PASSES = 4


def _greedy(logits: Any) -> Any:
    return mx.argmax(logits, axis=-1)


@on_mlx_thread
def _load(path: Path) -> Any:
    try:
        from mlx_vlm.speculative.drafters import (  # type: ignore[import-not-found,import-untyped,unused-ignore]
            load_drafter,
        )
    except ImportError as exc:
        raise UnsupportedOperationError(
            f"drafter='mtp' on MLX runs the assistant through mlx-vlm, which is not installed "
            f"({exc}): pip install 'mlx-vlm==0.7.10' (the mlx extra has it)") from None
    try:
        model, kind = load_drafter(str(path), kind="mtp")
    except Exception as exc:
        raise BundleError(f"mlx-vlm could not load the MTP assistant {path}: "
                          f"{type(exc).__name__}: {exc}") from None
    if kind != "mtp":
        raise BundleError(f"mlx-vlm loads {path.name} as a {kind!r} drafter, not an MTP one")
    return model


def shared_assistant(context: InferenceContext, path: Path, target: LoadedMLX) -> Any:
    """The MTP assistant at ``path`` for ``target`` (checked first, :class:`BundleError` when
    it is not the target's), loaded once per context and shared by its sessions (each call
    sets its own shared KV: the calls never overlap, all run on the MLX thread)."""
    check_mtp_assistant(check_mlx_folder(path), target.folder)
    return context.shared(("mlx-mtp", str(path)), lambda: _load(path))


class MLXMtpDrafter:
    """Greedy drafts from Gemma 4's assistant over the session's target model and prompt
    cache. Owned by the session (which runs its forward passes through
    :meth:`target_forward`); used on its consumer thread, every mlx call on the MLX thread."""

    @on_mlx_thread
    def __init__(self, assistant: Any, target: LoadedMLX) -> None:
        self._assistant = assistant.bind(target.model)
        model = getattr(target.model, "language_model", target.model)
        self._text = model.model  # mlx-lm's Gemma4TextModel: its final normed hidden states
        self._tied = bool(getattr(model, "tie_word_embeddings", True))
        self._lm_head: Any = getattr(model, "lm_head", None)
        self._softcap: float | None = getattr(model, "final_logit_softcapping", None)
        self._layer_types = [layer.layer_type for layer in self._text.layers]
        self._cache: list[Any] | None = None  # the cache the staged rows belong to
        self._passes: list[tuple[int, Any]] = []  # (first position, hidden (1, n, H)), oldest first

    # ------------------------------------------------------------------ the session's side

    def target_forward(self, ids: Any, cache: list[Any]) -> Any:
        """The target's logits (1, n, vocab), lazy, for ``ids`` (1, n) fed after ``cache``'s
        positions, as mlx-lm's model would give them; the pass's hidden states are staged.
        Called on the MLX thread, inside the session's compute stream."""
        start = int(cache[0].offset)
        if cache is not self._cache:
            self._cache, self._passes = cache, []
        else:
            self._passes = [(s, h) for s, h in self._passes if s < start][-_KEPT_PASSES + 1:]
        hidden = self._text(ids, cache=cache)
        self._passes.append((start, hidden))
        out = self._text.embed_tokens.as_linear(hidden) if self._tied else self._lm_head(hidden)
        if self._softcap is not None:
            out = mx.tanh(out / self._softcap) * self._softcap
        return out

    def _row(self, pos: int) -> Any:
        """The staged hidden row (1, 1, H) for position ``pos``; None when none is staged."""
        for start, hidden in reversed(self._passes):
            if start <= pos < start + hidden.shape[1]:
                return hidden[:, pos - start:pos - start + 1, :]
        return None

    # ------------------------------------------------------------------ Drafter

    @on_mlx_thread
    def propose(self, history: Sequence[int], k: int) -> list[int]:
        """Up to ``k`` greedy drafts after ``history``; [] when the target's hidden row before
        its last token is not staged."""
        p = len(history) - 1  # the position of the last token
        cache = self._cache
        if k <= 0 or p < 1 or cache is None or int(cache[0].offset) < p:
            return []
        row = self._row(p - 1)
        if row is None:
            return []
        shared = {kind: (c.keys[..., :p, :], c.values[..., :p, :])
                  for kind, c in zip(self._layer_types, cache, strict=False)}
        assistant = self._assistant
        with mx.stream(COMPUTE_STREAM):
            assistant.set_shared_kv(shared, p, position=p, kv_valid_len=p)
            drafts = assistant.draft_block(history[-1], row, None, k + 1, _greedy, mx.int32,
                                           greedy=True)
            return cast(list[int], drafts[0].tolist())

    @on_mlx_thread
    def truncate(self, n: int) -> None:
        """The sequence was cut to ``n`` tokens: forget the passes from position ``n`` on
        (rows before ``n`` stay valid: the cache still holds what made them)."""
        self._passes = [(s, h) for s, h in self._passes if s < n]

    @on_mlx_thread
    def close(self) -> None:
        """Drop the staged states (the assistant's weights belong to the InferenceContext)."""
        self._cache, self._passes = None, []


__all__ = ["MLXMtpDrafter", "shared_assistant"]
