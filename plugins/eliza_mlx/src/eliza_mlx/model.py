"""MLX weights: an MLX folder validated and loaded with mlx-lm once per inference context.

Both the session (:mod:`eliza_mlx.session`) and the draft-model drafter
(:mod:`eliza_mlx.draft`) import this module, never each other: it owns the loading, the
facts about the model (:class:`~eliza_backends.ModelInfo`, from the folder's Hugging Face files
through :func:`~eliza_backends.prompt.tokenizer.tokenizer_facts`), the compute stream and the cache
trim both use.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol, cast, runtime_checkable

import mlx.core as mx  # type: ignore[import-not-found,unused-ignore]
import mlx.nn as nn  # type: ignore[import-not-found,unused-ignore]
from mlx_lm.models.cache import (  # type: ignore[import-not-found,unused-ignore]
    KVCache,
    RotatingKVCache,
    make_prompt_cache,
    trim_prompt_cache,
)
from mlx_lm.utils import load_model  # type: ignore[import-not-found,unused-ignore]

from eliza_backends import BundleError, InferenceContext, ModelInfo
from eliza_backends.backend import Drafter, HFTokenizer, distribution_version, tokenizer_facts

from .mlx_thread import on_mlx_thread
from .probe import MLXFolder, check_mlx_folder, multimodal_kinds

RUNTIME = (f"mlx {distribution_version('mlx') or 'unknown'} / "
           f"mlx-lm {distribution_version('mlx-lm') or 'unknown'}")
#: Compute runs on its own stream per thread, as in mlx-lm's generate_step.
COMPUTE_STREAM = mx.new_thread_local_stream(mx.default_device())
#: The mlx-lm model types whose code multiplies the embeddings by ``sqrt(hidden_size)`` rounded
#: to bfloat16 whatever the weights' dtype (``mlx_lm/models/gemma3_text.py``; ``gemma3`` wraps
#: it): a fact of mlx-lm's code, fixed by :func:`scale_embeddings_in_weight_dtype`.
BFLOAT16_EMBEDDING_SCALE = frozenset({"gemma3_text", "gemma3"})


@dataclass
class LoadedMLX:
    """Weights and tokenizer of one MLX folder, shared by the sessions of a context."""

    folder: MLXFolder
    model: Any
    tokenizer: HFTokenizer
    info: ModelInfo


def _load_model(folder: MLXFolder, tokenizer: HFTokenizer) -> Any:
    """mlx-lm's model, or for a multimodal Gemma 4 folder mlx-vlm's (:mod:`.vlm`), wrapped to
    be called the same way."""
    kinds = multimodal_kinds(folder.path)
    if not kinds:
        model, _config = load_model(folder.path)
        return model
    from .vlm import MARKERS, load_vlm

    ids = {text: tokenizer.token_id(text) for kind in kinds for text in MARKERS[kind]}
    missing = [text for text, i in ids.items() if i is None]
    if missing:
        raise BundleError(f"{folder.path}: config.json has media towers but tokenizer.json "
                          f"lacks the tokens {missing}")
    return load_vlm(folder.path, {k: int(v) for k, v in ids.items() if v is not None})


@on_mlx_thread
def load_weights(folder: MLXFolder) -> LoadedMLX:
    """Load an already validated MLX folder with mlx-lm, or mlx-vlm for a multimodal one
    (errors become :class:`BundleError`)."""
    tokenizer = HFTokenizer.from_file(folder.path / "tokenizer.json")
    try:
        model = _load_model(folder, tokenizer)
    except BundleError:
        raise
    except Exception as exc:
        raise BundleError(f"mlx could not load {folder.path}: {type(exc).__name__}: {exc} "
                          "(unsupported architecture, or weights that do not match config.json)"
                          ) from None
    scale_embeddings_in_weight_dtype(model)
    facts = tokenizer_facts(tokenizer, folder.path, folder.vocab_size)
    info = ModelInfo(vocab_size=folder.vocab_size, eog_token_ids=facts.eog,
                     bos_token_id=facts.bos if facts.add_bos else None,
                     chat_template=facts.chat_template, template_tokens=facts.template_tokens,
                     artifact=folder.path, runtime=RUNTIME,
                     control_tokens=tokenizer.control_texts)
    return LoadedMLX(folder=folder, model=model, tokenizer=tokenizer, info=info)


class _RescaledEmbedding(nn.Module):  # type: ignore[misc,name-defined,unused-ignore]
    """An embedding whose lookups are multiplied by ``factor``; ``as_linear`` (the tied output
    head) is the wrapped embedding's, unscaled."""

    def __init__(self, embedding: Any, factor: float) -> None:
        super().__init__()
        self.embedding = embedding
        self.factor = factor

    def __call__(self, ids: Any) -> Any:
        return self.embedding(ids) * self.factor

    def as_linear(self, x: Any) -> Any:
        return self.embedding.as_linear(x)


