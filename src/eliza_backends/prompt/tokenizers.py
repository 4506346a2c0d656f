"""A bundle's tokenizer file: where it is (:func:`find_tokenizer`, one search order for every
backend, so the same bundle is tokenized the same way whichever backend serves it) and the file
as a :class:`~eliza_backends.prompt.tokenizer.Tokenizer` (:func:`load_tokenizer`, the class by
the file's name). This module knows the implementations; the base class knows none.
"""

from __future__ import annotations

import contextlib
from pathlib import Path

from ..bundle import DRAFT_DIR
from .hf_tokenizer import HFTokenizer
from .sp_tokenizer import SPTokenizer
from .tokenizer import Tokenizer

#: Tokenizer file names, in the order :func:`find_tokenizer` prefers them at one place.
TOKENIZER_FILES = ("tokenizer.json", "tokenizer.model")


def load_tokenizer(path: Path) -> Tokenizer:
    """``path`` as a tokenizer: a ``*.model`` file is SentencePiece, anything else a Hugging
    Face ``tokenizer.json`` (:class:`~eliza_backends.BundleError` if unreadable)."""
    if path.name.endswith(".model"):
        return SPTokenizer.from_file(path)
    return HFTokenizer.from_file(path)


def find_tokenizer(artifact: Path) -> Path | None:
    """The tokenizer file of an artifact under ``text/`` (or ``text/draft/``), searched in one
    order for every backend: inside the artifact (a folder), ``<stem>.tokenizer.json`` /
    ``<stem>.tokenizer.model`` and ``tokenizer.json`` / ``tokenizer.model`` beside it, then
    the first folder beside it that holds one (a bundle ships one tokenizer for its formats; a
    ``draft/`` folder is never used). At each place ``tokenizer.json`` wins over
    ``tokenizer.model``. None if absent."""
    here = artifact.parent
    places = [(artifact, ""), (here, f"{artifact.stem}."), (here, "")]
    with contextlib.suppress(OSError):
        places += [(p, "") for p in sorted(here.iterdir())
                   if p.is_dir() and p.name != DRAFT_DIR and p != artifact]
    candidates = (folder / f"{prefix}{name}" for folder, prefix in places
                  for name in TOKENIZER_FILES)
    return next((c for c in candidates if c.is_file()), None)


__all__ = ["TOKENIZER_FILES", "find_tokenizer", "load_tokenizer"]
