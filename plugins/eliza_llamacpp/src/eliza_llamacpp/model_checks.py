"""What :func:`eliza_llamacpp.model.load_model` checks on a freshly loaded model, and the
vocabulary facts it reads, all in O(metadata keys) native calls (never one per vocabulary
entry: Gemma 3 has 262,144).

These run on the contained load thread (:mod:`eliza_llamacpp.native_guard`), so anything here
that makes llama.cpp abort or throw is a :class:`~eliza_backends.BundleError`, not a crash:

* :func:`check_vocabulary` refuses a model without a usable vocabulary (``no_vocab``: every
  later token call would fail a ``GGML_ASSERT``) and tokenizes a probe that makes a
  SentencePiece vocabulary use its byte fallback for all 256 byte values: a vocabulary that
  lacks byte tokens (``tokenizer.ggml.model = llama`` on a BPE vocabulary, or one damaged
  ``<0xE3>``) would otherwise throw out of ``llama_tokenize`` on some user's text, on the
  user's thread, and take the process with it.
* :func:`check_compute_values` refuses metadata values that pass the loader but fail an
  assertion inside ggml's compute threads at the first decode, where nothing can contain it
  (a NaN or negative norm epsilon, an odd rotary dimension count).
* :func:`eog_token_ids` finds the end-of-generation tokens from llama.cpp's own rules (the
  special ids it exposes plus the token texts its loader marks as end of generation), each
  confirmed with ``llama_vocab_is_eog``.
"""

from __future__ import annotations

import ctypes
import math
from pathlib import Path
from typing import Any

from eliza_backends import BundleError

from . import native_guard
from .bindings import lc

#: Token texts llama.cpp 0.3.36's vocabulary loader may put in its end-of-generation set
#: (llama-vocab.cpp: the EOG list, and the EOT / EOM / FIM pad, repo, sep auto-detection).
EOG_TEXTS = (
    "<|eot_id|>", "<|im_end|>", "<|end|>", "<|return|>", "<|call|>", "<|flush|>", "<|calls|>",
    "<end_of_turn>", "<|endoftext|>", "</s>", "<|eom_id|>", "<EOT>", "_<EOT>", "[EOT]", "[EOS]",
    "<|end_of_text|>", "<end_of_utterance>", "<eos>", "<turn|>", "<|tool_response>",
    "<\uff5cend\u2581of\u2581sentence\uff5c>", "[e~[",  # DeepSeek's fullwidth bars
    "<|fim_pad|>", "<fim-pad>", "<fim_pad>", "<PAD>", "[PAD]",
    "<|fim_repo|>", "<|repo_name|>", "<fim-repo>", "<REPO>", "<reponame>", "<|file_sep|>",
)
#: Special-id metadata keys without a C accessor that llama.cpp adds to the EOG set.
_EOG_ID_KEYS = ("tokenizer.ggml.eom_token_id",)

# Each group is a 4-byte "character" (lead byte 0xF4) that no vocabulary holds, so a
# SentencePiece tokenizer falls back to byte tokens for each of its bytes; together the groups
# cover all 256 byte values.
_BYTE_PROBE = b"".join(b"\xf4" + bytes(range(i, min(i + 3, 256))).ljust(3, b"\xf4")
                       for i in range(0, 256, 3))


def metadata(model: Any) -> dict[str, str]:
    """The model's scalar metadata as llama.cpp formats it (arrays are not included)."""
    out: dict[str, str] = {}
    buf = ctypes.create_string_buffer(256)
    for i in range(lc.llama_model_meta_count(model)):
        if lc.llama_model_meta_key_by_index(model, i, buf, len(buf)) < 0:
            continue
        key = buf.value.decode("utf-8", "replace")
        n = lc.llama_model_meta_val_str_by_index(model, i, buf, len(buf))
        if n >= len(buf):  # a long string value (e.g. the chat template): not needed here
            continue
        out[key] = buf.value.decode("utf-8", "replace") if n >= 0 else ""
    return out


