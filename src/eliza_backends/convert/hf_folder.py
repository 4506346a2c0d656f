"""Reading a source Hugging Face checkpoint folder, whatever its family: ``config.json``,
the tokenizer files as :class:`~.facts.TokenizerFacts`, the safetensors tensors as float32
numpy arrays (:class:`HFFolder`). What the numbers of ``config.json`` mean is the family's
business (:mod:`.families`); :class:`~.hf_source.HFSource` is this reader with its family.
The vocabulary is read as llama.cpp's own ``convert_hf_to_gguf.py`` reads it:

* byte-level BPE (GGUF ``gpt2``): ``tokenizer.json``'s vocabulary, merges and added tokens
  (special ones CONTROL, others USER_DEFINED), and the GGUF pre-tokenizer name of its
  pre-tokenizer (``gpt-2``: ByteLevel alone; ``smollm``: single digits, then ByteLevel);
* SentencePiece (GGUF ``llama``, Gemma): ``tokenizer.model``'s pieces, scores and types, then
  ``tokenizer_config.json``'s ``added_tokens_decoder`` (special -> CONTROL, others
  USER_DEFINED with U+2581 written as a space).

Ids the vocabulary leaves free up to ``vocab_size`` become ``[PAD<i>]`` UNUSED tokens. Nothing
here needs torch or transformers: safetensors files are read directly (float32, float16 and
bfloat16 become float32 exactly).
"""

from __future__ import annotations

import hashlib
import json
import struct
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from ..errors import BundleError
from ..hashing import sha256_file
from .facts import TokenizerFacts

NORMAL, UNKNOWN, CONTROL, USER_DEFINED, UNUSED, BYTE = 1, 2, 3, 4, 5, 6
#: files of the folder that key the conversion (weights, config, tokenizer)
_KEYED = ("config.json", "generation_config.json", "tokenizer.json", "tokenizer_config.json",
          "tokenizer.model", "chat_template.jinja", "special_tokens_map.json")
_DTYPES = {"F32": "<f4", "F16": "<f2", "BF16": "<u2"}


def _json(path: Path) -> dict[str, Any]:
    if not path.is_file():
        return {}
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError, UnicodeDecodeError) as exc:
        raise BundleError(f"{path} is not readable JSON: {exc}") from None
    if not isinstance(data, dict):
        raise BundleError(f"{path} is not a JSON object")
    return data


def _ids(value: Any) -> list[int]:
    if isinstance(value, bool) or value is None:
        return []
    if isinstance(value, int):
        return [value]
    if isinstance(value, list):
        return [v for v in value if isinstance(v, int) and not isinstance(v, bool)]
    return []


def _content(value: Any) -> str | None:
    if isinstance(value, str):
        return value
    if isinstance(value, dict) and isinstance(value.get("content"), str):
        return str(value["content"])
    return None