def scale_embeddings_in_weight_dtype(model: Any) -> bool:
    """Make Gemma 3's embedding scale ``sqrt(hidden_size)`` the one its weights were trained and
    exported with: rounded to the weights' dtype, as Hugging Face's
    ``Gemma3TextScaledWordEmbedding`` does. mlx-lm rounds it to bfloat16 whatever the dtype
    (``mlx_lm/models/gemma3_text.py``: 25.25 instead of 25.2982 for the 270M model), which on a
    float32 bundle moved every logprob by up to 3e-2 against llama.cpp, LiteRT and transformers
    on the same weights (issue 19; with this, MLX and LiteRT agree to 6e-5). Changes nothing for
    bfloat16 weights or other architectures. True when the model was changed."""
    if getattr(model, "model_type", None) not in BFLOAT16_EMBEDDING_SCALE:
        return False
    text = getattr(model, "language_model", model)  # gemma3 wraps a gemma3_text model
    inner = getattr(text, "model", None)
    embedding = getattr(inner, "embed_tokens", None)
    args = getattr(inner, "args", None)
    if inner is None or embedding is None or args is None \
            or isinstance(embedding, _RescaledEmbedding):
        return False
    dtype = embedding(mx.array([0], dtype=mx.uint32)).dtype
    exact = mx.array(args.hidden_size ** 0.5, dtype=mx.float32)
    applied = exact.astype(mx.bfloat16).astype(mx.float32)  # what mlx-lm multiplies by
    wanted = exact.astype(dtype).astype(mx.float32)  # what the weights' dtype gives
    factor = cast(float, wanted.item()) / cast(float, applied.item())
    if factor == 1.0:
        return False
    inner.embed_tokens = _RescaledEmbedding(embedding, factor)
    return True


def shared_weights(context: InferenceContext, path: Path) -> LoadedMLX:
    """Validate the MLX folder ``path`` and load it on ``context`` once (then shared)."""
    folder = check_mlx_folder(path)
    return context.shared(("mlx", str(path)), lambda: load_weights(folder))


def new_prompt_cache(model: Any, speculative: bool) -> list[Any]:
    """mlx-lm's prompt cache for ``model``; ``speculative``: with every sliding-window ring
    buffer (``RotatingKVCache`` without kept tokens) made a full-length ``KVCache``, trimmable
    at any length (a ring buffer is only while it holds less than its window), which verifying
    drafts needs. Exact: mlx-lm's masks cut the window by position on a ``KVCache``; memory
    grows with the context instead of the window."""
    cache = make_prompt_cache(model)
    if not speculative:
        return cache
    return [_full_length(c) for c in cache]


def _full_length(cache: Any) -> Any:
    """A ring buffer without kept tokens (mlx-lm's ``RotatingKVCache``, or mlx-vlm's class of
    that name for a multimodal folder) as its library's full-length ``KVCache``; others as
    they are."""
    if type(cache) is RotatingKVCache and getattr(cache, "keep", 0) == 0:
        return KVCache()  # type: ignore[no-untyped-call,unused-ignore]
    if type(cache).__name__ == "RotatingKVCache" and getattr(cache, "keep", 0) == 0:
        import sys

        full = getattr(sys.modules[type(cache).__module__], "KVCache", None)
        if full is not None:
            return full()
    return cache


@runtime_checkable
class TargetLinkedDrafter(Drafter, Protocol):
    """A drafter that reads the session's own target state (Gemma 4's MTP assistant reads the
    target's hidden states and KV cache): the session runs every forward pass of its model
    through :meth:`target_forward` instead of calling the model."""

    def target_forward(self, ids: Any, cache: list[Any]) -> Any:
        """The model's logits (1, n, vocab), lazy, for ``ids`` (1, n) fed after ``cache``'s
        positions (the cache is updated as by the model's own call). Called on the MLX
        thread, inside the session's compute stream."""
        ...


def trim(cache: list[Any], n: int) -> int:
    """Trim ``n`` tokens off every layer; how many were trimmed (mlx-lm annotates the return
    value of ``trim_prompt_cache`` as a list, but it is the count)."""
    return int(cast(Any, trim_prompt_cache(cache, n)))


__all__ = [
    "BFLOAT16_EMBEDDING_SCALE",
    "COMPUTE_STREAM",
    "RUNTIME",
    "LoadedMLX",
    "TargetLinkedDrafter",
    "load_weights",
    "new_prompt_cache",
    "scale_embeddings_in_weight_dtype",
    "shared_weights",
    "trim",
]