def check_compute_values(meta: dict[str, str], path: Path) -> None:
    """Refuse values that would fail an assertion in ggml's compute threads (uncontainable)."""
    for key, value in meta.items():
        if key.endswith("epsilon"):
            # llama.cpp prints floats with "%f": a tiny negative is "-0.000000", NaN "nan"
            try:
                eps = float(value)
            except ValueError:
                eps = math.nan
            if value.lstrip().startswith("-") or not math.isfinite(eps):
                raise _bad(path, f"{key} is {value} (a norm epsilon must be a finite number "
                           ">= 0; llama.cpp would abort at the first decode)")
        elif key.endswith(".rope.dimension_count"):
            try:
                n_rot = int(value)
            except ValueError:
                n_rot = -1
            if n_rot < 0 or n_rot % 2:
                raise _bad(path, f"{key} is {value} (rotary dimensions come in pairs; "
                           "llama.cpp would abort at the first decode)")


def check_vocabulary(vocab: Any, path: Path) -> None:
    """Refuse a vocabulary llama.cpp cannot tokenize arbitrary text with (see module doc)."""
    if lc.llama_vocab_n_tokens(vocab) <= 0 or lc.llama_vocab_type(vocab) == \
            lc.LLAMA_VOCAB_TYPE_NONE:
        raise _bad(path, "it has no vocabulary (tokenizer.ggml.model is no_vocab or none); "
                   "this backend needs the model's tokenizer in the GGUF")
    if lc.llama_vocab_type(vocab) == lc.LLAMA_VOCAB_TYPE_SPM:
        native_guard.stage("tokenizing a probe that needs byte-fallback tokens (<0x00>..<0xFF>): "
                           "the vocabulary lacks some, or does not match tokenizer.ggml.model")
        tokenize(vocab, _BYTE_PROBE, special=False)
        native_guard.stage("reading the vocabulary")


def tokenize(vocab: Any, data: bytes, *, special: bool) -> list[int]:
    """``llama_tokenize`` of UTF-8 ``data`` (no BOS), parsing special tokens if ``special``."""
    cap = len(data) + 8
    buf = (lc.llama_token * cap)()
    n = lc.llama_tokenize(vocab, data, len(data), buf, cap, False, special)
    if n < 0:
        cap = -n
        buf = (lc.llama_token * cap)()
        n = lc.llama_tokenize(vocab, data, len(data), buf, cap, False, special)
    return list(buf[:n]) if n >= 0 else []


def eog_token_ids(model: Any, vocab: Any, meta: dict[str, str]) -> frozenset[int]:
    """Every token llama.cpp treats as end of generation, from a few dozen native calls."""
    n_vocab = lc.llama_vocab_n_tokens(vocab)
    candidates = {lc.llama_vocab_eos(vocab), lc.llama_vocab_eot(vocab),
                  lc.llama_vocab_fim_pad(vocab), lc.llama_vocab_fim_rep(vocab),
                  lc.llama_vocab_fim_sep(vocab)}
    for key in _EOG_ID_KEYS:
        if meta.get(key, "").isdigit():
            candidates.add(int(meta[key]))
    for text in EOG_TEXTS:
        ids = tokenize(vocab, text.encode("utf-8"), special=True)
        if len(ids) == 1:
            candidates.add(ids[0])
    return frozenset(t for t in candidates
                     if 0 <= t < n_vocab and lc.llama_vocab_is_eog(vocab, t))


def new_context(model: Any, params: Any, path: Path) -> Any:
    """``llama_init_from_model`` on a contained thread (building the worst-case graph there
    asserts on the model's shapes); NULL when llama.cpp refused without aborting."""
    try:
        return native_guard.contained(lambda: lc.llama_init_from_model(model, params),
                                      name="context", release=_free_context)
    except native_guard.NativeAbort as exc:
        raise _bad(path, f"llama.cpp aborted while creating a context ({exc}); the model's "
                   "shapes are inconsistent") from None


def _free_context(ctx: Any) -> None:
    if ctx:
        lc.llama_free(ctx)


def _bad(path: Path, what: str) -> BundleError:
    return BundleError(f"{path} cannot be served by llama.cpp: {what}")


__all__ = ["EOG_TEXTS", "check_compute_values", "check_vocabulary", "eog_token_ids",
           "metadata", "new_context", "tokenize"]
