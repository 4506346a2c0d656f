"""A smaller MLX folder from the bundle's ``text/draft/`` as a speculative drafter.

The draft model shares the target's vocabulary and runs on the same :class:`InferenceContext`
(its weights are loaded once, like the target's), with its own mlx-lm prompt cache kept in step
with the target sequence: before each proposal it trims what diverged (rejected drafts, a
rewind), feeds what is new, then drafts ``k`` tokens greedily. The ``k`` draft forward passes
are one lazy mlx graph, evaluated once per proposal.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any, cast

import mlx.core as mx  # type: ignore[import-not-found,unused-ignore]
from mlx_lm.models.cache import (  # type: ignore[import-not-found,unused-ignore]
    can_trim_prompt_cache,
    make_prompt_cache,
)

from eliza_backends import BundleError, InferenceContext, StreamConfig, UnsupportedOperationError
from eliza_backends.bundle import find_artifacts

from .mlx_session import _STREAM, LoadedMLX, _trim, load_weights
from .probe import check_mlx_folder


def resolve_draft(bundle_dir: Path, config: StreamConfig) -> Path:
    """The draft MLX folder: ``config.draft_model`` (bundle-relative) or the first MLX folder
    under ``text/draft/``."""
    if config.draft_model is None:
        found = find_artifacts(bundle_dir, ("mlx",), role="draft")
        if not found:
            raise BundleError(f"{bundle_dir} has no MLX weights folder under text/draft/ for "
                              "drafter='model' (ship a smaller MLX folder with the same "
                              "vocabulary there, or set draft_model)")
        return found[0]
    path = (bundle_dir / config.draft_model).resolve()
    if not path.is_relative_to(bundle_dir.resolve()) or not (path / "config.json").is_file():
        raise BundleError(f"draft_model {config.draft_model!r} is not an MLX weights folder "
                          f"inside the bundle {bundle_dir}")
    return path


class MLXDraftModel:
    """Greedy drafts from a small MLX model sharing the target's vocabulary."""

    def __init__(self, loaded: LoadedMLX, target_vocab: int, batch_size: int) -> None:
        if loaded.vocab_size != target_vocab:
            raise BundleError(f"draft model {loaded.folder.path.name} has {loaded.vocab_size} "
                              f"tokens, the target {target_vocab}: a draft model must share the "
                              "target's vocabulary")
        self._model = loaded.model
        self._step = batch_size
        self._cache: list[Any] = make_prompt_cache(self._model)
        if not can_trim_prompt_cache(self._cache):
            raise UnsupportedOperationError(
                f"draft model {loaded.folder.path.name}: its prompt cache cannot be trimmed, "
                "which a draft model needs")
        self._tokens: list[int] = []  # what the draft prompt cache holds
        self._synced = 0  # leading tokens known to equal the target sequence

    def _forget(self) -> None:
        self._cache = make_prompt_cache(self._model)
        self._tokens = []
        self._synced = 0

    def propose(self, history: Sequence[int], k: int) -> list[int]:
        """Sync with ``history`` and draft ``k`` tokens greedily."""
        if k <= 0 or not history:
            return []
        n = min(len(self._tokens), len(history))
        p = min(self._synced, n)
        while p < n and self._tokens[p] == history[p]:
            p += 1
        if p == len(history):  # everything is cached: re-feed the last token for its logits
            p -= 1
        self.truncate(p)
        p = min(p, len(self._tokens))  # 0 when the cache could not be trimmed
        feed = list(history[p:])
        body, last = feed[:-1], feed[-1:]
        model, cache = self._model, self._cache
        try:
            with mx.stream(_STREAM):
                for off in range(0, len(body), self._step):
                    chunk = body[off:off + self._step]
                    model(mx.array(chunk, dtype=mx.uint32)[None], cache=cache)
                    mx.eval([c.state for c in cache])
                    self._tokens.extend(chunk)
                y = mx.argmax(model(mx.array(last, dtype=mx.uint32)[None], cache=cache)[:, -1, :],
                              axis=-1)
                ys = [y]
                for _ in range(k - 1):  # lazily chained: one evaluation for the k drafts
                    y = mx.argmax(model(y[None], cache=cache)[:, -1, :], axis=-1)
                    ys.append(y)
                drafts = cast(list[int], mx.concatenate(ys).tolist())
        except BaseException:
            self._forget()  # the cache may hold part of a feed: start over next time
            raise
        self._tokens.extend(last)
        self._tokens.extend(drafts[:-1])  # fed while drafting (the last draft is not)
        self._synced = len(history)
        return drafts

    def truncate(self, n: int) -> None:
        """Forget prompt-cache positions from ``n`` on."""
        if n < len(self._tokens):
            drop = len(self._tokens) - n
            if _trim(self._cache, drop) != drop:
                self._forget()
                return
            del self._tokens[n:]
        self._synced = min(self._synced, n)

    def close(self) -> None:
        """Drop the draft prompt cache (the weights belong to the InferenceContext)."""
        self._cache = []
        self._tokens = []
        self._synced = 0


def open_draft(context: InferenceContext, config: StreamConfig, path: Path,
               target_vocab: int) -> MLXDraftModel:
    """Validate the draft folder, load (or reuse) its weights on ``context``, wrap them."""
    folder = check_mlx_folder(path)
    loaded = context.shared(("mlx", str(path)), lambda: load_weights(folder))
    return MLXDraftModel(loaded, target_vocab, config.batch_size)


__all__ = ["MLXDraftModel", "open_draft", "resolve_draft"]