class HFFolder:
    """A Hugging Face checkpoint folder (``config.json``, ``*.safetensors``, tokenizer files),
    read as it is: no family is looked up here."""

    def __init__(self, folder: str | Path) -> None:
        self.path = Path(folder)
        self.config = _json(self.path / "config.json")
        if not self.config:
            raise BundleError(f"{self.path} has no config.json: not a Hugging Face checkpoint")
        self._identify()
        self.weight_files = self._weight_files()

    def _identify(self) -> None:
        """What a subclass checks in ``config.json`` before the weights are looked for
        (nothing here)."""

    def _weight_files(self) -> list[Path]:
        index = self.path / "model.safetensors.index.json"
        if index.is_file():
            names = sorted(set(_json(index).get("weight_map", {}).values()))
            files = [self.path / n for n in names]
        else:
            files = sorted(self.path.glob("*.safetensors"))
        if not files or not all(f.is_file() for f in files):
            raise BundleError(f"{self.path} has no safetensors weights (model.safetensors or "
                              "the files model.safetensors.index.json names); .bin / .pth "
                              "checkpoints are not read: save it with safetensors")
        return files

    def content_sha256(self) -> str:
        """sha256 over the names and sha256s of the weight, config and tokenizer files: the
        folder's identity for the conversion cache."""
        return folder_sha256(self.path, self.weight_files)

    def size(self) -> int:
        """Bytes of the weight files."""
        return sum(f.stat().st_size for f in self.weight_files)

    # ------------------------------------------------------------------ facts

    def model_name(self) -> str:
        """``_name_or_path``'s last part, else the folder's name."""
        return str(self.config.get("_name_or_path") or self.path.name).rstrip("/") \
            .split("/")[-1]

    def tokenizer_facts(self, *, sentencepiece_space_prefix: bool = True) -> TokenizerFacts:
        """The vocabulary as GGUF stores it (see the module docstring).
        ``sentencepiece_space_prefix``: whether a SentencePiece vocabulary's own
        ``add_dummy_prefix`` is kept (a family that never adds the space says False)."""
        tok_json = _json(self.path / "tokenizer.json")
        tok_config = _json(self.path / "tokenizer_config.json")
        if (self.path / "tokenizer.model").is_file():
            model, pre, tokens, types, scores, merges, space = self._sentencepiece(
                tok_config, sentencepiece_space_prefix)
        elif tok_json:
            model, pre, scores, space = "gpt2", _gguf_pre(self.path, tok_json), None, False
            tokens, types, merges = _byte_level_vocab(self.path, tok_json)
        else:
            raise BundleError(f"{self.path} has neither tokenizer.json nor tokenizer.model")
        n = int(self.config.get("vocab_size") or len(tokens))
        if len(tokens) > n:
            raise BundleError(f"{self.path}: the tokenizer has {len(tokens)} tokens but the "
                              f"model's vocab_size is {n}")
        for i in range(len(tokens), n):  # ids the vocabulary leaves free
            tokens.append(f"[PAD{i}]")
            types.append(UNUSED)
            if scores is not None:
                scores.append(-10000.0)
        by_text = {t: i for i, t in enumerate(tokens)}
        for t in tok_json.get("added_tokens", []):
            by_text.setdefault(str(t.get("content")), int(t.get("id", -1)))

        def token(key: str) -> int | None:
            ids = _ids(self.config.get(f"{key}_token_id"))
            if ids:
                return ids[0]
            text = _content(tok_config.get(f"{key}_token"))
            return by_text.get(text) if text is not None else None

        gen = _json(self.path / "generation_config.json")
        eos = token("eos")
        eog = [*([eos] if eos is not None else []), *_ids(self.config.get("eos_token_id")),
               *_ids(gen.get("eos_token_id"))]
        add_bos = tok_config.get("add_bos_token")
        if not isinstance(add_bos, bool):
            add_bos = _post_processor_adds_bos(tok_json) if tok_json else model == "llama"
        template_file = self.path / "chat_template.jinja"
        template = template_file.read_text(encoding="utf-8") if template_file.is_file() else \
            tok_config.get("chat_template") if isinstance(tok_config.get("chat_template"),
                                                         str) else None
        return TokenizerFacts(
            model=model, pre=pre, tokens=tokens, token_types=types, scores=scores,
            merges=merges, bos_id=token("bos"), eos_id=eos, unk_id=token("unk"),
            pad_id=token("pad"), add_bos=bool(add_bos), add_space_prefix=space,
            eog_ids=tuple(dict.fromkeys(i for i in eog if 0 <= i < n)), chat_template=template)

    def _sentencepiece(self, tok_config: dict[str, Any], keep_space_prefix: bool) -> tuple[
            str, str, list[str], list[int], list[float] | None, list[str] | None, bool]:
        from sentencepiece import sentencepiece_model_pb2 as pb

        m = pb.ModelProto()
        try:
            m.ParseFromString((self.path / "tokenizer.model").read_bytes())
        except Exception as exc:
            raise BundleError(f"{self.path}/tokenizer.model is not a SentencePiece model: "
                              f"{exc}") from None
        if m.trainer_spec.model_type != pb.TrainerSpec.BPE:
            raise BundleError(f"{self.path}/tokenizer.model is a SentencePiece "
                              f"{pb.TrainerSpec.ModelType.Name(m.trainer_spec.model_type)} "
                              "model; only BPE (the Gemma / llama kind) is converted")
        tokens, types, scores = [], [], []
        for p in m.pieces:
            kind = int(p.type) if int(p.type) in (NORMAL, UNKNOWN, CONTROL, USER_DEFINED,
                                                  UNUSED, BYTE) else NORMAL
            # llama.cpp matches user-defined pieces in the raw text, with real spaces
            tokens.append(p.piece.replace("\u2581", " ") if kind == USER_DEFINED else p.piece)
            types.append(kind)
            scores.append(float(p.score))
        for key, data in (tok_config.get("added_tokens_decoder") or {}).items():
            i, text = int(key), str(data.get("content", ""))
            if not 0 <= i < len(tokens):
                continue
            if data.get("special"):
                tokens[i], types[i] = text, CONTROL
            else:
                tokens[i], types[i] = text.replace("\u2581", " "), USER_DEFINED
        space = bool(m.normalizer_spec.add_dummy_prefix) and keep_space_prefix
        return "llama", "default", tokens, types, scores, None, space

    # ------------------------------------------------------------------ tensors

    def _headers(self) -> Iterator[tuple[Path, int, dict[str, Any]]]:
        for f in self.weight_files:
            with open(f, "rb") as fh:
                raw = fh.read(8)
                if len(raw) != 8:
                    raise BundleError(f"{f} is not a safetensors file")
                (n,) = struct.unpack("<Q", raw)
                if n > 100 << 20:
                    raise BundleError(f"{f}: a {n}-byte safetensors header is not plausible")
                try:
                    header = json.loads(fh.read(n))
                except ValueError:
                    raise BundleError(f"{f} has an unreadable safetensors header") from None
            header.pop("__metadata__", None)
            yield f, 8 + n, header

    def tensor_names(self) -> set[str]:
        """Every tensor name in the weight files."""
        return {name for _f, _o, header in self._headers() for name in header}

    def tensors(self) -> Iterator[tuple[str, Any]]:
        """(Hugging Face name, float32 array) for every tensor, one at a time."""
        import numpy as np

        for f, base, header in self._headers():
            data = np.memmap(f, dtype=np.uint8, mode="r")
            for name, spec in sorted(header.items(), key=lambda kv: kv[1]["data_offsets"][0]):
                dtype = _DTYPES.get(spec["dtype"])
                if dtype is None:
                    raise BundleError(f"{f}: tensor {name} is {spec['dtype']}; the converter "
                                      "reads F32, F16 and BF16 checkpoints")
                lo, hi = spec["data_offsets"]
                raw = np.frombuffer(data[base + lo:base + hi], dtype=dtype)
                if spec["dtype"] == "BF16":  # the top half of a float32
                    array = (raw.astype(np.uint32) << 16).view(np.float32)
                else:
                    array = raw.astype(np.float32)
                yield name, array.reshape(spec["shape"])


