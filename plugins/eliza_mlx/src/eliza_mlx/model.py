"""MLX weights: an MLX folder validated and loaded with mlx-lm once per inference context.

Both the session (:mod:`eliza_mlx.mlx_session`) and the draft-model drafter
(:mod:`eliza_mlx.mlx_draft`) import this module, never each other: it owns the loading, the
facts about the model (:class:`~eliza_backends.ModelInfo`, from the folder's Hugging Face files
through :func:`~eliza_backends.tokenizer.tokenizer_facts`), the compute stream and the cache
trim both use.
"""

from __future__ import annotations

import importlib.metadata
from dataclasses import dataclass
from pathlib import Path
from typing import Any, cast

import mlx.core as mx  # type: ignore[import-not-found,unused-ignore]
from mlx_lm.models.cache import trim_prompt_cache  # type: ignore[import-not-found,unused-ignore]
from mlx_lm.utils import load_model  # type: ignore[import-not-found,unused-ignore]

from eliza_backends import BundleError, InferenceContext, ModelInfo
from eliza_backends.hf_tokenizer import HFTokenizer
from eliza_backends.tokenizer import tokenizer_facts

from .mlx_thread import on_mlx_thread
from .probe import MLXFolder, check_mlx_folder

RUNTIME = (f"mlx {importlib.metadata.version('mlx')} / "
           f"mlx-lm {importlib.metadata.version('mlx-lm')}")
#: Compute runs on its own stream per thread, as in mlx-lm's generate_step.
COMPUTE_STREAM = mx.new_thread_local_stream(mx.default_device())


@dataclass
class LoadedMLX:
    """Weights and tokenizer of one MLX folder, shared by the sessions of a context."""

    folder: MLXFolder
    model: Any
    tokenizer: HFTokenizer
    info: ModelInfo


@on_mlx_thread
def load_weights(folder: MLXFolder) -> LoadedMLX:
    """Load an already validated MLX folder with mlx-lm (errors become :class:`BundleError`)."""
    tokenizer = HFTokenizer.from_file(folder.path / "tokenizer.json")
    try:
        model, _config = load_model(folder.path)
    except Exception as exc:
        raise BundleError(f"mlx-lm could not load {folder.path}: {type(exc).__name__}: {exc} "
                          "(unsupported architecture, or weights that do not match config.json)"
                          ) from None
    facts = tokenizer_facts(tokenizer, folder.path, folder.vocab_size)
    info = ModelInfo(vocab_size=folder.vocab_size, eog_token_ids=facts.eog,
                     bos_token_id=facts.bos if facts.add_bos else None,
                     chat_template=facts.chat_template, template_tokens=facts.template_tokens,
                     artifact=folder.path, runtime=RUNTIME,
                     control_tokens=tokenizer.control_texts)
    return LoadedMLX(folder=folder, model=model, tokenizer=tokenizer, info=info)


def shared_weights(context: InferenceContext, path: Path) -> LoadedMLX:
    """Validate the MLX folder ``path`` and load it on ``context`` once (then shared)."""
    folder = check_mlx_folder(path)
    return context.shared(("mlx", str(path)), lambda: load_weights(folder))


def trim(cache: list[Any], n: int) -> int:
    """Trim ``n`` tokens off every layer; how many were trimmed (mlx-lm annotates the return
    value of ``trim_prompt_cache`` as a list, but it is the count)."""
    return int(cast(Any, trim_prompt_cache(cache, n)))


__all__ = ["COMPUTE_STREAM", "RUNTIME", "LoadedMLX", "load_weights", "shared_weights", "trim"]
