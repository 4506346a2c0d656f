"""GGUF by llama.cpp's own ``convert_hf_to_gguf.py``: the writer for architectures whose
tensor layout and metadata llama.cpp defines and this package does not re-implement (Gemma 4
and its MTP assistant: per-layer embeddings, shared-KV layers, proportional rope frequencies,
the assistant's pre/post projections).

The script is the one vendored in the installed llama-cpp-python's llama.cpp tree (see
:func:`.toolchain.llama_cpp_converter`), run in a subprocess of this interpreter (it needs torch
and transformers) with that tree's own ``gguf-py``. The model's name in the GGUF
(``general.name``) is llama.cpp's, from the folder's name, as when the script is run by hand.

Also llama.cpp's own reading of a GGUF's vocabulary (:func:`llamacpp_token_facts`: end ids,
BOS), which the converter's facts take over (:func:`confirmed`).
"""

from __future__ import annotations

import hashlib
import os
import subprocess
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from ..errors import BundleError, InvalidArgumentError
from .facts import ModelFacts


def converter_hash(script: Path) -> str:
    """sha256 over the script and the ``conversion/`` and ``gguf-py/gguf/`` sources beside it
    (keys the stages whose GGUF it writes)."""
    h = hashlib.sha256()
    tree = script.parent
    files = [script, *sorted((tree / "conversion").glob("*.py")),
             *sorted((tree / "gguf-py" / "gguf").rglob("*.py"))]
    for f in files:
        h.update(f.relative_to(tree).as_posix().encode() + b"\0")
        h.update(f.read_bytes())
    return h.hexdigest()


def convert_hf_to_gguf(script: Path, hf_dir: Path, out: Path, log_path: Path,
                       outtype: str = "f32", extra_args: Sequence[str] = ()) -> None:
    """Write ``out`` from the Hugging Face folder ``hf_dir`` with llama.cpp's converter at
    ``outtype`` (``extra_args`` after the converter's own, e.g. a family's ``--mmproj``);
    :class:`BundleError` with the log's tail when it fails."""
    env = dict(os.environ)
    env.update(HF_HUB_OFFLINE="1", TRANSFORMERS_OFFLINE="1", PYTHONHASHSEED="0")
    env.pop("NO_LOCAL_GGUF", None)  # the tree's own gguf-py, matching its conversion/
    cmd = [sys.executable, str(script), str(hf_dir), "--outfile", str(out),
           "--outtype", outtype, *extra_args]
    with open(log_path, "ab") as log:
        done = subprocess.run(cmd, stdout=log, stderr=subprocess.STDOUT, env=env, check=False)
    if done.returncode != 0 or not out.is_file():
        tail = log_path.read_text(errors="replace")[-2000:]
        raise BundleError(f"llama.cpp's convert_hf_to_gguf.py failed on {hf_dir} (exit "
                          f"{done.returncode}); log {log_path}:\n{tail}")


def _quiet(level: int, text: bytes, user: object) -> None:
    """llama.cpp log callback that drops everything (the converter prints its own lines)."""


_QUIET: Any = None


def llamacpp_token_facts(gguf_path: Path) -> tuple[tuple[int, ...], bool]:
    """(every end-of-generation id, eos first; whether BOS is added) as llama.cpp sees them."""
    import ctypes

    import llama_cpp as lc

    global _QUIET
    if _QUIET is None:
        _QUIET = lc.llama_log_callback(_quiet)
    lc.llama_log_set(_QUIET, ctypes.c_void_p(0))
    lc.llama_backend_init()
    params = lc.llama_model_default_params()
    params.vocab_only = True
    model = lc.llama_model_load_from_file(str(gguf_path).encode(), params)
    if not model:
        raise InvalidArgumentError(f"llama.cpp cannot read {gguf_path}")
    try:
        vocab = lc.llama_model_get_vocab(model)
        n = lc.llama_vocab_n_tokens(vocab)
        eos = lc.llama_vocab_eos(vocab)
        eog = [t for t in range(n) if lc.llama_vocab_is_eog(vocab, t)]
        ordered = ([eos] if eos in eog else []) + [t for t in eog if t != eos]
        return tuple(ordered), bool(lc.llama_vocab_get_add_bos(vocab))
    finally:
        lc.llama_model_free(model)


def confirmed(facts: ModelFacts, gguf_path: Path) -> ModelFacts:
    """``facts`` with the end-of-generation ids and BOS behaviour llama.cpp reads from
    ``gguf_path`` (it also knows end-of-turn tokens by their text)."""
    import dataclasses

    eog, add_bos = llamacpp_token_facts(gguf_path)
    return dataclasses.replace(facts, tokenizer=dataclasses.replace(
        facts.tokenizer, eog_ids=eog, add_bos=add_bos))


__all__ = ["confirmed", "convert_hf_to_gguf", "converter_hash", "llamacpp_token_facts"]