def folder_sha256(folder: Path, weight_files: list[Path] | None = None) -> str:
    """sha256 over the names and sha256s of a checkpoint folder's config, tokenizer and weight
    files (``weight_files``, default every ``*.safetensors``)."""
    h = hashlib.sha256()
    keyed = [folder / n for n in _KEYED if (folder / n).is_file()]
    weights = sorted(folder.glob("*.safetensors")) if weight_files is None else weight_files
    for f in sorted(set(keyed + list(weights))):
        h.update(f"{f.name}\0{sha256_file(f)}\n".encode())
    return h.hexdigest()


def _byte_level_vocab(path: Path, tok_json: dict[str, Any]) -> tuple[
        list[str], list[int], list[str]]:
    model = tok_json.get("model") or {}
    if model.get("type") != "BPE" or model.get("byte_fallback"):
        raise BundleError(f"{path}/tokenizer.json is not a byte-level BPE tokenizer and there "
                          "is no tokenizer.model (SentencePiece vocabularies need it)")
    vocab: dict[str, int] = model.get("vocab") or {}
    added = {int(t["id"]): t for t in tok_json.get("added_tokens", [])}
    n = max([*vocab.values(), *added, -1]) + 1
    tokens: list[str | None] = [None] * n
    for text, i in vocab.items():
        tokens[i] = text
    types = [NORMAL] * n
    for i, t in added.items():
        tokens[i] = str(t["content"])
        types[i] = CONTROL if t.get("special") else USER_DEFINED
    for i, t in enumerate(tokens):
        if t is None:
            tokens[i] = f"[PAD{i}]"
            types[i] = UNUSED
    merges = [m if isinstance(m, str) else " ".join(m) for m in model.get("merges") or []]
    return [str(t) for t in tokens], types, merges


def _is_byte_level(p: Any) -> bool:
    return isinstance(p, dict) and p.get("type") == "ByteLevel" and p.get("use_regex", True) \
        and not p.get("add_prefix_space", False)


def _gguf_pre(path: Path, tok_json: dict[str, Any]) -> str:
    """The llama.cpp pre-tokenizer name that splits text as ``tok_json``'s pre-tokenizer does."""
    pre = tok_json.get("pre_tokenizer")
    if tok_json.get("normalizer") is None:
        if _is_byte_level(pre):
            return "gpt-2"
        if isinstance(pre, dict) and pre.get("type") == "Sequence":
            parts = pre.get("pretokenizers") or []
            if len(parts) == 2 and parts[0].get("type") == "Digits" and \
                    parts[0].get("individual_digits") and _is_byte_level(parts[1]):
                return "smollm"
    raise BundleError(f"{path}/tokenizer.json: its normalizer / pre-tokenizer "
                      f"({json.dumps(pre)[:200]}) has no llama.cpp equivalent the converter "
                      "knows (gpt-2: ByteLevel; smollm: single Digits, then ByteLevel)")


def _post_processor_adds_bos(tok_json: dict[str, Any]) -> bool:
    post = tok_json.get("post_processor") or {}
    procs = post.get("processors", [post]) if post.get("type") == "Sequence" else [post]
    for p in procs:
        if p.get("type") == "TemplateProcessing":
            single = p.get("single") or []
            return bool(single) and "SpecialToken" in single[0]
    return False


__all__ = ["HFFolder", "folder_sha256"]
